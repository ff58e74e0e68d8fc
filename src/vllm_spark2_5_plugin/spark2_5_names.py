# SPDX-License-Identifier: Apache-2.0
"""The Spark2_5 checkpoint's naming facts, read by loading, the checkpoint checks and
the LoRA checks: tensor names and shapes, the packed parameters and their parts,
what stays unquantised, the decoder-layer pattern."""

from __future__ import annotations

import re

EMBEDDING = "model.embedding.weight"
# vLLM's LoRA layers wrap the layer they adapt; its parameters keep their names under it.
LORA_WRAPPED = ".base_layer."
# A decoder layer's names start so; group 1 is the layer index.
LAYER_PREFIX = re.compile(r"^model\.layers\.(\d+)\.")

# Checkpoint name (decoder layers as "layers.") -> its shape, as expressions of the config.
CHECKPOINT_SHAPES: dict[str, tuple[str, ...]] = {
    "model.embedding.weight": ("vocab_size", "hidden_size"),
    "lm_head.weight": ("vocab_size", "hidden_size"),
    "model.norm.weight": ("hidden_size",),
    "layers.input_layernorm.weight": ("hidden_size",),
    "layers.post_attention_layernorm.weight": ("hidden_size",),
    "layers.self_attn.q_k_v_proj.weight": (
        "(num_attention_heads + 2 * num_key_value_heads) * head_dim",
        "hidden_size",
    ),
    "layers.self_attn.q_proj.weight": ("num_attention_heads * head_dim", "hidden_size"),
    "layers.self_attn.k_proj.weight": ("num_key_value_heads * head_dim", "hidden_size"),
    "layers.self_attn.v_proj.weight": ("num_key_value_heads * head_dim", "hidden_size"),
    "layers.self_attn.g_proj.weight": ("num_attention_heads", "hidden_size"),
    "layers.self_attn.out_proj.weight": ("hidden_size", "num_attention_heads * head_dim"),
    "layers.mlp.gate_proj.weight": ("intermediate_size", "hidden_size"),
    "layers.mlp.up_proj.weight": ("intermediate_size", "hidden_size"),
    "layers.mlp.gate_up_proj.weight": ("2 * intermediate_size", "hidden_size"),
    "layers.mlp.down_proj.weight": ("hidden_size", "intermediate_size"),
}
# Layers built without the quantization config, so plain floating tensors in any checkpoint.
ALWAYS_UNQUANTIZED = (
    "model.norm.weight",
    "layers.input_layernorm.weight",
    "layers.post_attention_layernorm.weight",
    "layers.self_attn.g_proj.weight",
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
