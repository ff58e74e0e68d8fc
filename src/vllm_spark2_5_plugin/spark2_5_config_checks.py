# SPDX-License-Identifier: Apache-2.0
"""The checks of each ``config.json`` value of a Spark2_5 checkpoint.

A value the model cannot run fails at load with one :class:`Spark2_5ConfigError`
(a ``ValueError``) that names the key, the value and what is allowed, instead of
surfacing later inside the model. Nothing is silently dropped or changed:

* **RoPE is set per layer type.** ``rope_parameters`` holds one object per
  layer type (``"sliding_attention"``, ``"full_attention"``) with
  ``rope_theta``, ``partial_rotary_factor`` and ``rope_type`` (``"default"``
  only), and nothing else.
* **RoPE scaling is refused.** ``"rope_scaling": null`` (or ``{}``) means no
  scaling. Any other ``rope_scaling`` is an error: transformers' generic rule
  would let it *replace* the per-layer-type ``rope_parameters`` with one flat
  dict for every layer, dropping the full-attention layers' own theta and
  partial rotary factor (5e6 and 0.25 in the 4B), and the Spark2_5 model was
  released and validated with plain RoPE only. Serving a scaled Spark2_5 needs
  its HF implementation to compare against first.
* **Legacy top-level ``rope_theta``/``partial_rotary_factor``** are honoured the
  way transformers' RoPE standardisation honours them: they fill the
  ``rope_parameters`` entries that lack the key. Where every entry sets its
  own value (the 4B does; so do the defaults), the top-level value would be
  ignored, and that is an error. Other spellings vLLM knows from other models
  (``rotary_emb_base``, ``rotary_pct``, ``rotary_emb_fraction``) are refused.
* **Numbers are finite and bounded.** Sizes, token ids and window are
  integers in ``[1, 2**31 - 1]`` (vLLM keeps token ids, positions and sequence
  lengths in int32). ``rope_theta`` is in ``(1, 1e12]``: above 1 so the
  frequencies fall with the dimension index as RoPE needs; the upper bound is
  a sanity bound 2*10^5 times the 4B's largest theta (5e6) that catches a
  value mistyped by orders of magnitude. ``rms_norm_eps`` is in
  ``[2**-126, 1]``: vLLM adds it in float32, where anything smaller is
  subnormal or zero (an all-zero row then divides by zero), and an epsilon
  above 1 outweighs the mean square of unit-scale activations so the norm no
  longer normalises.
* **``torch_dtype``/``dtype``** is one of the floating types vLLM serves
  (``bfloat16``, ``float16``/``half``, ``float32``/``float``) or absent.
"""

from __future__ import annotations

import math
from typing import Any

SLIDING_ATTENTION = "sliding_attention"
FULL_ATTENTION = "full_attention"
LAYER_TYPES = (SLIDING_ATTENTION, FULL_ATTENTION)
GATE_ACT_MODES = ("sigmoid", "silu")

DEFAULT_ROPE_THETA = 10_000
# The released 4B's RoPE: each layer type rotates with its own parameters.
DEFAULT_ROPE_PARAMETERS = {
    FULL_ATTENTION: {"rope_theta": 5_000_000, "partial_rotary_factor": 0.25},
    SLIDING_ATTENTION: {"rope_theta": 10_000, "partial_rotary_factor": 1.0},
}
# The numbers of a RoPE entry; at the top level (legacy) they fill the entries lacking them.
ROPE_VALUE_KEYS = ("rope_theta", "partial_rotary_factor")
ROPE_ENTRY_KEYS = (*ROPE_VALUE_KEYS, "rope_type", "type")
# RoPE spellings of other models that vLLM would otherwise pick up from any config.
FOREIGN_ROPE_KEYS = ("rotary_emb_base", "rotary_pct", "rotary_emb_fraction")

MAX_SIZE = 2**31 - 1  # vLLM keeps token ids, positions and sequence lengths in int32
ROPE_THETA_RANGE = (1.0, 1e12)  # exclusive low, inclusive high; see the module docstring
RMS_NORM_EPS_RANGE = (2.0**-126, 1.0)  # float32's smallest normal number up to 1
SIZE_KEYS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "max_position_embeddings",
)
# The names vLLM's --dtype takes for the floating types it serves.
DTYPE_NAMES = ("bfloat16", "float16", "float32", "half", "float")


class Spark2_5ConfigError(ValueError):
    """A ``config.json`` value Spark2_5 cannot run; the message names key, value and fix."""

    def __init__(self, key: str, value: Any, allowed: str) -> None:
        super().__init__(f"Spark2_5 config: {key}={value!r} is invalid; {allowed}")
        self.key = key
        self.value = value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _require_size(key: str, value: Any) -> None:
    if not _is_int(value) or not 0 < value <= MAX_SIZE:
        raise Spark2_5ConfigError(
            key, value, f"it must be a positive integer, at most 2**31 - 1 = {MAX_SIZE}"
        )


def _require_bool(key: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise Spark2_5ConfigError(key, value, "it must be true or false")


def _require_in_range(key: str, value: Any, low: float, high: float, low_inclusive: bool) -> None:
    """A finite number in ``[low, high]`` (``(low, high]`` unless ``low_inclusive``)."""
    in_range = _is_number(value) and math.isfinite(value) and value <= high
    if not (in_range and (low <= value if low_inclusive else low < value)):
        interval = f"{'[' if low_inclusive else '('}{low:g}, {high:g}]"
        raise Spark2_5ConfigError(key, value, f"it must be a finite number in {interval}")


def _require_rope_value(key: str, name: str, value: Any) -> None:
    """``rope_theta`` or ``partial_rotary_factor`` (``name``), reported as ``key``."""
    if name == "rope_theta":
        _require_in_range(key, value, *ROPE_THETA_RANGE, low_inclusive=False)
    else:
        _require_in_range(key, value, 0.0, 1.0, low_inclusive=False)


def _require_token_id(key: str, value: Any, vocab_size: int) -> None:
    ids = value if isinstance(value, list) and key == "eos_token_id" else [value]
    if value is None or (ids and all(_is_int(i) and 0 <= i < vocab_size for i in ids)):
        return
    what = "an integer or a non-empty list of integers" if key == "eos_token_id" else "an integer"
    raise Spark2_5ConfigError(
        key, value, f"it must be null or {what} in [0, vocab_size) = [0, {vocab_size})"
    )


def _require_dtype(key: str, value: Any) -> None:
    # A torch.dtype when the config is built in code; JSON gives a string.
    name = value if isinstance(value, str) else str(value).removeprefix("torch.")
    if name not in DTYPE_NAMES:
        raise Spark2_5ConfigError(
            key,
            value,
            f"allowed values are {', '.join(map(repr, DTYPE_NAMES))} (or leave it out)",
        )


def _require_rope_entry_object(layer_type: str, entry: Any) -> None:
    if not isinstance(entry, dict):
        raise Spark2_5ConfigError(
            f"rope_parameters[{layer_type!r}]",
            entry,
            "each layer type's entry must be an object like "
            '{"rope_theta": 10000, "partial_rotary_factor": 1.0}',
        )


def _validate_rope_entry(layer_type: str, entry: dict[str, Any], head_dim: int) -> None:
    key = f"rope_parameters[{layer_type!r}]"
    for entry_key, value in entry.items():
        if entry_key not in ROPE_ENTRY_KEYS:
            raise Spark2_5ConfigError(
                f"{key}[{entry_key!r}]",
                value,
                f"an entry takes only {', '.join(ROPE_ENTRY_KEYS[:3])}: remove it",
            )
        if entry_key in ("rope_type", "type") and value != "default":
            raise Spark2_5ConfigError(
                f"{key}[{entry_key!r}]", value, 'Spark2_5 uses plain RoPE: set it to "default"'
            )
        if entry_key in ROPE_VALUE_KEYS:
            _require_rope_value(f"{key}[{entry_key!r}]", entry_key, value)
    factor = entry.get("partial_rotary_factor", 1.0)
    rotary_dim = int(head_dim * factor)
    if rotary_dim < 2 or rotary_dim % 2:
        raise Spark2_5ConfigError(
            f"{key}['partial_rotary_factor']",
            factor,
            f"int(head_dim * partial_rotary_factor) = int({head_dim} * {factor}) = {rotary_dim} "
            "rotary dims; it must be an even number >= 2",
        )


def _rope_parameters_by_layer_type(rope_parameters: Any, used_types: list[str]) -> dict:
    """A copy of ``rope_parameters`` after checking it is an object keyed by layer type."""
    if rope_parameters is None:
        return {layer_type: dict(entry) for layer_type, entry in DEFAULT_ROPE_PARAMETERS.items()}
    if not isinstance(rope_parameters, dict):
        raise Spark2_5ConfigError(
            "rope_parameters",
            rope_parameters,
            f"it must be an object keyed by layer type ({', '.join(used_types)})",
        )
    for key, value in rope_parameters.items():
        if key not in LAYER_TYPES:
            raise Spark2_5ConfigError(
                f"rope_parameters[{key!r}]",
                value,
                f"rope_parameters is keyed by layer type ({', '.join(map(repr, LAYER_TYPES))}); "
                "RoPE settings such as rope_theta go inside each layer type's entry",
            )
        _require_rope_entry_object(key, value)
    for layer_type in used_types:
        if layer_type not in rope_parameters:
            raise Spark2_5ConfigError(
                "rope_parameters",
                rope_parameters,
                f"it has no entry for {layer_type!r}, which layer_types uses; add "
                f'"{layer_type}": {{"rope_theta": ..., "partial_rotary_factor": ...}}',
            )
    return {layer_type: dict(entry) for layer_type, entry in rope_parameters.items()}


def _apply_legacy_rope_keys(rope_parameters: dict, legacy: dict[str, Any]) -> None:
    """Fill the entries lacking ``rope_theta``/``partial_rotary_factor`` from top-level keys."""
    for key, value in legacy.items():
        if value is None:
            continue
        _require_rope_value(key, key, value)
        lacking = [entry for entry in rope_parameters.values() if key not in entry]
        if not lacking:
            raise Spark2_5ConfigError(
                key,
                value,
                f"every rope_parameters entry sets its own {key}, so this top-level value "
                "would be ignored; remove it, or set it in rope_parameters[<layer type>]",
            )
        for entry in lacking:
            entry[key] = value


def _refuse_rope_scaling(rope_scaling: Any) -> None:
    if rope_scaling is not None and rope_scaling != {}:
        raise Spark2_5ConfigError(
            "rope_scaling",
            rope_scaling,
            "Spark2_5 applies plain RoPE per layer type and does not support RoPE scaling; "
            "set it to null or remove it (per-layer RoPE settings belong in rope_parameters)",
        )


def checked_rope_parameters(
    rope_parameters: Any, rope_scaling: Any, legacy: dict[str, Any], config: Any
) -> dict[str, dict[str, Any]]:
    """``rope_parameters`` by layer type, checked, with the legacy top-level keys
    (``legacy``: ``rope_theta``, ``partial_rotary_factor``) filled in, for ``config``'s
    layer types and head_dim."""
    _refuse_rope_scaling(rope_scaling)
    used_types = [t for t in LAYER_TYPES if t in config.layer_types]
    by_layer_type = _rope_parameters_by_layer_type(rope_parameters, used_types)
    _apply_legacy_rope_keys(by_layer_type, legacy)
    for layer_type, entry in by_layer_type.items():
        _validate_rope_entry(layer_type, entry, config.head_dim)
    return by_layer_type


def check_values(
    config: Any, tie_word_embeddings: Any, token_ids: dict[str, Any], kwargs: dict[str, Any]
) -> None:
    """Refuse the first value of ``config`` (a ``Spark2_5Config`` being built) that
    Spark2_5 cannot run; ``kwargs`` are the keys the class does not name."""
    for key in SIZE_KEYS:
        _require_size(key, getattr(config, key))
    for key in ("headwise_attn_output_gate", "attention_bias", "mlp_bias"):
        _require_bool(key, getattr(config, key))
    _require_bool("tie_word_embeddings", tie_word_embeddings)
    for key, value in token_ids.items():
        _require_token_id(key, value, config.vocab_size)
    for key in ("torch_dtype", "dtype"):
        if kwargs.get(key) is not None:
            _require_dtype(key, kwargs[key])
    for key in FOREIGN_ROPE_KEYS:
        if key in kwargs:
            raise Spark2_5ConfigError(
                key, kwargs[key], "Spark2_5 reads RoPE settings from rope_parameters only"
            )

    if config.num_attention_heads % config.num_key_value_heads:
        raise Spark2_5ConfigError(
            "num_key_value_heads",
            config.num_key_value_heads,
            f"it must divide num_attention_heads={config.num_attention_heads} "
            "(each KV head serves a whole group of query heads)",
        )
    if config.hidden_act != "gelu":
        raise Spark2_5ConfigError(
            "hidden_act", config.hidden_act, 'Spark2_5 uses exact (erf) GELU: set it to "gelu"'
        )
    if config.gate_attn_act_mode not in GATE_ACT_MODES:
        raise Spark2_5ConfigError(
            "gate_attn_act_mode",
            config.gate_attn_act_mode,
            f"allowed values are {', '.join(map(repr, GATE_ACT_MODES))}",
        )
    for key in ("attention_bias", "mlp_bias"):
        if getattr(config, key):
            raise Spark2_5ConfigError(
                key, True, "Spark2_5 projections have no bias: set it to false"
            )
    _require_in_range("rms_norm_eps", config.rms_norm_eps, *RMS_NORM_EPS_RANGE, low_inclusive=True)
    _check_layer_types(config)


def _check_layer_types(config: Any) -> None:
    layer_types = config.layer_types
    if not isinstance(layer_types, list) or len(layer_types) != config.num_hidden_layers:
        raise Spark2_5ConfigError(
            "layer_types",
            layer_types,
            f"it must be a list with one entry per layer "
            f"(num_hidden_layers={config.num_hidden_layers})",
        )
    for index, layer_type in enumerate(layer_types):
        if layer_type not in LAYER_TYPES:
            raise Spark2_5ConfigError(
                f"layer_types[{index}]",
                layer_type,
                f"allowed values are {', '.join(map(repr, LAYER_TYPES))}",
            )
    # vLLM reads sliding_window whatever the layer types, so a set value must be sane.
    if SLIDING_ATTENTION in layer_types or config.sliding_window is not None:
        _require_size("sliding_window", config.sliding_window)
