# SPDX-License-Identifier: Apache-2.0
"""The Spark2_5 checkpoint's naming facts, read by loading, the checkpoint checks and
the LoRA checks: tensor names and the shapes the config gives them, the packed
parameters and their parts, what stays unquantised, the decoder-layer pattern."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

EMBEDDING_MODULE = "model.embedding"
EMBEDDING = f"{EMBEDDING_MODULE}.weight"
LM_HEAD = "lm_head.weight"
# The head-wise output gate's projection: float in every checkpoint, quantized or not.
G_PROJ = ".g_proj."
# vLLM's LoRA layers wrap the layer they adapt; its parameters keep their names under it.
LORA_WRAPPED = ".base_layer."
# A decoder layer's names start so; group 1 is the layer index.
LAYER_PREFIX = re.compile(r"^model\.layers\.(\d+)\.")


@dataclass(frozen=True)
class Dim:
    """One dimension of a checkpoint tensor: as config.json states it (for errors) and
    its size under a config."""

    formula: str
    size: Callable[[Any], int]


VOCAB = Dim("vocab_size", lambda c: c.vocab_size)
HIDDEN = Dim("hidden_size", lambda c: c.hidden_size)
INTERMEDIATE = Dim("intermediate_size", lambda c: c.intermediate_size)
GATE_UP = Dim("2 * intermediate_size", lambda c: 2 * c.intermediate_size)
HEADS = Dim("num_attention_heads", lambda c: c.num_attention_heads)
Q = Dim("num_attention_heads * head_dim", lambda c: c.num_attention_heads * c.head_dim)
KV = Dim("num_key_value_heads * head_dim", lambda c: c.num_key_value_heads * c.head_dim)
QKV = Dim(
    "(num_attention_heads + 2 * num_key_value_heads) * head_dim",
    lambda c: (c.num_attention_heads + 2 * c.num_key_value_heads) * c.head_dim,
)

# Checkpoint name (decoder layers as "layers.") -> its shape.
CHECKPOINT_SHAPES: dict[str, tuple[Dim, ...]] = {
    EMBEDDING: (VOCAB, HIDDEN),
    LM_HEAD: (VOCAB, HIDDEN),
    "model.norm.weight": (HIDDEN,),
    "layers.input_layernorm.weight": (HIDDEN,),
    "layers.post_attention_layernorm.weight": (HIDDEN,),
    "layers.self_attn.q_k_v_proj.weight": (QKV, HIDDEN),
    "layers.self_attn.q_proj.weight": (Q, HIDDEN),
    "layers.self_attn.k_proj.weight": (KV, HIDDEN),
    "layers.self_attn.v_proj.weight": (KV, HIDDEN),
    f"layers.self_attn{G_PROJ}weight": (HEADS, HIDDEN),
    "layers.self_attn.out_proj.weight": (HIDDEN, Q),
    "layers.mlp.gate_proj.weight": (INTERMEDIATE, HIDDEN),
    "layers.mlp.up_proj.weight": (INTERMEDIATE, HIDDEN),
    "layers.mlp.gate_up_proj.weight": (GATE_UP, HIDDEN),
    "layers.mlp.down_proj.weight": (HIDDEN, INTERMEDIATE),
}
# Layers built without the quantization config, so plain floating tensors in any checkpoint.
ALWAYS_UNQUANTIZED = (
    "model.norm.weight",
    "layers.input_layernorm.weight",
    "layers.post_attention_layernorm.weight",
    f"layers.self_attn{G_PROJ}weight",
)

# Checkpoint name part -> (packed parameter name part, shard id). Dotted on both
# sides so ".up_proj." never matches inside ".gate_up_proj.".
STACKED_PARAMS = {
    ".q_proj.": (".q_k_v_proj.", "q"),
    ".k_proj.": (".q_k_v_proj.", "k"),
    ".v_proj.": (".q_k_v_proj.", "v"),
    ".gate_proj.": (".gate_up_proj.", 0),
    ".up_proj.": (".gate_up_proj.", 1),
}
# vLLM's packed module -> the modules a PEFT adapter of the released model targets
# (its attention has one fused q_k_v_proj; its MLP has gate_proj and up_proj).
PACKED_MODULES = {
    "q_k_v_proj": ["q_k_v_proj"],
    "gate_up_proj": ["gate_proj", "up_proj"],
}


def layer_generic(name: str) -> str:
    """``name`` with a decoder layer's ``model.layers.<i>.`` written ``layers.``: the
    key of :data:`CHECKPOINT_SHAPES` and :data:`ALWAYS_UNQUANTIZED`."""
    return LAYER_PREFIX.sub("layers.", name)


def packed_target(name: str) -> tuple[str, str | int | None]:
    """The parameter a checkpoint tensor loads into, and the shard id if it is one part."""
    for part, (packed_part, shard_id) in STACKED_PARAMS.items():
        if part in name:
            return name.replace(part, packed_part, 1), shard_id
    return name, None


def checkpoint_parts(target: str) -> dict[str | int, str]:
    """For a packed parameter, its shard ids and the checkpoint names that fill them."""
    return {
        shard_id: target.replace(packed_part, part, 1)
        for part, (packed_part, shard_id) in STACKED_PARAMS.items()
        if packed_part in target
    }


def module_of(param: str) -> str:
    """The module a parameter (or checkpoint tensor) name belongs to."""
    return param.rpartition(".")[0]
