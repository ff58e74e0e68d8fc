# SPDX-License-Identifier: Apache-2.0
"""What a Spark2_5 model refuses of the engine that builds it, each with the fix: a
tensor-parallel size its heads cannot be split across, a separate draft model over
sliding-window layers, EAGLE-3 hidden states it cannot give, a weight-update mode
that bypasses its update checks."""

from __future__ import annotations

from typing import Any

from vllm_spark2_5_plugin.spark2_5_config import SLIDING_ATTENTION, Spark2_5Config


def heads_per_rank(config: Spark2_5Config, tp_size: int) -> tuple[int, int]:
    """The query and KV heads of one tensor-parallel rank. KV heads are partitioned
    when there are enough of them, else replicated."""
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    if heads % tp_size:
        raise ValueError(
            f"num_attention_heads={heads} cannot be split across "
            f"tensor_parallel_size={tp_size}; use a tensor parallel size that divides it"
        )
    kv_divides = kv_heads % tp_size == 0 if kv_heads >= tp_size else tp_size % kv_heads == 0
    if not kv_divides:
        raise ValueError(
            f"num_key_value_heads={kv_heads} cannot be partitioned or replicated across "
            f"tensor_parallel_size={tp_size}; one of the two must divide the other"
        )
    return heads // tp_size, max(1, kv_heads // tp_size)


def refuse_draft_model_over_sliding_layers(speculative_config: Any) -> None:
    # A separate draft model over a target with sliding-window layers gives tokens the
    # target alone does not (measured on vLLM 0.32 CPU; vLLM refuses in-tree Gemma2's).
    if getattr(speculative_config, "method", None) != "draft_model":
        return
    target = getattr(speculative_config.target_model_config, "hf_config", None)
    if SLIDING_ATTENTION in getattr(target, "layer_types", ()):
        raise ValueError(
            'speculative_config method "draft_model" is not supported over Spark2_5 '
            "models with sliding-window layers: vLLM's separate draft model changes "
            'their greedy output. Use "eagle3", "eagle" or "ngram" instead'
        )


def eagle3_layers(layers: tuple[int, ...], num_hidden_layers: int, pp_size: int) -> tuple[int, ...]:
    """The layers whose input an EAGLE-3 head asks for, sorted, once each."""
    layers = tuple(sorted(set(layers)))
    if any(not 0 <= layer < num_hidden_layers for layer in layers):
        raise ValueError(
            f"EAGLE-3 asked Spark2_5 for the hidden states of layers {list(layers)}, but "
            f"it has layers 0 to {num_hidden_layers - 1}: set eagle_aux_hidden_state_layer_ids "
            "in the draft head's config to layers of this model"
        )
    if pp_size > 1:
        raise ValueError(
            "EAGLE-3 on Spark2_5 needs --pipeline-parallel-size 1: the draft head's "
            "hidden states are not passed between pipeline stages"
        )
    return layers


def refuse_direct_weight_updates(mode: str) -> None:
    """Refuse vLLM's direct reload (``VLLM_RELOAD_MODE=direct``): it writes each pushed
    tensor in place without ``load_weights``'s checks and session (no tensor checked
    before it loads, layers half updated, a refusal after vLLM re-laid the tensors
    out, with no finish), and NCCL's ``use_load_plan``, which needs it, skips
    ``load_weights`` after the first update."""
    if mode == "direct":
        raise ValueError(
            "VLLM_RELOAD_MODE=direct is not supported by Spark2_5: vLLM's direct reload "
            "bypasses its weight-update checks (each tensor checked before it loads, no "
            "layer left half updated, a refused update raised where the trainer sees it), "
            "and NCCL's use_load_plan needs it. Unset VLLM_RELOAD_MODE or set it to "
            "layerwise, the default; reload_weights and the weight-transfer engines then "
            "update the model as documented"
        )
