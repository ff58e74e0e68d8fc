"""What the real vLLM ``Spark2_5ForCausalLM`` does with pushes once loaded, without an
engine: direct pushes (loaded where vLLM computes with the parameters, refused where
it computes with copies), a tensor pushed twice in one update, the rest of a refused
update, and a "tensor" that arrived as a plain list. End to end:
``test_weight_updates.py``."""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from spark2_5_dev.checkpoints import build_spark2_5_checkpoint
from spark2_5_dev.model_building import build_model, checkpoint_tensors, vllm_model_env
from spark2_5_dev.weight_updates import cpu_paths, kernel_path
from vllm_spark2_5_plugin import host_hooks
from vllm_spark2_5_plugin.spark2_5_checkpoint import Spark2_5CheckpointError
from vllm_spark2_5_plugin.spark2_5_updates import RefusedUpdate

__all__ = ["vllm_model_env"]  # the fixture, for pytest

pytestmark = pytest.mark.usefixtures("vllm_model_env")

NAME = "model.layers.1.mlp.down_proj.weight"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory):
    return build_spark2_5_checkpoint(tmp_path_factory.mktemp("intake"), seed=4)


@pytest.fixture(scope="module")
def other_checkpoint(tmp_path_factory: pytest.TempPathFactory):
    return build_spark2_5_checkpoint(tmp_path_factory.mktemp("intake-other"), seed=5)


@pytest.fixture
def vllm_reads_the_parameters(monkeypatch: pytest.MonkeyPatch) -> None:
    """A stand-in for a platform whose kernels read the parameters (a GPU): the
    carrier's platform decision says so, and vLLM's CPU linears take vLLM's own
    unpacked path (``torch.nn.functional.linear`` over the layer's weight), the one
    it takes where its CPU library has neither oneDNN nor its SGL kernel."""
    from vllm import _custom_ops
    from vllm.model_executor.layers import utils

    from vllm_spark2_5_plugin import cpu_platform

    monkeypatch.setattr(cpu_platform, "linears_compute_with_copies", lambda: False)
    monkeypatch.setattr(_custom_ops, "_supports_onednn", False)
    monkeypatch.setattr(utils, "check_cpu_sgl_kernel", lambda *_: False)


def first_load(checkpoint):
    """A model loaded as vLLM's model loader loads it, ready for a layerwise reload."""
    from vllm.model_executor.model_loader.reload import record_metadata_for_reloading
    from vllm.model_executor.model_loader.utils import process_weights_after_loading

    model = build_model(checkpoint)
    record_metadata_for_reloading(model)
    model.load_weights(iter(checkpoint_tensors(checkpoint).items()))
    # On CPU this packs the linear layers (their weight parameters become empty).
    process_weights_after_loading(model, model.checkpoint.model_config, torch.device("cpu"))
    return model


@pytest.fixture
def loaded_model(checkpoint):
    return first_load(checkpoint)


def test_a_push_outside_a_layerwise_reload_is_refused(checkpoint, loaded_model):
    tensor = checkpoint_tensors(checkpoint)[NAME]
    with pytest.raises(Spark2_5CheckpointError, match="outside vLLM's layerwise reload") as error:
        loaded_model.load_weights([(NAME, tensor)])
    assert NAME in str(error.value)


def parameters(model) -> dict[str, torch.Tensor]:
    return {name: param.detach().clone() for name, param in model.named_parameters()}


def assert_same(actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert actual.keys() == expected.keys()
    unequal = [name for name in actual if not torch.equal(actual[name], expected[name])]
    assert not unequal


def test_where_vllm_reads_the_parameters_direct_pushes_load_as_trainers_send_them(
    checkpoint, other_checkpoint, vllm_reads_the_parameters
):
    """TRL and OpenRLHF call ``load_weights`` on the worker's model with one tensor
    at a time, verl with buckets, others with a whole state dict: each loads."""
    model = first_load(checkpoint)
    assert all(param.numel() for param in model.parameters())  # vLLM packed nothing away
    pushed = checkpoint_tensors(other_checkpoint)
    names = sorted(pushed)
    for name in names[:5]:
        model.load_weights([(name, pushed[name])])
    for start in range(5, len(names), 4):
        model.load_weights([(name, pushed[name]) for name in names[start : start + 4]])
    assert_same(parameters(model), parameters(first_load(other_checkpoint)))
    assert model.lm_head.weight is model.model.embedding.weight
    model.load_weights(iter(checkpoint_tensors(checkpoint).items()))
    assert_same(parameters(model), parameters(first_load(checkpoint)))


def test_where_vllm_reads_the_parameters_a_refused_direct_bucket_loads_nothing(
    checkpoint, other_checkpoint, vllm_reads_the_parameters
):
    model = first_load(checkpoint)
    before = parameters(model)
    pushed = checkpoint_tensors(other_checkpoint)
    bucket = [(name, pushed[name]) for name in sorted(pushed)[:3]]
    bucket.append((NAME, pushed[NAME][:, :-1]))
    with pytest.raises(Spark2_5CheckpointError, match=f"Checkpoint tensor {NAME!r} has shape"):
        model.load_weights(bucket)
    assert_same(parameters(model), before)


def test_a_refused_tensor_ends_the_update_and_vllms_finish_raises_it_once(checkpoint, loaded_model):
    from vllm.model_executor.model_loader.reload import (
        finalize_layerwise_reload,
        initialize_layerwise_reload,
    )

    tensor = checkpoint_tensors(checkpoint)[NAME]
    initialize_layerwise_reload(loaded_model)
    loaded_model.load_weights([(NAME, tensor)])
    assert loaded_model.load_weights([(NAME, tensor.clone())]) == set()
    # Ended as vLLM's finalize ends it: no layer is left on the meta device.
    assert not host_hooks.in_layerwise_reload(loaded_model)
    assert not any(p.is_meta for p in loaded_model.parameters())
    config = loaded_model.checkpoint.model_config
    with pytest.raises(RefusedUpdate) as error:
        finalize_layerwise_reload(loaded_model, config)
    assert f"Checkpoint tensors {NAME!r} and {NAME!r} both load into {NAME!r}" in str(error.value)
    finalize_layerwise_reload(loaded_model, config)  # raised once: the next update starts clean
    initialize_layerwise_reload(loaded_model)
    loaded_model.load_weights([(NAME, tensor)])
    finalize_layerwise_reload(loaded_model, config)


def test_the_rest_of_a_refused_update_is_taken_and_dropped(
    checkpoint, other_checkpoint, loaded_model
):
    """What a broadcasting trainer needs: every later tensor of the update is still
    received (each iterator runs to its end), none of it loads."""
    from vllm.model_executor.model_loader.reload import (
        finalize_layerwise_reload,
        initialize_layerwise_reload,
    )

    pushed = checkpoint_tensors(other_checkpoint)
    taken: list[str] = []

    def stream(names):
        for name in names:
            taken.append(name)
            yield name, pushed[name]

    names = sorted(pushed)
    refused_at = names.index(NAME)
    initialize_layerwise_reload(loaded_model)
    wrong = (NAME, pushed[NAME][:, :-1])
    assert loaded_model.load_weights(iter([*stream(names[:refused_at]), wrong])) == set()
    before = parameters(loaded_model)
    assert loaded_model.load_weights(stream(names[refused_at + 1 :])) == set()
    assert loaded_model.load_weights([(NAME, pushed[NAME])]) == set()
    assert taken == names[:refused_at] + names[refused_at + 1 :]
    assert_same(parameters(loaded_model), before)
    with pytest.raises(RefusedUpdate, match=f"Checkpoint tensor {NAME!r} has shape"):
        finalize_layerwise_reload(loaded_model, loaded_model.checkpoint.model_config)


@pytest.mark.parametrize("first", [True, False])
def test_a_tensor_that_arrived_as_a_list_is_refused_by_name(checkpoint, first):
    from vllm.model_executor.model_loader.reload import (
        finalize_layerwise_reload,
        initialize_layerwise_reload,
    )

    tensors = checkpoint_tensors(checkpoint)
    model = build_model(checkpoint) if first else first_load(checkpoint)
    tensors[NAME] = tensors[NAME].tolist()
    if first:
        with pytest.raises(Spark2_5CheckpointError) as error:
            model.load_weights(list(tensors.items()))
        refusal = error.value
    else:
        initialize_layerwise_reload(model)
        model.load_weights(list(tensors.items()))
        with pytest.raises(RefusedUpdate) as error:
            finalize_layerwise_reload(model, model.checkpoint.model_config)
        refusal = error.value.__cause__
    assert str(refusal).startswith(
        f"Tensor {NAME!r} arrived as a list, not a torch.Tensor. A weights_iterator sent "
        "with collective_rpc"
    )
    assert all(isinstance(p, torch.Tensor) and not p.is_meta for p in model.parameters())


def test_the_headers_describe_every_tensor_of_a_checkpoint(checkpoint):
    """What the folder check of a reload reads: every tensor's name, shape and dtype."""
    from vllm_spark2_5_plugin.spark2_5_checkpoint import described_tensors

    described = {name: tensor for name, tensor in described_tensors(checkpoint)}
    tensors = checkpoint_tensors(checkpoint)
    assert described.keys() == tensors.keys()
    for name, tensor in tensors.items():
        assert described[name].is_meta
        assert (described[name].shape, described[name].dtype) == (tensor.shape, tensor.dtype)


def _safetensors_file(path, header: bytes, data: bytes = b"") -> None:
    path.write_bytes(len(header).to_bytes(8, "little") + header + data)


@settings(max_examples=60, deadline=None)
@given(
    entry=st.fixed_dictionaries(
        {
            "dtype": st.one_of(st.sampled_from(["F32", "BF16", "I8", "XX"]), st.integers()),
            "shape": st.one_of(
                st.lists(st.integers(min_value=-3, max_value=2**62), max_size=3),
                st.text(max_size=3),
                st.none(),
            ),
            "data_offsets": st.just([0, 0]),
        }
    )
)
def test_a_hostile_header_leaves_the_folder_unchecked_and_raises_nothing(tmp_path_factory, entry):
    """Whatever a header says, the check either describes it or steps aside (the load
    itself then names the damage): it never raises and never allocates the shape."""
    from vllm_spark2_5_plugin.spark2_5_checkpoint import described_tensors

    folder = tmp_path_factory.mktemp("hostile-header")
    _safetensors_file(folder / "model.safetensors", json.dumps({"w": entry}).encode())
    described = described_tensors(folder)
    assert described is None or all(tensor.is_meta for _, tensor in described)


def test_an_index_naming_a_missing_file_leaves_the_folder_unchecked(tmp_path):
    from vllm_spark2_5_plugin.spark2_5_checkpoint import described_tensors

    index = {"weight_map": {"w": "model-00001-of-00002.safetensors"}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    assert described_tensors(tmp_path) is None
    assert described_tensors(None) is None


@pytest.fixture(scope="module")
def w8a8_checkpoints(tmp_path_factory: pytest.TempPathFactory):
    from spark2_5_dev import quantize
    from spark2_5_dev.fixture import FIXTURE_CONFIG_OVERRIDES

    root = tmp_path_factory.mktemp("w8a8")
    return [
        quantize.quantize_checkpoint(
            build_spark2_5_checkpoint(
                root / f"float-{seed}", seed=seed, **FIXTURE_CONFIG_OVERRIDES
            ),
            root / f"w8a8-{seed}",
            quantize.W8A8_INT8,
        )
        for seed in (3, 4)
    ]


@pytest.mark.parametrize("cpu_path", cpu_paths())
@pytest.mark.parametrize("pushed", ["the layer's weight alone", "another layer"])
def test_a_quantized_layer_an_update_leaves_whole_computes_as_before(
    w8a8_checkpoints, caplog, pushed, cpu_path
):
    """vLLM would finish a layer pushed without its scales with uninitialised ones,
    and on its oneDNN kernel (no AMX) a layer an update leaves out loses its weight
    attribute: the carrier holds the lone weight back and keeps the layer whole."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader.reload import (
        finalize_layerwise_reload,
        initialize_layerwise_reload,
        record_metadata_for_reloading,
    )
    from vllm.model_executor.model_loader.utils import process_weights_after_loading

    from spark2_5_dev.model_building import build_model_and_config

    first, other = w8a8_checkpoints
    with kernel_path(cpu_path):  # vLLM picks the int8 kernel when it processes a layer
        model, vllm_config = build_model_and_config(first, dtype="bfloat16")
        record_metadata_for_reloading(model)
        model.load_weights(iter(checkpoint_tensors(first).items()))
        process_weights_after_loading(model, vllm_config.model_config, torch.device("cpu"))
    layer = model.model.layers[0].mlp.down_proj
    x = torch.randn(3, model.config.intermediate_size, dtype=torch.bfloat16)
    weight = "model.layers.0.mlp.down_proj.weight"
    name = weight if pushed == "the layer's weight alone" else "model.norm.weight"
    with set_current_vllm_config(vllm_config), kernel_path(cpu_path):
        before = layer(x)[0]
        initialize_layerwise_reload(model)
        model.load_weights([(name, checkpoint_tensors(other)[name])])
        finalize_layerwise_reload(model, vllm_config.model_config)
        assert torch.equal(layer(x)[0], before)
    if name == weight:
        assert f"model.layers.0.mlp.down_proj (pushed only {weight})" in caplog.text


# --- vLLM's direct reload (VLLM_RELOAD_MODE=direct, 0.34) ---------------------------------


def test_direct_reload_is_refused_at_start_naming_the_fix(checkpoint, monkeypatch):
    """Where vLLM has the direct reload mode, a model built under it refuses, naming the
    mode and the fix (it would bypass every update check); releases with the
    layerwise mode only ignore the variable, and the model builds."""
    from vllm_spark2_5_plugin import compat

    monkeypatch.setenv("VLLM_RELOAD_MODE", "direct")
    if compat.weight_update_mode() == "layerwise":  # 0.23 to 0.33: no such mode
        assert build_model(checkpoint) is not None
        return
    with pytest.raises(ValueError, match="VLLM_RELOAD_MODE=direct is not supported") as error:
        build_model(checkpoint)
    assert "Unset VLLM_RELOAD_MODE or set it to layerwise" in str(error.value)
    # The mode read as vLLM's reload reads it, engine-free: test_compat_model.py.
