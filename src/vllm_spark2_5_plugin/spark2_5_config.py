# SPDX-License-Identifier: Apache-2.0
"""The ``spark2_5`` configuration (``Spark2_5Config``).

Registered with vLLM's own config table by the carrier, so a Spark2_5
checkpoint loads without ``--trust-remote-code``: the ``auto_map`` in its
``config.json`` is never followed and none of its remote code runs. Every key
of the released 4B ``config.json`` is honoured; every value is checked
(:mod:`spark2_5_config_checks` says how).

Written as a classic ``__init__`` config so it behaves the same under
transformers 4.x (where ``PretrainedConfig.__init__`` owns
``tie_word_embeddings`` and would reset it to ``True`` unless forwarded) and
5.x (a dataclass base that keeps unknown keyword arguments as attributes).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

from transformers import PretrainedConfig

from vllm_spark2_5_plugin.spark2_5_config_checks import (
    DEFAULT_ROPE_THETA,
    FULL_ATTENTION,
    LAYER_TYPES,
    SIZE_KEYS,
    SLIDING_ATTENTION,
    Spark2_5ConfigError,
    check_values,
    checked_rope_parameters,
)

# Importers read these here, beside the class: the layer types and the config error.
__all__ = [
    "FULL_ATTENTION",
    "LAYER_TYPES",
    "SIZE_KEYS",
    "SLIDING_ATTENTION",
    "Spark2_5Config",
    "Spark2_5ConfigError",
    "default_layer_types",
]


def default_layer_types(num_hidden_layers: Any, layer_types: Any = None) -> Any:
    """``layer_types`` where given, else three sliding-window layers, then one
    full-attention layer, repeated (a bad ``num_hidden_layers`` is left to the checks)."""
    counted = isinstance(num_hidden_layers, int) and not isinstance(num_hidden_layers, bool)
    if layer_types is not None or not counted:
        return layer_types
    return [
        FULL_ATTENTION if (index + 1) % 4 == 0 else SLIDING_ATTENTION
        for index in range(num_hidden_layers)
    ]


class Spark2_5Config(PretrainedConfig):
    """Configuration of ``Spark2_5ForCausalLM`` (``model_type: spark2_5``).

    Defaults (used only for keys a ``config.json`` leaves out) follow the
    original Spark2_5 configuration; the released 4B sets every key.
    """

    model_type = "spark2_5"
    # Checks of the local folder a config is read from (each raises on what it
    # finds), run by from_dict; the carrier adds the checkpoint's file check
    # when it registers the config.
    folder_checks: ClassVar[tuple[Callable[[Path], None], ...]] = ()

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
        # Legacy RoPE keys, taken here so the base class never sees them (its
        # rope_scaling setter would replace rope_parameters wholesale).
        rope_scaling: Any = None,
        rope_theta: Any = None,
        partial_rotary_factor: Any = None,
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
        self.layer_types = default_layer_types(num_hidden_layers, layer_types)
        self.sliding_window = sliding_window
        self.headwise_attn_output_gate = headwise_attn_output_gate
        self.gate_attn_act_mode = gate_attn_act_mode
        self.attention_bias = attention_bias
        self.mlp_bias = mlp_bias
        self.attention_dropout = attention_dropout
        # Checked before the base class runs its own (less specific) validators.
        token_ids = dict(
            bos_token_id=bos_token_id, eos_token_id=eos_token_id, pad_token_id=pad_token_id
        )
        check_values(self, tie_word_embeddings, token_ids, kwargs)
        legacy = {"rope_theta": rope_theta, "partial_rotary_factor": partial_rotary_factor}
        self.rope_parameters = checked_rope_parameters(rope_parameters, rope_scaling, legacy, self)
        super().__init__(tie_word_embeddings=tie_word_embeddings, **token_ids, **kwargs)

    @classmethod
    def from_dict(cls, config_dict: dict[str, Any], **kwargs: Any) -> Any:
        """The config from a ``config.json``'s dict, as ``PretrainedConfig`` builds it.

        When ``AutoConfig`` (which vLLM uses) loads it from a local folder, the
        :attr:`folder_checks` run on that folder too.
        """
        loaded = super().from_dict(config_dict, **kwargs)
        folder = kwargs.get("name_or_path")
        if folder is not None and os.path.isdir(folder):
            for check in cls.folder_checks:
                check(Path(folder))
        return loaded

    def convert_rope_params_to_dict(self, **kwargs: Any) -> dict[str, Any]:
        """Fill each layer type's RoPE defaults in place; return ``kwargs`` untouched.

        transformers 5.x calls this from ``__init__``; its own version (5.17, the
        release vLLM 0.31 resolves) writes a top-level ``rope_theta`` next to the
        layer-type entries, which its ``validate_rope`` then rejects. transformers
        4.x has no such method and never calls this. Complete entries also leave
        nothing for vLLM's RoPE patching to fill in.
        """
        for entry in self.rope_parameters.values():
            entry.setdefault("rope_type", entry.get("type", "default"))
            entry.setdefault("rope_theta", DEFAULT_ROPE_THETA)
            entry.setdefault("partial_rotary_factor", 1.0)
        return kwargs

    def rope_parameters_for(self, layer_type: str) -> dict[str, Any]:
        """RoPE theta and rotary fraction of one layer type, with the defaults filled in."""
        entry = self.rope_parameters[layer_type]
        return {
            "rope_theta": entry.get("rope_theta", DEFAULT_ROPE_THETA),
            "partial_rotary_factor": entry.get("partial_rotary_factor", 1.0),
        }
