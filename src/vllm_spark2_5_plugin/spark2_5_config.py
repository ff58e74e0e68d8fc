"""The ``spark2_5`` configuration (``Spark2_5Config``).

Registered with vLLM's own config table by the carrier, so a Spark2_5
checkpoint loads without ``--trust-remote-code``: the ``auto_map`` in its
``config.json`` is never followed and none of its remote code runs.

Every key of the released 4B ``config.json`` is honoured. A value the model
cannot run fails here, at load, with one error that names the key, the value
and what is allowed, instead of surfacing later as a shape error.

Written as a classic ``__init__`` config so it behaves the same under
transformers 4.x (where ``PretrainedConfig.__init__`` owns
``tie_word_embeddings`` and would reset it to ``True`` unless forwarded) and
5.x (a dataclass base that keeps unknown keyword arguments as attributes).
"""

from __future__ import annotations

from typing import Any

from transformers import PretrainedConfig

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


class Spark2_5ConfigError(ValueError):
    """A ``config.json`` value Spark2_5 cannot run; the message names key, value and fix."""

    def __init__(self, key: str, value: Any, allowed: str) -> None:
        super().__init__(f"Spark2_5 config: {key}={value!r} is invalid; {allowed}")
        self.key = key
        self.value = value


def default_layer_types(num_hidden_layers: int) -> list[str]:
    """Three sliding-window layers, then one full-attention layer, repeated."""
    return [
        FULL_ATTENTION if (index + 1) % 4 == 0 else SLIDING_ATTENTION
        for index in range(num_hidden_layers)
    ]


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _require_positive_int(key: str, value: Any) -> None:
    if not _is_int(value) or value <= 0:
        raise Spark2_5ConfigError(key, value, "it must be a positive integer")


def _require_bool(key: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise Spark2_5ConfigError(key, value, "it must be true or false")


def _validate_rope_entry(layer_type: str, entry: Any, head_dim: int) -> None:
    key = f"rope_parameters[{layer_type!r}]"
    if not isinstance(entry, dict):
        raise Spark2_5ConfigError(
            key,
            entry,
            "each used layer type needs an object like "
            '{"rope_theta": 10000, "partial_rotary_factor": 1.0}',
        )
    rope_type = entry.get("rope_type", entry.get("type", "default"))
    if rope_type != "default":
        raise Spark2_5ConfigError(
            f"{key}['rope_type']", rope_type, 'Spark2_5 uses plain RoPE: set it to "default"'
        )
    theta = entry.get("rope_theta", DEFAULT_ROPE_THETA)
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or theta <= 0:
        raise Spark2_5ConfigError(f"{key}['rope_theta']", theta, "it must be a positive number")
    factor = entry.get("partial_rotary_factor", 1.0)
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not 0 < factor <= 1:
        raise Spark2_5ConfigError(
            f"{key}['partial_rotary_factor']", factor, "it must be a number in (0, 1]"
        )
    rotary_dim = int(head_dim * factor)
    if rotary_dim < 2 or rotary_dim % 2:
        raise Spark2_5ConfigError(
            f"{key}['partial_rotary_factor']",
            factor,
            f"int(head_dim * partial_rotary_factor) = int({head_dim} * {factor}) = {rotary_dim} "
            "rotary dims; it must be an even number >= 2",
        )


class Spark2_5Config(PretrainedConfig):
    """Configuration of ``Spark2_5ForCausalLM`` (``model_type: spark2_5``).

    Defaults (used only for keys a ``config.json`` leaves out) follow the
    original Spark2_5 configuration; the released 4B sets every key.
    """

    model_type = "spark2_5"

    def __init__(
        self,
        vocab_size: int = 131072,
        hidden_size: int = 2048,
        intermediate_size: int = 6656,
        num_hidden_layers: int = 28,
        num_attention_heads: int = 8,
        num_key_value_heads: int = 2,
        head_dim: int = 256,
        hidden_act: str = "gelu",
        max_position_embeddings: int = 8192,
        initializer_range: float = 0.02,
        rms_norm_eps: float = 1e-6,
        use_cache: bool = True,
        layer_types: list[str] | None = None,
        sliding_window: int | None = 512,
        rope_parameters: dict[str, Any] | None = None,
        headwise_attn_output_gate: bool = True,
        gate_attn_act_mode: str = "sigmoid",
        attention_bias: bool = False,
        mlp_bias: bool = False,
        attention_dropout: float = 0.0,
        tie_word_embeddings: bool = True,
        bos_token_id: int | None = 0,
        eos_token_id: int | list[int] | None = 1,
        pad_token_id: int | None = 2,
        **kwargs: Any,
    ) -> None:
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads
        self.head_dim = head_dim
        self.hidden_act = hidden_act
        self.max_position_embeddings = max_position_embeddings
        self.initializer_range = initializer_range
        self.rms_norm_eps = rms_norm_eps
        self.use_cache = use_cache
        self.layer_types = (
            default_layer_types(num_hidden_layers)
            if layer_types is None and _is_int(num_hidden_layers)
            else layer_types
        )
        self.sliding_window = sliding_window
        self.rope_parameters = (
            {layer_type: dict(entry) for layer_type, entry in DEFAULT_ROPE_PARAMETERS.items()}
            if rope_parameters is None
            else rope_parameters
        )
        self.headwise_attn_output_gate = headwise_attn_output_gate
        self.gate_attn_act_mode = gate_attn_act_mode
        self.attention_bias = attention_bias
        self.mlp_bias = mlp_bias
        self.attention_dropout = attention_dropout
        # Checked before the base class runs its own (less specific) validators.
        self._validate(tie_word_embeddings)
        super().__init__(
            bos_token_id=bos_token_id,
            eos_token_id=eos_token_id,
            pad_token_id=pad_token_id,
            tie_word_embeddings=tie_word_embeddings,
            **kwargs,
        )

    def _validate(self, tie_word_embeddings: Any) -> None:
        for key in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "max_position_embeddings",
        ):
            _require_positive_int(key, getattr(self, key))
        for key in ("headwise_attn_output_gate", "attention_bias", "mlp_bias"):
            _require_bool(key, getattr(self, key))
        _require_bool("tie_word_embeddings", tie_word_embeddings)

        if self.num_attention_heads % self.num_key_value_heads:
            raise Spark2_5ConfigError(
                "num_key_value_heads",
                self.num_key_value_heads,
                f"it must divide num_attention_heads={self.num_attention_heads} "
                "(each KV head serves a whole group of query heads)",
            )
        if self.hidden_act != "gelu":
            raise Spark2_5ConfigError(
                "hidden_act", self.hidden_act, 'Spark2_5 uses exact (erf) GELU: set it to "gelu"'
            )
        if self.gate_attn_act_mode not in GATE_ACT_MODES:
            raise Spark2_5ConfigError(
                "gate_attn_act_mode",
                self.gate_attn_act_mode,
                f"allowed values are {', '.join(map(repr, GATE_ACT_MODES))}",
            )
        for key in ("attention_bias", "mlp_bias"):
            if getattr(self, key):
                raise Spark2_5ConfigError(
                    key, True, "Spark2_5 projections have no bias: set it to false"
                )
        if isinstance(self.rms_norm_eps, bool) or not (
            isinstance(self.rms_norm_eps, (int, float)) and self.rms_norm_eps > 0
        ):
            raise Spark2_5ConfigError("rms_norm_eps", self.rms_norm_eps, "it must be > 0")

        layer_types = self.layer_types
        if not isinstance(layer_types, list) or len(layer_types) != self.num_hidden_layers:
            raise Spark2_5ConfigError(
                "layer_types",
                layer_types,
                f"it must be a list with one entry per layer "
                f"(num_hidden_layers={self.num_hidden_layers})",
            )
        for index, layer_type in enumerate(layer_types):
            if layer_type not in LAYER_TYPES:
                raise Spark2_5ConfigError(
                    f"layer_types[{index}]",
                    layer_type,
                    f"allowed values are {', '.join(map(repr, LAYER_TYPES))}",
                )
        used_types = [t for t in LAYER_TYPES if t in layer_types]
        if SLIDING_ATTENTION in used_types:
            _require_positive_int("sliding_window", self.sliding_window)

        rope_parameters = self.rope_parameters
        if not isinstance(rope_parameters, dict):
            raise Spark2_5ConfigError(
                "rope_parameters",
                rope_parameters,
                f"it must be an object keyed by layer type ({', '.join(used_types)})",
            )
        for layer_type in used_types:
            if layer_type not in rope_parameters:
                raise Spark2_5ConfigError(
                    "rope_parameters",
                    rope_parameters,
                    f"it has no entry for {layer_type!r}, which layer_types uses; add "
                    f'"{layer_type}": {{"rope_theta": ..., "partial_rotary_factor": ...}}',
                )
            _validate_rope_entry(layer_type, rope_parameters[layer_type], self.head_dim)

    def convert_rope_params_to_dict(self, **kwargs: Any) -> dict[str, Any]:
        """Complete each layer type's RoPE entry; transformers 5.x calls this from ``__init__``.

        Replaces the base class's version: some releases of it (5.17) put a
        ``rope_theta`` next to the layer-type entries, which their own
        ``validate_rope`` then fails on. The entries are already validated.
        """
        for entry in self.rope_parameters.values():
            entry.setdefault("rope_type", entry.get("type", "default"))
            entry.setdefault("rope_theta", DEFAULT_ROPE_THETA)
        return kwargs

    def rope_parameters_for(self, layer_type: str) -> dict[str, Any]:
        """RoPE theta and rotary fraction of one layer type, with the defaults filled in."""
        entry = self.rope_parameters[layer_type]
        return {
            "rope_theta": entry.get("rope_theta", DEFAULT_ROPE_THETA),
            "partial_rotary_factor": entry.get("partial_rotary_factor", 1.0),
        }
