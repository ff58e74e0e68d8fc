"""Quantized Spark2_5 checkpoints: the two formats the project writes
(compressed-tensors W8A8 int8, GPTQ 4-bit) read back by the formats' own code
(the ``compressed-tensors`` package, vLLM's GPTQ unpacker), loaded into the real
vLLM model with every tensor accounted for, and served by ``vllm serve``."""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from spark2_5_dev import quantize
from spark2_5_dev.checkpoints import build_spark2_5_checkpoint
from spark2_5_dev.fixture import FIXTURE_CONFIG_OVERRIDES
from spark2_5_dev.model_building import build_model, checkpoint_tensors, vllm_model_env

__all__ = ["vllm_model_env"]  # the fixture, for pytest


def random_weight(out_features: int, in_features: int, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(out_features, in_features, generator=generator) * 0.2


# --- the formats, read back by their own code -------------------------------------


def test_w8a8_config_and_tensors_read_back_with_the_compressed_tensors_package():
    from compressed_tensors.compressors import IntQuantizationCompressor
    from compressed_tensors.quantization import QuantizationConfig

    config = QuantizationConfig.model_validate(quantize.COMPRESSED_TENSORS_W8A8)
    scheme = config.config_groups["group_0"]
    assert scheme.weights.strategy == "channel" and scheme.input_activations.dynamic
    assert IntQuantizationCompressor.can_compress(torch.nn.Linear, scheme)
    weight = random_weight(96, 128)
    quantized, scale = quantize.int8_channelwise(weight)
    assert quantized.dtype == torch.int8 and scale.shape == (96, 1)
    restored = IntQuantizationCompressor.decompress(
        {"weight": quantized, "weight_scale": scale}, scheme
    )["weight"]
    assert ((restored - weight).abs() <= scale / 2 + 1e-6).all()


def test_gptq_tensors_read_back_with_vllms_unpacker():
    from vllm.model_executor.layers.quantization.utils.quant_utils import (
        unpack_quantized_values_into_int32,
    )
    from vllm.scalar_type import scalar_types

    weight = random_weight(64, 128, seed=1)
    tensors = quantize.gptq_int4(weight)
    assert tensors["qweight"].shape == (128 // 8, 64) and tensors["qweight"].dtype == torch.int32
    assert tensors["scales"].shape == (128 // quantize.GPTQ_GROUP_SIZE, 64)
    assert tensors["qzeros"].shape == (128 // quantize.GPTQ_GROUP_SIZE, 64 // 8)
    values = unpack_quantized_values_into_int32(tensors["qweight"], scalar_types.uint4b8, 0)
    zeros = unpack_quantized_values_into_int32(tensors["qzeros"], scalar_types.uint4b8, 1)
    assert (zeros == 7).all()  # v1 checkpoints store the zero point 8 minus one
    scales = tensors["scales"].float()[tensors["g_idx"].long()]  # [in, out]
    restored = ((values - scalar_types.uint4b8.bias) * scales).T
    assert ((restored - weight).abs() <= scales.T / 2 + 1e-3).all()


@settings(max_examples=50, deadline=None)
@given(
    rows=st.integers(1, 4),
    words=st.integers(1, 4),
    seed=st.integers(0, 2**31 - 1),
    dim=st.sampled_from([0, 1]),
)
def test_packing_any_4_bit_values_round_trips(rows, words, seed, dim):
    generator = torch.Generator().manual_seed(seed)
    shape = (words * 8, rows) if dim == 0 else (rows, words * 8)
    values = torch.randint(0, 16, shape, generator=generator)
    packed = quantize._pack_int32(values, dim=dim)
    assert packed.dtype == torch.int32
    assert torch.equal(quantize.unpack_int32(packed, dim=dim), values)


@settings(max_examples=40, deadline=None)
@given(
    out_groups=st.integers(1, 3),
    in_groups=st.integers(1, 3),
    seed=st.integers(0, 2**31 - 1),
    magnitude=st.sampled_from([0.0, 1e-6, 0.2, 1e3]),
    zero_rows=st.integers(0, 2),
)
def test_both_quantizers_stay_within_half_a_step_of_any_weight(
    out_groups, in_groups, seed, magnitude, zero_rows
):
    """Any finite weight, including all-zero rows and very small or large values:
    dequantized, every entry is within half a quantization step."""
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randn(out_groups * 8, in_groups * 32, generator=generator) * magnitude
    weight[:zero_rows] = 0
    quantized, scale = quantize.int8_channelwise(weight)
    assert ((quantized.float() * scale - weight).abs() <= scale / 2 * 1.001).all()
    tensors = quantize.gptq_int4(weight)
    values = quantize.unpack_int32(tensors["qweight"], dim=0)  # [in, out]
    scales = tensors["scales"].float()[tensors["g_idx"].long()]
    restored = ((values - 8) * scales).T
    # float16 scales round to 2**-11 relative; a zero group has the floor scale
    assert ((restored - weight).abs() <= scales.T / 2 * 1.01 + 1e-7).all()


@pytest.mark.parametrize(("out_features", "in_features"), [(64, 100), (60, 128)])
def test_gptq_refuses_shapes_it_cannot_group_or_pack(out_features, in_features):
    with pytest.raises(ValueError, match=rf"shape \({out_features}, {in_features}\)"):
        quantize.gptq_int4(random_weight(out_features, in_features))


def test_an_unknown_format_is_refused_naming_the_choices():
    with pytest.raises(ValueError, match=r"format='int3'.*w8a8-int8, gptq-int4"):
        quantize.quantize_tensors({}, "int3")


# --- loading into the vLLM model --------------------------------------------------


def test_compat_drops_what_the_quantization_method_does_not_load():
    from vllm.model_executor.layers.quantization.auto_gptq import AutoGPTQConfig

    from vllm_spark2_5_plugin import compat

    names = ["a.qweight", "a.g_idx", "a.scales"]
    weights = [(name, torch.zeros(1)) for name in names]
    assert list(compat.quantized_checkpoint_names(None, weights)) == weights
    gptq = AutoGPTQConfig.from_config(quantize.GPTQ_CONFIG)
    kept = [name for name, _ in compat.quantized_checkpoint_names(gptq, weights)]
    if hasattr(gptq, "get_checkpoint_weight_mapper"):  # vLLM 0.32: its kernels take no g_idx
        assert kept == ["a.qweight", "a.scales"]
    else:  # 0.23 to 0.31 read every tensor, g_idx included
        assert kept == names


@pytest.fixture(autouse=True)
def any_cpus_kernels(monkeypatch):
    """These tests load weights and run no kernel: on an AVX2 CPU, whose vLLM kernel
    library has no GPTQ op, the model's refusal at construction (tested in
    ``test_weight_updates.py``) would come before every checkpoint check."""
    from vllm_spark2_5_plugin import host_hooks

    monkeypatch.setattr(host_hooks, "refuse_missing_cpu_kernel_ops", lambda model: None)


@pytest.fixture(scope="module")
def quantized(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("quantized")
    base = build_spark2_5_checkpoint(root / "float", seed=3, **FIXTURE_CONFIG_OVERRIDES)
    return {fmt: quantize.quantize_checkpoint(base, root / fmt, fmt) for fmt in quantize.FORMATS}


def load(checkpoint, tensors):
    model = build_model(checkpoint, dtype="bfloat16")
    return model, model.load_weights(iter(tensors.items()))


@pytest.mark.usefixtures("vllm_model_env")
@pytest.mark.parametrize("fmt", quantize.FORMATS)
def test_every_quantized_parameter_is_filled_and_g_proj_stays_float(quantized, fmt):
    model, names = load(quantized[fmt], checkpoint_tensors(quantized[fmt]))
    attention = model.model.layers[0].self_attn
    assert type(attention.g_proj.quant_method).__name__ == "UnquantizedLinearMethod"
    assert attention.g_proj.weight.is_floating_point()
    assert type(attention.q_k_v_proj.quant_method).__name__ != "UnquantizedLinearMethod"
    quantized_param = "weight_scale" if fmt == quantize.W8A8_INT8 else "qweight"
    assert f"model.layers.0.mlp.gate_up_proj.{quantized_param}" in names
    # g_idx is loaded exactly where the quantization method has a parameter for it
    # (vLLM 0.23 to 0.31); vLLM 0.32's GPTQ kernels take none and it is dropped.
    g_idx_params = {name for name, _ in model.named_parameters() if name.endswith("g_idx")}
    assert {name for name in names if name.endswith("g_idx")} == g_idx_params


@pytest.mark.usefixtures("vllm_model_env")
@pytest.mark.parametrize(
    ("fmt", "dropped"),
    [
        (quantize.W8A8_INT8, "model.layers.2.self_attn.q_k_v_proj.weight_scale"),
        (quantize.W8A8_INT8, "model.layers.1.mlp.up_proj.weight_scale"),
        (quantize.GPTQ_INT4, "model.layers.3.mlp.down_proj.scales"),
        (quantize.GPTQ_INT4, "model.layers.0.mlp.gate_proj.qzeros"),
    ],
)
def test_a_missing_scale_tensor_is_an_error_that_names_it(quantized, fmt, dropped):
    tensors = checkpoint_tensors(quantized[fmt])
    del tensors[dropped]
    with pytest.raises(ValueError, match="lacks these tensors") as error:
        load(quantized[fmt], tensors)
    assert dropped in str(error.value)


@pytest.mark.usefixtures("vllm_model_env")
@pytest.mark.parametrize("fmt", quantize.FORMATS)
def test_a_checkpoint_that_quantizes_g_proj_is_an_error_that_says_how_to_fix_it(quantized, fmt):
    tensors = checkpoint_tensors(quantized[fmt])
    prefix = "model.layers.0.self_attn.g_proj"
    weight = tensors.pop(f"{prefix}.weight").float()
    if fmt == quantize.W8A8_INT8:
        tensors[f"{prefix}.weight"], tensors[f"{prefix}.weight_scale"] = quantize.int8_channelwise(
            weight
        )
    else:
        padded = torch.cat([weight, weight.new_zeros(8 - weight.shape[0], weight.shape[1])])
        tensors.update({f"{prefix}.{k}": v for k, v in quantize.gptq_int4(padded).items()})
    with pytest.raises(ValueError, match="quantizes g_proj") as error:
        load(quantized[fmt], tensors)
    assert prefix in str(error.value) and "ignore" in str(error.value)


def test_quantization_configs_keep_g_proj_out(quantized):
    ct = json.loads((quantized[quantize.W8A8_INT8] / "config.json").read_text())
    assert "re:.*g_proj$" in ct["quantization_config"]["ignore"]
    gptq = json.loads((quantized[quantize.GPTQ_INT4] / "config.json").read_text())
    groups = gptq["quantization_config"]["modules_in_block_to_quantize"]
    assert not any("g_proj" in module for group in groups for module in group)


# --- what vLLM's CPU build cannot run (docs/lora-and-quantization.md) --------------


@pytest.mark.usefixtures("vllm_model_env")
def test_gptq_in_float32_is_refused_by_vllm_naming_the_dtype(quantized):
    from vllm.config import ModelConfig, VllmConfig

    model_config = ModelConfig(
        model=str(quantized[quantize.GPTQ_INT4]), dtype="float32", max_model_len=64
    )
    with pytest.raises(ValueError, match=r"torch.float32 is not supported for quantization"):
        VllmConfig(model_config=model_config)


@pytest.mark.usefixtures("vllm_model_env")
def test_w8a8_int8_in_float32_runs_or_fails_with_vllms_kernel_error(quantized):
    """vLLM 0.32's SGL int8 kernel (CPUs with AMX) refuses float32 activations (the
    documented error); its oneDNN kernel (no AMX) and vLLM 0.23's run them. Either
    way nothing else may happen."""
    checkpoint = quantized[quantize.W8A8_INT8]
    model = build_model(checkpoint, dtype="float32")
    model.load_weights(iter(checkpoint_tensors(checkpoint).items()))
    layer = model.model.layers[0].self_attn.out_proj
    layer.quant_method.process_weights_after_loading(layer)
    try:
        output = layer(torch.randn(3, layer.input_size))
    except RuntimeError as error:
        assert "expect A to be bfloat16 or half" in str(error)
    else:
        output = output[0] if isinstance(output, tuple) else output
        assert output.shape == (3, layer.output_size) and output.isfinite().all()
    bf16_layer = build_model(checkpoint, dtype="bfloat16").model.layers[0].self_attn.out_proj
    assert bf16_layer.weight.dtype == torch.int8  # the same layer runs in bfloat16 when served
