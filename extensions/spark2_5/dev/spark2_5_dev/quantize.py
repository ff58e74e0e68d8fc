"""Quantized Spark2_5 checkpoints in two standard formats, written from a float one.

The ecosystem's quantization tool (llm-compressor) cannot be installed beside
vLLM 0.32 without replacing the transformers and compressed-tensors releases
vLLM pins, so this module writes the formats itself, by round-to-nearest:

* ``w8a8-int8``: compressed-tensors ``int-quantized``, int8 weights with one
  float32 scale per output channel (``weight``, ``weight_scale [out, 1]``) and
  dynamic per-token int8 activations, as llm-compressor's W8A8 scheme writes it;
* ``gptq-int4``: GPTQ (AutoGPTQ ``checkpoint_format: gptq``), 4-bit symmetric
  weights in groups of :data:`GPTQ_GROUP_SIZE` input channels: ``qweight``
  int32 ``[in / 8, out]`` (eight values per int32 along the input, lowest bits
  first), ``scales`` float16 ``[in / group, out]``, ``qzeros`` int32
  ``[in / group, out / 8]`` holding ``zero - 1`` (v1 format) and ``g_idx``
  int32 ``[in]``; weight = ``(q - 8) * scale``.

Every linear module but ``g_proj`` is quantized; ``g_proj``, the norms and the
embedding stay in bfloat16 (``torch_dtype``), and the quantization config says
so (``ignore`` for compressed-tensors, ``modules_in_block_to_quantize`` for
GPTQ).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

W8A8_INT8 = "w8a8-int8"
GPTQ_INT4 = "gptq-int4"
FORMATS = (W8A8_INT8, GPTQ_INT4)
QUANTIZED_MODULES = ("q_k_v_proj", "out_proj", "gate_proj", "up_proj", "down_proj")
GPTQ_GROUP_SIZE = 32
_GPTQ_BITS = 4
_GPTQ_PACK = 32 // _GPTQ_BITS
_GPTQ_ZERO = 2 ** (_GPTQ_BITS - 1)

_INT8_ARGS = {"num_bits": 8, "type": "int", "symmetric": True, "group_size": None}
COMPRESSED_TENSORS_W8A8 = {
    "quant_method": "compressed-tensors",
    "format": "int-quantized",
    "quantization_status": "compressed",
    "config_groups": {
        "group_0": {
            "targets": ["Linear"],
            "weights": {**_INT8_ARGS, "strategy": "channel", "dynamic": False},
            "input_activations": {**_INT8_ARGS, "strategy": "token", "dynamic": True},
            "output_activations": None,
            "format": "int-quantized",
        }
    },
    # lm_head is the tied embedding; g_proj is tiny and feeds fp32 gate math.
    "ignore": ["lm_head", "re:.*g_proj$"],
    "kv_cache_scheme": None,
    "sparsity_config": {},
}
GPTQ_CONFIG = {
    "quant_method": "gptq",
    "checkpoint_format": "gptq",
    "bits": _GPTQ_BITS,
    "group_size": GPTQ_GROUP_SIZE,
    "desc_act": False,
    "sym": True,
    "static_groups": False,
    "true_sequential": True,
    "modules_in_block_to_quantize": [
        ["self_attn.q_k_v_proj"],
        ["self_attn.out_proj"],
        ["mlp.gate_proj", "mlp.up_proj"],
        ["mlp.down_proj"],
    ],
}


def is_quantized_weight(name: str) -> bool:
    return name.endswith(".weight") and name.rsplit(".", 2)[-2] in QUANTIZED_MODULES


def int8_channelwise(weight: Any) -> tuple[Any, Any]:
    """``weight [out, in]`` as int8 and one float32 scale per output row."""
    import torch

    weight = weight.float()
    scale = weight.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / 127
    quantized = torch.round(weight / scale).clamp(-128, 127).to(torch.int8)
    return quantized, scale


def gptq_int4(weight: Any, group_size: int = GPTQ_GROUP_SIZE) -> dict[str, Any]:
    """``weight [out, in]`` as GPTQ v1 tensors ``qweight``, ``qzeros``, ``scales``, ``g_idx``."""
    import torch

    out_features, in_features = weight.shape
    if in_features % group_size or out_features % _GPTQ_PACK:
        raise ValueError(
            f"weight of shape {tuple(weight.shape)}: GPTQ needs in_features divisible by "
            f"group_size={group_size} and out_features by {_GPTQ_PACK}"
        )
    groups = weight.float().T.reshape(in_features // group_size, group_size, out_features)
    # Symmetric AutoGPTQ: the range [-amax, amax] over 15 steps, zero point 8.
    exact = groups.abs().amax(dim=1) * 2 / (2**_GPTQ_BITS - 1)
    scales = exact.clamp(min=torch.finfo(torch.float16).tiny).half()
    # Rounded down to float16, a scale would clip the group's largest weight.
    scales = torch.where(
        scales.float() < exact, torch.nextafter(scales, torch.full_like(scales, torch.inf)), scales
    )
    levels = torch.round(groups / scales.float()[:, None, :]) + _GPTQ_ZERO
    values = levels.clamp(0, 2**_GPTQ_BITS - 1).to(torch.int64).reshape(in_features, out_features)
    zeros = torch.full((in_features // group_size, out_features), _GPTQ_ZERO - 1)
    return {
        "qweight": _pack_int32(values, dim=0),
        "qzeros": _pack_int32(zeros, dim=1),
        "scales": scales,
        "g_idx": (torch.arange(in_features) // group_size).to(torch.int32),
    }


def _pack_int32(values: Any, dim: int) -> Any:
    """Eight 4-bit ``values`` per int32 along ``dim``, the first in the lowest bits."""
    import torch

    moved = values.movedim(dim, -1)
    nibbles = moved.reshape(*moved.shape[:-1], -1, _GPTQ_PACK).to(torch.int64)
    shifts = torch.arange(_GPTQ_PACK, dtype=torch.int64) * _GPTQ_BITS
    words = (nibbles << shifts).sum(dim=-1)
    # Two's complement: words above 2**31 - 1 are negative int32 values.
    words = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)
    return words.movedim(-1, dim).contiguous()


def unpack_int32(words: Any, dim: int) -> Any:
    """The inverse of the GPTQ packing: eight 4-bit values per int32 along ``dim``."""
    import torch

    moved = words.movedim(dim, -1).to(torch.int64) & 0xFFFFFFFF
    shifts = torch.arange(_GPTQ_PACK, dtype=torch.int64) * _GPTQ_BITS
    values = (moved[..., None] >> shifts) & (2**_GPTQ_BITS - 1)
    return values.reshape(*moved.shape[:-1], -1).movedim(-1, dim)


def quantize_tensors(tensors: dict[str, Any], fmt: str) -> dict[str, Any]:
    """Checkpoint ``tensors`` with every quantized module's weight in format ``fmt``."""
    import torch

    if fmt not in FORMATS:
        raise ValueError(f"format={fmt!r}: use one of {', '.join(FORMATS)}")
    out = {}
    for name, tensor in tensors.items():
        prefix = name.removesuffix(".weight")
        if not is_quantized_weight(name):
            out[name] = tensor.to(torch.bfloat16)
        elif fmt == W8A8_INT8:
            out[name], out[f"{prefix}.weight_scale"] = int8_channelwise(tensor)
        else:
            out.update({f"{prefix}.{k}": v for k, v in gptq_int4(tensor).items()})
    return out


def quantize_checkpoint(checkpoint: str | Path, out: str | Path, fmt: str) -> Path:
    """Write float ``checkpoint`` quantized in format ``fmt`` (:data:`FORMATS`) to ``out``:
    ``config.json`` with its ``quantization_config``, one safetensors file, the tokenizer."""
    from safetensors.torch import load_file, save_file

    from spark2_5_dev.checkpoints import read_config, write_tokenizer

    checkpoint, out = Path(checkpoint), Path(out)
    config = read_config(checkpoint)
    if (checkpoint / "model.safetensors.index.json").exists():
        raise ValueError(f"{checkpoint}: quantize a single-file checkpoint")
    tensors = quantize_tensors(load_file(str(checkpoint / "model.safetensors")), fmt)
    out.mkdir(parents=True, exist_ok=True)
    config["quantization_config"] = COMPRESSED_TENSORS_W8A8 if fmt == W8A8_INT8 else GPTQ_CONFIG
    # vLLM's CPU kernels for both formats take 16-bit activations only.
    config["torch_dtype"] = "bfloat16"
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    save_file(
        {n: t.contiguous() for n, t in sorted(tensors.items())}, str(out / "model.safetensors")
    )
    write_tokenizer(out)
    return out
