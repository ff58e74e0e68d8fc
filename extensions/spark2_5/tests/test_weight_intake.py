"""What the real vLLM ``Spark2_5ForCausalLM`` refuses once loaded, without an engine:
pushes outside vLLM's layerwise reload, a tensor pushed twice in one update, and a
"tensor" that arrived as a plain list. End to end: ``test_weight_updates.py``."""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from spark2_5_dev.checkpoints import build_spark2_5_checkpoint
from spark2_5_dev.model_building import build_model, checkpoint_tensors, vllm_model_env
from vllm_spark2_5_plugin import host_hooks
from vllm_spark2_5_plugin.spark2_5_checkpoint import Spark2_5CheckpointError

__all__ = ["vllm_model_env"]  # the fixture, for pytest

pytestmark = pytest.mark.usefixtures("vllm_model_env")

NAME = "model.layers.1.mlp.down_proj.weight"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory):
    return build_spark2_5_checkpoint(tmp_path_factory.mktemp("intake"), seed=4)


def first_load(checkpoint):
    """A model loaded as vLLM's model loader loads it, ready for a layerwise reload."""
    from vllm.model_executor.model_loader.reload import record_metadata_for_reloading
    from vllm.model_executor.model_loader.utils import process_weights_after_loading

    model = build_model(checkpoint)
    record_metadata_for_reloading(model)
    model.load_weights(iter(checkpoint_tensors(checkpoint).items()))
    # On CPU this packs the linear layers (their weight parameters become empty).
    process_weights_after_loading(model, model.weight_intake.model_config, torch.device("cpu"))
    return model


@pytest.fixture
def loaded_model(checkpoint):
    return first_load(checkpoint)


def test_a_push_outside_a_layerwise_reload_is_refused(checkpoint, loaded_model):
    tensor = checkpoint_tensors(checkpoint)[NAME]
    with pytest.raises(Spark2_5CheckpointError, match="outside vLLM's layerwise reload") as error:
        loaded_model.load_weights([(NAME, tensor)])
    assert NAME in str(error.value)


def test_a_tensor_pushed_twice_in_one_update_is_refused_and_the_update_ends(
    checkpoint, loaded_model
):
    from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

    tensor = checkpoint_tensors(checkpoint)[NAME]
    initialize_layerwise_reload(loaded_model)
    loaded_model.load_weights([(NAME, tensor)])
    with pytest.raises(Spark2_5CheckpointError) as error:
        loaded_model.load_weights([(NAME, tensor.clone())])
    assert str(error.value) == (
        f"Checkpoint tensors {NAME!r} and {NAME!r} both load into {NAME!r}; "
        "keep either the fused tensor or its parts, once"
    )
    # Ended as vLLM's finalize ends it: no layer is left on the meta device.
    assert not host_hooks.in_layerwise_reload(loaded_model)
    assert not any(p.is_meta for p in loaded_model.parameters())


@pytest.mark.parametrize("first", [True, False])
def test_a_tensor_that_arrived_as_a_list_is_refused_by_name(checkpoint, first):
    from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

    tensors = checkpoint_tensors(checkpoint)
    if first:
        model = build_model(checkpoint)
    else:
        model = first_load(checkpoint)
        initialize_layerwise_reload(model)
    tensors[NAME] = tensors[NAME].tolist()
    with pytest.raises(Spark2_5CheckpointError) as error:
        model.load_weights(list(tensors.items()))
    assert str(error.value).startswith(
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
