"""One Spark2_5 layer's packed projections as vLLM builds them, and checkpoint weights
for them, for tests of ``compat.load_weights``."""

from __future__ import annotations

import torch
from torch import nn

HIDDEN, HEAD_DIM, HEADS, KV_HEADS, INTERMEDIATE = 64, 32, 2, 1, 96


class Layer(nn.Module):
    """The packed projections of one Spark2_5 layer, as vLLM builds them."""

    def __init__(self) -> None:
        from vllm.model_executor.layers.layernorm import RMSNorm
        from vllm.model_executor.layers.linear import (
            MergedColumnParallelLinear,
            QKVParallelLinear,
        )

        super().__init__()
        self.self_attn = nn.Module()
        self.self_attn.q_k_v_proj = QKVParallelLinear(
            HIDDEN, HEAD_DIM, HEADS, KV_HEADS, bias=False, prefix="layer.self_attn.q_k_v_proj"
        )
        self.mlp = nn.Module()
        self.mlp.gate_up_proj = MergedColumnParallelLinear(
            HIDDEN, [INTERMEDIATE] * 2, bias=False, prefix="layer.mlp.gate_up_proj"
        )
        self.norm = RMSNorm(HIDDEN)


def split_weights(seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return torch.randn(*shape, generator=generator)

    return {
        "self_attn.q_proj.weight": rand(HEADS * HEAD_DIM, HIDDEN),
        "self_attn.k_proj.weight": rand(KV_HEADS * HEAD_DIM, HIDDEN),
        "self_attn.v_proj.weight": rand(KV_HEADS * HEAD_DIM, HIDDEN),
        "mlp.gate_proj.weight": rand(INTERMEDIATE, HIDDEN),
        "mlp.up_proj.weight": rand(INTERMEDIATE, HIDDEN),
        "norm.weight": rand(HIDDEN),
    }


def expected_packed(weights):
    qkv = torch.cat([weights[f"self_attn.{p}_proj.weight"] for p in "qkv"])
    gate_up = torch.cat([weights["mlp.gate_proj.weight"], weights["mlp.up_proj.weight"]])
    return qkv, gate_up


LOADED = {"self_attn.q_k_v_proj.weight", "mlp.gate_up_proj.weight", "norm.weight"}
