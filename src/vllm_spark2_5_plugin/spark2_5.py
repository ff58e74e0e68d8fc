# SPDX-License-Identifier: Apache-2.0
"""Inference-only Spark2_5 model (``Spark2_5ForCausalLM``) for vLLM.

A pre-norm decoder with hybrid attention: each layer is sliding-window or full
attention (``config.layer_types``) with its own partial neox RoPE, and each
attention head's output is scaled by a learned gate ``act(g_proj(x))`` before
the output projection. The MLP is ``down(gelu(gate(x)) * up(x))`` with exact
GELU. Parameter names follow the checkpoint (``model.embedding``,
``self_attn.q_k_v_proj``, ``self_attn.g_proj``, ``self_attn.out_proj``); the
checkpoint's separate ``gate_proj``/``up_proj`` (and re-exported separate
``q_proj``/``k_proj``/``v_proj``) load into shards of the packed projections.
"""

from collections.abc import Iterable
from itertools import islice
from typing import ClassVar

import torch
from torch import nn
from vllm.compilation.decorators import support_torch_compile
from vllm.config import CacheConfig, VllmConfig
from vllm.distributed import get_pp_group, get_tensor_model_parallel_world_size
from vllm.model_executor.layers.activation import GeluAndMul
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.linear import (
    ColumnParallelLinear,
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
)
from vllm.model_executor.layers.logits_processor import LogitsProcessor
from vllm.model_executor.layers.quantization import QuantizationConfig
from vllm.model_executor.layers.vocab_parallel_embedding import (
    ParallelLMHead,
    VocabParallelEmbedding,
)
from vllm.model_executor.models.interfaces import (
    SupportsEagle,
    SupportsEagle3,
    SupportsLoRA,
    SupportsPP,
    SupportsQuant,
)
from vllm.model_executor.models.utils import (
    PPMissingLayer,
    extract_layer_index,
    make_empty_intermediate_tensors_factory,
    make_layers,
    maybe_prefix,
)
from vllm.sequence import IntermediateTensors

from vllm_spark2_5_plugin import compat, cpu_platform, host_hooks
from vllm_spark2_5_plugin.settings import check_finite_requested
from vllm_spark2_5_plugin.spark2_5_checkpoint import TensorChecks
from vllm_spark2_5_plugin.spark2_5_config import SLIDING_ATTENTION, Spark2_5Config
from vllm_spark2_5_plugin.spark2_5_engine_checks import (
    eagle3_layers,
    heads_per_rank,
    refuse_direct_weight_updates,
    refuse_draft_model_over_sliding_layers,
)
from vllm_spark2_5_plugin.spark2_5_loading import CheckpointLoader
from vllm_spark2_5_plugin.spark2_5_lora import AdapterChecks
from vllm_spark2_5_plugin.spark2_5_names import PACKED_MODULES, STACKED_PARAMS
from vllm_spark2_5_plugin.spark2_5_ops import Spark2_5HeadGate, finite
from vllm_spark2_5_plugin.spark2_5_updates import WeightUpdates

Attention = compat.attention_cls()
LocalArgmaxMixin = compat.local_argmax_mixin()


class Spark2_5MLP(nn.Module):
    def __init__(
        self,
        hidden_size: int,
        intermediate_size: int,
        quant_config: QuantizationConfig | None = None,
        prefix: str = "",
    ) -> None:
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(
            hidden_size,
            [intermediate_size] * 2,
            bias=False,
            quant_config=quant_config,
            prefix=f"{prefix}.gate_up_proj",
        )
        self.down_proj = RowParallelLinear(
            intermediate_size,
            hidden_size,
            bias=False,
            quant_config=quant_config,
            prefix=f"{prefix}.down_proj",
        )
        # The reference raises unless hidden_act == "gelu": erf GELU, not tanh.
        self.act_fn = GeluAndMul(approximate="none")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up, _ = self.gate_up_proj(x)
        x, _ = self.down_proj(self.act_fn(gate_up))
        return x


class Spark2_5Attention(nn.Module):
    def __init__(
        self,
        config: Spark2_5Config,
        layer_type: str,
        max_position: int,
        cache_config: CacheConfig | None = None,
        quant_config: QuantizationConfig | None = None,
        prefix: str = "",
    ) -> None:
        super().__init__()
        tp_size = get_tensor_model_parallel_world_size()
        self.num_heads, self.num_kv_heads = heads_per_rank(config, tp_size)
        self.head_dim = config.head_dim
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        total_heads = config.num_attention_heads
        self.q_k_v_proj = QKVParallelLinear(
            config.hidden_size,
            self.head_dim,
            total_heads,
            config.num_key_value_heads,
            bias=False,
            quant_config=quant_config,
            prefix=f"{prefix}.q_k_v_proj",
        )
        self.g_proj = None
        if config.headwise_attn_output_gate:
            # One gate per head, sharded like the query heads. Left unquantised: it
            # is tiny and its output feeds fp32 gate math.
            self.g_proj = ColumnParallelLinear(
                config.hidden_size, total_heads, bias=False, prefix=f"{prefix}.g_proj"
            )
            self.head_gate = Spark2_5HeadGate(
                self.num_heads, self.head_dim, config.gate_attn_act_mode
            )
        self.out_proj = RowParallelLinear(
            total_heads * self.head_dim,
            config.hidden_size,
            bias=False,
            quant_config=quant_config,
            prefix=f"{prefix}.out_proj",
        )
        # Sized to the engine, not to max_position_embeddings (1M for the 4B).
        self.rotary_emb = compat.get_rope(
            self.head_dim, max_position=max_position, **config.rope_parameters_for(layer_type)
        )
        sliding = config.sliding_window if layer_type == SLIDING_ATTENTION else None
        self.attn = Attention(
            self.num_heads,
            self.head_dim,
            self.head_dim**-0.5,
            num_kv_heads=self.num_kv_heads,
            cache_config=cache_config,
            quant_config=quant_config,
            per_layer_sliding_window=sliding,
            prefix=f"{prefix}.attn",
        )
        # Only finite keys and values may enter the KV cache where the attention
        # reads stale slots of reused blocks (cpu_platform says where and why).
        self.finite_kv_only = cpu_platform.attention_reads_stale_kv_slots()

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        qkv, _ = self.q_k_v_proj(hidden_states)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q, k = self.rotary_emb(positions, q, k)
        if self.finite_kv_only:
            k, v = finite(k), finite(v)
        attn_output = self.attn(q, k, v)
        if self.g_proj is not None:
            attn_output = self.gate_heads(attn_output, hidden_states)
        output, _ = self.out_proj(attn_output)
        return output

    def gate_heads(self, attn_output: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        """Each head's output times ``act(g_proj(hidden_states))`` for that head."""
        gate_logits, _ = self.g_proj(hidden_states)
        return self.head_gate(attn_output, gate_logits)


def _rope_positions(vllm_config: VllmConfig) -> int:
    """The positions the cos/sin cache covers: those the engine serves, and past them
    the tokens a draft may propose at the end (vLLM's CUDA rotary kernel reads the
    cache without a bounds check)."""
    speculative = vllm_config.speculative_config
    drafted = getattr(speculative, "num_speculative_tokens", None) or 0
    return vllm_config.model_config.max_model_len + drafted


class Spark2_5DecoderLayer(nn.Module):
    def __init__(self, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__()
        config = vllm_config.model_config.hf_config
        quant_config = vllm_config.quant_config
        self.self_attn = Spark2_5Attention(
            config,
            layer_type=config.layer_types[extract_layer_index(prefix)],
            max_position=_rope_positions(vllm_config),
            cache_config=vllm_config.cache_config,
            quant_config=quant_config,
            prefix=f"{prefix}.self_attn",
        )
        self.mlp = Spark2_5MLP(
            config.hidden_size,
            config.intermediate_size,
            quant_config=quant_config,
            prefix=f"{prefix}.mlp",
        )
        self.input_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(
        self,
        positions: torch.Tensor,
        hidden_states: torch.Tensor,
        residual: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            residual = hidden_states
            hidden_states = self.input_layernorm(hidden_states)
        else:
            hidden_states, residual = self.input_layernorm(hidden_states, residual)
        hidden_states = self.self_attn(positions, hidden_states)
        hidden_states, residual = self.post_attention_layernorm(hidden_states, residual)
        hidden_states = self.mlp(hidden_states)
        return hidden_states, residual


@support_torch_compile
class Spark2_5Model(nn.Module):
    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__()
        config = vllm_config.model_config.hf_config
        self.config = config
        pp_group = get_pp_group()
        # A tied head on the last stage reads the embedding too.
        if pp_group.is_first_rank or (config.tie_word_embeddings and pp_group.is_last_rank):
            self.embedding = VocabParallelEmbedding(
                config.vocab_size,
                config.hidden_size,
                quant_config=vllm_config.quant_config,
                prefix=f"{prefix}.embedding",
            )
        else:
            self.embedding = PPMissingLayer()
        self.start_layer, self.end_layer, self.layers = make_layers(
            config.num_hidden_layers,
            lambda prefix: Spark2_5DecoderLayer(vllm_config, prefix=prefix),
            prefix=f"{prefix}.layers",
        )
        if pp_group.is_last_rank:
            self.norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        else:
            self.norm = PPMissingLayer()
        self.make_empty_intermediate_tensors = make_empty_intermediate_tensors_factory(
            ["hidden_states", "residual"], config.hidden_size
        )
        # The layers whose input an EAGLE-3 draft head reads; none unless vLLM asks.
        self.aux_hidden_state_layers: tuple[int, ...] = ()

    def get_input_embeddings(self) -> nn.Module:
        # vLLM's pooling converters tie their classifier to it (the checkpoint calls
        # it "embedding", not "embed_tokens").
        return self.embedding

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embedding(input_ids)

    def forward(
        self,
        input_ids: torch.Tensor | None,
        positions: torch.Tensor,
        intermediate_tensors: IntermediateTensors | None,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor | IntermediateTensors:
        if get_pp_group().is_first_rank:
            if inputs_embeds is not None:
                hidden_states = inputs_embeds
            else:
                hidden_states = self.embed_input_ids(input_ids)
            residual = None
        else:
            assert intermediate_tensors is not None
            hidden_states = intermediate_tensors["hidden_states"]
            residual = intermediate_tensors["residual"]
        aux_hidden_states = []
        layers = islice(self.layers, self.start_layer, self.end_layer)
        for index, layer in enumerate(layers, start=self.start_layer):
            if index in self.aux_hidden_state_layers:
                aux_hidden_states.append(
                    hidden_states if residual is None else hidden_states + residual
                )
            hidden_states, residual = layer(positions, hidden_states, residual)
        if not get_pp_group().is_last_rank:
            return IntermediateTensors({"hidden_states": hidden_states, "residual": residual})
        hidden_states, _ = self.norm(hidden_states, residual)
        if aux_hidden_states:
            return hidden_states, aux_hidden_states
        return hidden_states


class Spark2_5ForCausalLM(
    LocalArgmaxMixin,
    nn.Module,
    SupportsLoRA,
    SupportsPP,
    SupportsEagle,
    SupportsEagle3,
    SupportsQuant,
):
    # Checkpoint names are parameter names, but for the parts of packed parameters.
    hf_to_vllm_mapper = compat.stacked_weights_mapper(STACKED_PARAMS)
    # Every linear layer may be targeted by an adapter, g_proj included: its delta
    # adds to the gate logits before the activation, as merged weights would.
    packed_modules_mapping: ClassVar[dict[str, list[str]]] = PACKED_MODULES
    embedding_modules: ClassVar[dict[str, str]] = {
        "embedding": "input_embeddings",
        "lm_head": "output_embeddings",
    }

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__()
        config = vllm_config.model_config.hf_config
        self.config = config
        self.quant_config = vllm_config.quant_config
        refuse_draft_model_over_sliding_layers(vllm_config.speculative_config)
        refuse_direct_weight_updates(compat.weight_update_mode())
        self.model = Spark2_5Model(vllm_config=vllm_config, prefix=maybe_prefix(prefix, "model"))
        if get_pp_group().is_last_rank:
            self.lm_head = ParallelLMHead(
                config.vocab_size,
                config.hidden_size,
                quant_config=vllm_config.quant_config,
                prefix=maybe_prefix(prefix, "lm_head"),
            )
            if config.tie_word_embeddings:
                self.lm_head = self.lm_head.tie_weights(self.model.embedding)
            self.logits_processor = LogitsProcessor(config.vocab_size)
        else:
            self.lm_head = PPMissingLayer()
        self.make_empty_intermediate_tensors = self.model.make_empty_intermediate_tensors
        checks = TensorChecks(
            config, quantized=self.quant_config is not None, check_finite=check_finite_requested()
        )
        self.checkpoint = CheckpointLoader(
            self, checks, vllm_config.model_config, vllm_config.load_config
        )
        self.weight_updates = WeightUpdates(
            self.checkpoint, computes_with_copies=cpu_platform.linears_compute_with_copies()
        )
        hooks = host_hooks.ModelHooks(
            reload_step=self.weight_updates.layerwise_reload_step,
            check_adapter=AdapterChecks(config).check,
        )
        host_hooks.attach(self, hooks)

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_input_ids(input_ids)

    def set_aux_hidden_state_layers(self, layers: tuple[int, ...]) -> None:
        """The layers whose input (hidden states plus residual) an EAGLE-3 head reads."""
        self.model.aux_hidden_state_layers = eagle3_layers(
            layers, self.config.num_hidden_layers, get_pp_group().world_size
        )

    def get_eagle3_default_aux_hidden_state_layers(self) -> tuple[int, ...]:
        # vLLM's default for decoder-only models: an early, a middle and a late layer.
        count = self.config.num_hidden_layers
        return (2, count // 2, count - 3)

    def forward(
        self,
        input_ids: torch.Tensor | None,
        positions: torch.Tensor,
        intermediate_tensors: IntermediateTensors | None = None,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor | IntermediateTensors:
        return self.model(input_ids, positions, intermediate_tensors, inputs_embeds)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor | None:
        return self.logits_processor(self.lm_head, hidden_states)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        # The first call loads the checkpoint; later ones update it in place.
        if self.checkpoint.loaded_from is None:
            return self.checkpoint.load_first(weights)
        return self.weight_updates.take(weights)
