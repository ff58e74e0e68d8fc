"""Checkpoints that do not match their ``config.json`` never load: wrong shapes (larger
ones too, which vLLM's loaders would silently cut), non-floating dtypes, NaN/Inf
values and damaged files are each one ``Spark2_5CheckpointError`` naming the tensor
or file, on every tensor/pipeline parallel rank, in the real vLLM model."""

from __future__ import annotations

import json
import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from carrier_harness.server import run_vllm_serve_expecting_failure
from spark2_5_dev.carrier import ENABLE_ENV
from spark2_5_dev.checkpoints import build_spark2_5_checkpoint, read_config
from spark2_5_dev.model_building import (
    build_model,
    checkpoint_tensors,
    parallel_rank,
    vllm_model_env,
)
from vllm_spark2_5_plugin.settings import CHECK_FINITE_ENV
from vllm_spark2_5_plugin.spark2_5_checkpoint import (
    Spark2_5CheckpointError,
    TensorChecks,
    checkpoint_folder,
    has_non_finite,
    safetensors_damage,
)
from vllm_spark2_5_plugin.spark2_5_config import Spark2_5Config

__all__ = ["vllm_model_env"]  # the fixture, for pytest

pytestmark = pytest.mark.usefixtures("vllm_model_env")

# Each checkpoint is the tiny default (4 heads, 2 KV heads, head_dim 32, hidden 64,
# intermediate 128, vocab 320, 4 layers) with these config changes.
VARIANTS = {
    "base": {},
    "kv-heads-4": {"num_key_value_heads": 4},
    "kv-heads-1": {"num_key_value_heads": 1},
    "heads-8": {"num_attention_heads": 8},
    "intermediate-96": {"intermediate_size": 96},
    "head-dim-64": {"head_dim": 64},
    "head-dim-16": {"head_dim": 16},
    "vocab-640": {"vocab_size": 640},
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("spark2_5-hostile")
    return {
        name: build_spark2_5_checkpoint(root / name, seed=3, **overrides)
        for name, overrides in VARIANTS.items()
    }


@pytest.fixture(scope="module")
def base_model(checkpoints):
    """One model for the base config; a refused load leaves it reusable (nothing of the
    refused tensor was copied and the next load checks everything again)."""
    return build_model(checkpoints["base"])


def refuse(model, tensors) -> Spark2_5CheckpointError:
    with pytest.raises(Spark2_5CheckpointError) as error:
        model.load_weights(iter(tensors.items()))
    return error.value


def mismatches(config_checkpoint, tensor_checkpoint) -> dict[str, tuple[list, list]]:
    """Tensor name -> (its shape in ``tensor_checkpoint``, the shape of the same tensor in
    the checkpoint built from ``config_checkpoint``'s own config) where they differ."""
    right = checkpoint_tensors(config_checkpoint)
    wrong = checkpoint_tensors(tensor_checkpoint)
    return {
        name: (list(tensor.shape), list(right[name].shape))
        for name, tensor in wrong.items()
        if name in right and tensor.shape != right[name].shape
    }


def assert_names_a_mismatch(error: Exception, expected: dict[str, tuple[list, list]]) -> None:
    message = str(error)
    named = re.match(r"Checkpoint tensor '([^']+)' has shape (\[[^\]]*\]), but config", message)
    assert named, message
    name, shape = named.groups()
    assert name in expected, message
    got, implied = expected[name]
    assert shape == str(got)
    assert f"config.json implies {implied}" in message


# --- 12./13. shapes -----------------------------------------------------------------------

SHAPE_CASES = [
    ("base", "kv-heads-4"),  # 4 KV heads in the checkpoint, 2 in config.json
    ("base", "heads-8"),
    ("intermediate-96", "base"),  # intermediate_size 128 vs 96
    ("base", "head-dim-64"),
    ("base", "head-dim-16"),  # smaller: a bare AssertionError/RuntimeError before
    ("base", "vocab-640"),
    ("kv-heads-4", "base"),
]


@pytest.mark.parametrize(("config_of", "tensors_of"), SHAPE_CASES)
def test_a_tensor_of_another_shape_is_refused_by_name(checkpoints, config_of, tensors_of):
    expected = mismatches(checkpoints[config_of], checkpoints[tensors_of])
    assert expected
    model = build_model(checkpoints[config_of])
    error = refuse(model, checkpoint_tensors(checkpoints[tensors_of]))
    assert_names_a_mismatch(error, expected)


def test_the_error_spells_out_the_shape_from_the_config(checkpoints, base_model):
    tensors = checkpoint_tensors(checkpoints["base"])
    name = "model.layers.2.self_attn.q_k_v_proj.weight"
    tensors[name] = torch.cat([tensors[name], tensors[name]])  # twice the rows
    message = str(refuse(base_model, tensors))
    assert message == (
        f"Checkpoint tensor {name!r} has shape [512, 64], but config.json implies [256, 64] = "
        "[(num_attention_heads + 2 * num_key_value_heads) * head_dim, hidden_size] with "
        "head_dim=32, hidden_size=64, num_attention_heads=4, num_key_value_heads=2. The "
        "checkpoint does not match its config.json: fix whichever of the two is wrong"
    )


@pytest.mark.parametrize(
    ("name", "shape"),
    [
        ("model.layers.1.self_attn.k_proj.weight", [128, 64]),
        ("model.layers.0.input_layernorm.weight", [64, 1]),
        ("model.norm.weight", []),
        ("model.layers.3.mlp.up_proj.weight", [128, 65]),
    ],
)
def test_split_and_other_tensors_are_checked_too(checkpoints, name, shape):
    tensors = checkpoint_tensors(checkpoints["base"])
    if "k_proj" in name:
        tensors = split_qkv(tensors)
    tensors[name] = torch.zeros(shape)
    message = str(refuse(build_model(checkpoints["base"]), tensors))
    assert message.startswith(f"Checkpoint tensor {name!r} has shape {shape}, but config.json")


def split_qkv(tensors):
    split = {}
    for name, tensor in tensors.items():
        if ".q_k_v_proj." in name:
            for part, piece in zip("qkv", tensor.split([128, 64, 64]), strict=True):
                split[name.replace(".q_k_v_proj.", f".{part}_proj.")] = piece
        else:
            split[name] = tensor
    return split


@pytest.mark.parametrize(
    ("config_of", "tp"), [("base", 2), ("kv-heads-1", 2)], ids=["kv-partitioned", "kv-replicated"]
)
def test_every_tensor_parallel_rank_compares_the_full_tensor(
    checkpoints, monkeypatch, config_of, tp
):
    """Each rank would slice its part out of the larger tensor without complaint."""
    wrong = "kv-heads-4"
    expected = mismatches(checkpoints[config_of], checkpoints[wrong])
    for rank in range(tp):
        with parallel_rank(monkeypatch, tp=(rank, tp)):
            model = build_model(checkpoints[config_of])
            assert_names_a_mismatch(refuse(model, checkpoint_tensors(checkpoints[wrong])), expected)


def test_every_pipeline_stage_checks_the_tensors_of_the_others(checkpoints, monkeypatch):
    tensors = checkpoint_tensors(checkpoints["base"])
    name = "model.layers.3.mlp.down_proj.weight"  # stage 1 of 2 loads layers 2 and 3
    tensors[name] = torch.zeros(64, 256)
    with parallel_rank(monkeypatch, pp=(0, 2)):
        model = build_model(checkpoints["base"])
        assert "model.layers.3.mlp.down_proj.weight" not in dict(model.named_parameters())
        message = str(refuse(model, tensors))
    assert message.startswith(f"Checkpoint tensor {name!r} has shape [64, 256]")


# --- 14. dtypes -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "dtype", [torch.int64, torch.int32, torch.int8, torch.uint8, torch.bool, torch.complex64]
)
@pytest.mark.parametrize(
    "name",
    [
        "model.embedding.weight",
        "model.layers.0.self_attn.q_k_v_proj.weight",
        "model.layers.2.post_attention_layernorm.weight",
        "model.layers.1.mlp.gate_proj.weight",
    ],
)
def test_a_non_floating_tensor_is_refused_not_cast(checkpoints, base_model, name, dtype):
    tensors = checkpoint_tensors(checkpoints["base"])
    tensors[name] = torch.ones_like(tensors[name], dtype=dtype)
    message = str(refuse(base_model, tensors))
    assert message.startswith(f"Checkpoint tensor {name!r} has dtype {dtype};")
    assert "quantization_config" in message


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16, torch.float16])
def test_other_floating_dtypes_load(checkpoints, dtype):
    tensors = checkpoint_tensors(checkpoints["base"])
    name = "model.layers.0.mlp.down_proj.weight"
    tensors[name] = tensors[name].to(dtype)
    model = build_model(checkpoints["base"])
    model.load_weights(iter(tensors.items()))
    loaded = dict(model.named_parameters())[name].detach()
    torch.testing.assert_close(loaded, tensors[name].float(), rtol=0, atol=0)


def test_quantized_models_check_only_the_layers_spark2_5_never_quantizes(checkpoints):
    """With a quantization config, packed integer weights, zero points and g_idx are the
    scheme's; the RMSNorms and the head-wise gate are plain tensors in any checkpoint."""
    config = Spark2_5Config.from_pretrained(checkpoints["base"])
    quantized = TensorChecks(config, quantized=True, check_finite=True)
    packed = torch.zeros(8, 256, dtype=torch.int32)
    for name in (
        "model.layers.0.self_attn.q_k_v_proj.qweight",
        "model.layers.0.self_attn.q_k_v_proj.weight",  # e.g. int8 weight-only schemes
        "model.layers.0.mlp.down_proj.g_idx",
        "model.embedding.weight",
    ):
        quantized.check_layout(name, packed)
    for name in ("model.layers.0.input_layernorm.weight", "model.norm.weight"):
        with pytest.raises(Spark2_5CheckpointError, match=r"has dtype torch\.int32"):
            quantized.check_layout(name, torch.ones(64, dtype=torch.int32))
    with pytest.raises(Spark2_5CheckpointError, match="has shape"):
        quantized.check_layout("model.layers.1.self_attn.g_proj.weight", torch.zeros(8, 64))
    with pytest.raises(Spark2_5CheckpointError, match="NaN"):
        quantized.check_values("model.norm.weight", torch.full((64,), float("nan")))
    unquantized = TensorChecks(config, quantized=False, check_finite=True)
    with pytest.raises(Spark2_5CheckpointError, match=r"has dtype torch\.int32"):
        unquantized.check_layout("model.layers.0.self_attn.q_k_v_proj.weight", packed)


# --- 15. NaN / Inf ----------------------------------------------------------------------------


NON_FINITE = [
    ("model.layers.1.self_attn.q_k_v_proj.weight", float("nan"), "holds 3 NaN and 0 infinite"),
    ("model.embedding.weight", float("inf"), "holds 0 NaN and 3 infinite"),
    ("model.norm.weight", float("-inf"), "holds 0 NaN and 3 infinite"),
]


def with_non_finite(checkpoint, name, bad):
    tensors = checkpoint_tensors(checkpoint)
    tensors[name] = tensors[name].clone()
    tensors[name].view(-1)[[0, 5, -1]] = bad
    return tensors


@pytest.mark.parametrize(("name", "bad", "counts"), NON_FINITE)
def test_nan_or_inf_weights_are_refused_when_asked(checkpoints, monkeypatch, name, bad, counts):
    monkeypatch.setenv(CHECK_FINITE_ENV, "1")
    model = build_model(checkpoints["base"])
    message = str(refuse(model, with_non_finite(checkpoints["base"], name, bad)))
    assert message.startswith(f"Checkpoint tensor {name!r} {counts} values (of ")


@pytest.mark.parametrize("unset", [None, "0", "off"])
def test_the_nan_check_is_off_by_default(checkpoints, monkeypatch, unset):
    """Off unless asked: it adds 37-94% to the load time (bench_checkpoint_checks.py)."""
    if unset is None:
        monkeypatch.delenv(CHECK_FINITE_ENV, raising=False)
    else:
        monkeypatch.setenv(CHECK_FINITE_ENV, unset)
    name, bad, _ = NON_FINITE[0]
    model = build_model(checkpoints["base"])
    model.load_weights(iter(with_non_finite(checkpoints["base"], name, bad).items()))
    assert torch.isnan(dict(model.named_parameters())[name]).sum() == 3


def test_an_unknown_nan_check_setting_is_a_clear_error(checkpoints, monkeypatch):
    monkeypatch.setenv(CHECK_FINITE_ENV, "maybe" * 100)
    with pytest.raises(ValueError, match=f"{CHECK_FINITE_ENV}='maybemaybe") as error:
        build_model(checkpoints["base"])
    assert "use one of 1" in str(error.value)
    assert len(str(error.value)) < 300  # the 500-character value is echoed capped


@settings(max_examples=300, deadline=None)
@given(
    dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16, torch.float64]),
    values=st.lists(
        st.floats(allow_nan=True, allow_infinity=True, width=16), min_size=1, max_size=64
    ),
    scale=st.sampled_from([1.0, 1e4, 6e4]),
)
def test_has_non_finite_is_exact_for_every_float_dtype(dtype, values, scale):
    """Large finite values never count (no overflow), one NaN or Inf always does."""
    tensor = (torch.tensor(values, dtype=torch.float64) * scale).to(dtype)
    assert has_non_finite(tensor) == (not bool(torch.isfinite(tensor).all()))


# --- property: any wrong shape or dtype of any tensor ------------------------------------------

SHAPES = st.lists(st.integers(min_value=1, max_value=300), min_size=0, max_size=3)
NON_FLOATING = st.sampled_from([torch.int64, torch.int16, torch.uint8, torch.bool, torch.complex64])


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_any_wrong_shape_or_dtype_is_one_error_naming_the_tensor(checkpoints, base_model, data):
    tensors = checkpoint_tensors(checkpoints["base"])
    name = data.draw(st.sampled_from(sorted(tensors)), label="tensor")
    right = tensors[name]
    if data.draw(st.booleans(), label="wrong dtype"):
        tensors[name] = torch.zeros(right.shape, dtype=data.draw(NON_FLOATING, label="dtype"))
        expected = f"Checkpoint tensor {name!r} has dtype"
    else:
        shape = data.draw(SHAPES.filter(lambda s: s != list(right.shape)), label="shape")
        tensors[name] = torch.zeros(shape)
        expected = f"Checkpoint tensor {name!r} has shape {shape}"
    assert str(refuse(base_model, tensors)).startswith(expected)


# --- 16. damaged files ----------------------------------------------------------------------------


def damage(path, how: str) -> None:
    data = path.read_bytes()
    header_end = 8 + int.from_bytes(data[:8], "little")
    damaged = {
        "truncated data": data[:-100],
        "truncated header": data[: header_end - 10],
        "empty": b"",
        "header not json": data[:8] + b"\xff" * (header_end - 8) + data[header_end:],
    }[how]
    path.write_bytes(damaged)


DAMAGE = ["truncated data", "truncated header", "empty", "header not json"]


@pytest.mark.parametrize("how", DAMAGE)
def test_a_damaged_file_is_named_when_vllm_loads_the_config(tmp_path, how):
    """vLLM reads every safetensors header right after the config (dtype, tied head):
    before the fix a bare struct/JSON/UTF-8 error there, or SafetensorError later."""
    from vllm.config import ModelConfig, VllmConfig

    checkpoint = build_spark2_5_checkpoint(tmp_path / "sharded", seed=3, shards=3)
    bad_file = checkpoint / "model-00002-of-00003.safetensors"
    damage(bad_file, how)
    with pytest.raises(ValueError) as error:
        VllmConfig(
            model_config=ModelConfig(model=str(checkpoint), dtype="float32", max_model_len=128)
        )
    assert f"Checkpoint file {str(bad_file)!r} cannot be read: " in str(error.value)
    assert "Re-download or re-copy it" in str(error.value)


@pytest.mark.parametrize("how", DAMAGE)
def test_a_file_damaged_after_the_config_loaded_is_named_by_the_loader(tmp_path, how):
    """The case the config-time check cannot see: a file that goes bad (or, for a hub
    model, is downloaded) after the config loaded. vLLM's own reader fails on it."""
    from vllm.config import LoadConfig, ModelConfig, VllmConfig, set_current_vllm_config
    from vllm.model_executor.model_loader import get_model_loader

    from vllm_spark2_5_plugin.spark2_5 import Spark2_5ForCausalLM

    checkpoint = build_spark2_5_checkpoint(tmp_path / "sharded", seed=3, shards=3)
    vllm_config = VllmConfig(
        model_config=ModelConfig(model=str(checkpoint), dtype="float32", max_model_len=128)
    )
    bad_file = checkpoint / "model-00003-of-00003.safetensors"
    damage(bad_file, how)
    with set_current_vllm_config(vllm_config), torch.device("cpu"):
        model = Spark2_5ForCausalLM(vllm_config=vllm_config)
        with pytest.raises(Spark2_5CheckpointError) as error:
            get_model_loader(LoadConfig()).load_weights(model, vllm_config.model_config)
    message = str(error.value)
    assert message.startswith(f"Checkpoint file {str(bad_file)!r} cannot be read: ")
    assert message.endswith("Re-download or re-copy it")
    assert error.value.__cause__ is not None  # vLLM's own error stays attached


def test_sound_files_have_no_damage(checkpoints):
    for path in checkpoints["base"].glob("*.safetensors"):
        assert safetensors_damage(path) is None


def test_the_folder_to_diagnose_is_the_local_path_or_a_cached_snapshot(tmp_path, checkpoints):
    assert checkpoint_folder(str(checkpoints["base"]), None, None) == checkpoints["base"]
    # not a folder and not in this (empty) cache: nothing to diagnose, no network
    assert checkpoint_folder("spark2-5-tests/not-a-model", None, str(tmp_path)) is None


# --- end to end: the "never loads" promise through vllm serve ------------------------------------


@pytest.mark.serve
def test_vllm_serve_refuses_a_checkpoint_with_more_kv_heads_than_its_config(tmp_path):
    checkpoint = build_spark2_5_checkpoint(tmp_path / "kv4", num_key_value_heads=4)
    config = read_config(checkpoint)
    (checkpoint / "config.json").write_text(json.dumps({**config, "num_key_value_heads": 2}))
    done = run_vllm_serve_expecting_failure(checkpoint, env={ENABLE_ENV: "1"}, timeout=420)
    output = done.stdout + done.stderr
    assert done.returncode != 0
    assert re.search(
        r"Checkpoint tensor 'model\.layers\.\d+\.self_attn\.q_k_v_proj\.weight' has shape "
        r"\[384, 64\], but config\.json implies \[256, 64\]",
        output,
    ), output[-4000:]
