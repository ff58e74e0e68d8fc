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

import logging
from collections.abc import Iterable
from itertools import islice
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
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

from vllm_spark2_5_plugin import compat, host_hooks
from vllm_spark2_5_plugin.settings import check_finite_requested
from vllm_spark2_5_plugin.spark2_5_checkpoint import TensorChecks, checkpoint_folder
from vllm_spark2_5_plugin.spark2_5_config import SLIDING_ATTENTION, Spark2_5Config
from vllm_spark2_5_plugin.spark2_5_loading import WeightIntake, watch_update_sessions
from vllm_spark2_5_plugin.spark2_5_lora import AdapterChecks
from vllm_spark2_5_plugin.spark2_5_names import PACKED_MODULES, STACKED_PARAMS

Attention = compat.attention_cls()
LocalArgmaxMixin = compat.local_argmax_mixin()
logger = logging.getLogger("vllm.spark2_5_plugin")

_GATE_ACTIVATIONS = {"sigmoid": torch.sigmoid, "silu": F.silu}
# Token rows per block of eager CPU gate math: 2 MiB of fp32 at the 4B's 16 heads of 256.
GATE_BLOCK_ROWS = 128


def _finite(x: torch.Tensor) -> torch.Tensor:
    """``x`` with NaN and infinities as 0, the same bits either way: eager, one
    ``nan_to_num`` kernel; compiled, the select that Inductor turns into faster CPU
    code than it makes of ``nan_to_num``."""
    if torch.compiler.is_compiling():
        return torch.where(torch.isfinite(x), x, 0.0)
    return torch.nan_to_num(x, nan=0.0, posinf=0.0, neginf=0.0)


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
        self.total_num_heads = config.num_attention_heads
        self.total_num_kv_heads = config.num_key_value_heads
        if self.total_num_heads % tp_size:
            raise ValueError(
                f"num_attention_heads={self.total_num_heads} cannot be split across "
                f"tensor_parallel_size={tp_size}; use a tensor parallel size that divides it"
            )
        # KV heads are partitioned when there are enough of them, else replicated.
        kv_divides = (
            self.total_num_kv_heads % tp_size == 0
            if self.total_num_kv_heads >= tp_size
            else tp_size % self.total_num_kv_heads == 0
        )
        if not kv_divides:
            raise ValueError(
                f"num_key_value_heads={self.total_num_kv_heads} cannot be partitioned or "
                f"replicated across tensor_parallel_size={tp_size}; one of the two must "
                "divide the other"
            )
        self.num_heads = self.total_num_heads // tp_size
        self.num_kv_heads = max(1, self.total_num_kv_heads // tp_size)
        self.head_dim = config.head_dim
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim

        self.q_k_v_proj = QKVParallelLinear(
            config.hidden_size,
            self.head_dim,
            self.total_num_heads,
            self.total_num_kv_heads,
            bias=False,
            quant_config=quant_config,
            prefix=f"{prefix}.q_k_v_proj",
        )
        # One gate per head, sharded like the query heads. Left unquantised: it
        # is tiny and its output feeds fp32 gate math.
        self.g_proj = (
            ColumnParallelLinear(
                config.hidden_size,
                self.total_num_heads,
                bias=False,
                quant_config=None,
                prefix=f"{prefix}.g_proj",
            )
            if config.headwise_attn_output_gate
            else None
        )
        self.gate_act = _GATE_ACTIVATIONS[config.gate_attn_act_mode]
        self.gate_block_rows = GATE_BLOCK_ROWS if compat.gate_math_in_row_blocks() else None
        self.out_proj = RowParallelLinear(
            self.total_num_heads * self.head_dim,
            config.hidden_size,
            bias=False,
            quant_config=quant_config,
            prefix=f"{prefix}.out_proj",
        )
        # Sized to the engine, not to max_position_embeddings (1M for the 4B).
        self.rotary_emb = compat.get_rope(
            self.head_dim, max_position=max_position, **config.rope_parameters_for(layer_type)
        )
        self.attn = Attention(
            self.num_heads,
            self.head_dim,
            self.head_dim**-0.5,
            num_kv_heads=self.num_kv_heads,
            cache_config=cache_config,
            quant_config=quant_config,
            per_layer_sliding_window=(
                config.sliding_window if layer_type == SLIDING_ATTENTION else None
            ),
            prefix=f"{prefix}.attn",
        )
        # Only finite keys and values may enter the KV cache where the attention
        # reads stale slots of reused blocks (compat says where and why).
        self.finite_kv_only = compat.attention_reads_stale_kv_slots()

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        qkv, _ = self.q_k_v_proj(hidden_states)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q, k = self.rotary_emb(positions, q, k)
        if self.finite_kv_only:
            k, v = _finite(k), _finite(v)
        attn_output = self.attn(q, k, v)
        if self.g_proj is not None:
            attn_output = self.gate_heads(attn_output, hidden_states)
        output, _ = self.out_proj(attn_output)
        return output

    def gate_heads(self, attn_output: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        """Each head's output times ``act(g_proj(hidden_states))`` for that head, in
        fp32 as in the reference, rounded once to the output's dtype."""
        gate, _ = self.g_proj(hidden_states)
        gate = self.gate_act(gate.float()).unsqueeze(-1)
        heads = attn_output.view(-1, self.num_heads, self.head_dim)
        if self.gate_block_rows is None or torch.compiler.is_compiling():
            # One fp32 copy scaled in place; compiled, Inductor fuses it into one loop.
            return heads.float().mul_(gate).view_as(attn_output).to(attn_output.dtype)
        # Eager on CPU: a block's fp32 copy at a time, written back into the output.
        rows = self.gate_block_rows
        for block, block_gate in zip(heads.split(rows), gate.split(rows), strict=True):
            block.copy_(block.float().mul_(block_gate))
        return attn_output


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


def _refuse_draft_model_over_sliding_layers(speculative_config: Any) -> None:
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


@watch_update_sessions
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
        _refuse_draft_model_over_sliding_layers(vllm_config.speculative_config)
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
        host_hooks.refuse_missing_cpu_kernel_ops(self)
        model_config, load_config = vllm_config.model_config, vllm_config.load_config
        # Where vLLM reads the weights from, to name a damaged file should reading
        # fail; looked up then, as reload_weights(weights_path=...) repoints it.
        self.checkpoint_folder = lambda: checkpoint_folder(
            model_config.model, model_config.revision, load_config.download_dir
        )
        self.weight_intake = WeightIntake(
            self,
            TensorChecks(
                config,
                quantized=vllm_config.quant_config is not None,
                check_finite=check_finite_requested(),
            ),
            folder=self.checkpoint_folder,
            model_config=model_config,
            computes_with_copies=compat.linears_compute_with_copies(),
        )

    @property
    def lora_manager(self) -> Any:
        return self.__dict__.get("_lora_manager")

    @lora_manager.setter
    def lora_manager(self, manager: Any) -> None:
        # vLLM's LoRA manager announces itself here when it wraps this model; from
        # then on it refuses adapters that do not fit this model's shapes.
        self.__dict__["_lora_manager"] = manager
        if not host_hooks.check_lora_adapters(manager, AdapterChecks(self.config).check):
            logger.warning(
                "This vLLM's LoRA manager has no _add_adapter: Spark2_5 cannot check LoRA "
                "adapters against the model, and serves mis-shaped ones unchecked"
            )

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_input_ids(input_ids)

    def set_aux_hidden_state_layers(self, layers: tuple[int, ...]) -> None:
        """The layers whose input (hidden states plus residual) an EAGLE-3 head reads."""
        layers = tuple(sorted(set(layers)))
        count = self.config.num_hidden_layers
        if any(not 0 <= layer < count for layer in layers):
            raise ValueError(
                f"EAGLE-3 asked Spark2_5 for the hidden states of layers {list(layers)}, but "
                f"it has layers 0 to {count - 1}: set eagle_aux_hidden_state_layer_ids in "
                "the draft head's config to layers of this model"
            )
        if get_pp_group().world_size > 1:
            raise ValueError(
                "EAGLE-3 on Spark2_5 needs --pipeline-parallel-size 1: the draft head's "
                "hidden states are not passed between pipeline stages"
            )
        self.model.aux_hidden_state_layers = layers

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
        # The first call loads the checkpoint; later ones update it in place
        # (spark2_5_loading says how).
        return self.weight_intake.take(weights)
