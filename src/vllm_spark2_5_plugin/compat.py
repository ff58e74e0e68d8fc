# SPDX-License-Identifier: Apache-2.0
"""Every difference between vLLM releases that the carrier depends on, in one place.

Each helper detects a feature (an attribute, a module, a keyword) rather than
comparing version strings, so vLLM forks and CPU builds with other version
schemes work; each branch names the releases of the verified range that take
it. Like vLLM's in-tree models, the model file imports vLLM's stable layer APIs
(linear layers, the activation, the vocabulary embedding) directly; what moved
or changed between releases is reached through here. Where the carrier reaches
into vLLM's private state (no public hook exists) is :mod:`host_hooks`; what
differs by platform, :mod:`cpu_platform`.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any


def _first_importable(*module_names: str) -> Any:
    errors = []
    for name in module_names:
        try:
            return importlib.import_module(name)
        except ImportError as exc:
            errors.append(f"{name}: {exc}")
    raise ImportError("none of these vLLM modules can be imported: " + "; ".join(errors))


def _model_utils() -> Any:
    """``vllm.model_executor.models.utils``, looked up per call so tests can stand in
    the shapes of older releases."""
    return importlib.import_module("vllm.model_executor.models.utils")


def _rotary_embedding_module() -> Any:
    return importlib.import_module("vllm.model_executor.layers.rotary_embedding")


# --- model layers -------------------------------------------------------------


def attention_cls() -> type:
    """vLLM's decoder ``Attention`` layer."""
    return importlib.import_module("vllm.model_executor.layers.attention").Attention


def get_rope(
    head_size: int, max_position: int, rope_theta: float, partial_rotary_factor: float
) -> Any:
    """vLLM's cached neox-style RoPE over the first ``int(head_size * partial_rotary_factor)``
    dims of each head; the cos/sin cache has ``max_position`` rows."""
    return _rotary_embedding_module().get_rope(
        head_size,
        max_position=max_position,
        is_neox_style=True,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": rope_theta,
            "partial_rotary_factor": partial_rotary_factor,
        },
    )


# --- checkpoint loading ---------------------------------------------------------


def weights_mapper_stacks(mapper_cls: type | None = None) -> bool:
    """Whether ``WeightsMapper`` can route a checkpoint name into one shard of a packed
    parameter (``orig_to_new_stacked``: vLLM 0.25 and later; not 0.23, 0.24)."""
    mapper_cls = mapper_cls or _model_utils().WeightsMapper
    return "orig_to_new_stacked" in {field.name for field in dataclasses.fields(mapper_cls)}


def stacked_weights_mapper(stacked: Mapping[str, tuple[str, str | int]]) -> Any:
    """A ``WeightsMapper`` for ``stacked`` (``{".gate_proj.": (".gate_up_proj.", 0)}``).

    On releases without ``orig_to_new_stacked`` (0.23, 0.24) it is an empty mapper,
    and :func:`load_weights` loads the stacked names shard by shard itself.
    """
    mapper_cls = _model_utils().WeightsMapper
    if weights_mapper_stacks(mapper_cls):
        return mapper_cls(orig_to_new_stacked=dict(stacked))
    return mapper_cls()


def load_weights(
    module: Any,
    weights: Iterable[tuple[str, Any]],
    *,
    mapper: Any,
    stacked: Mapping[str, tuple[str, str | int]],
    skip_prefixes: Sequence[str] = (),
) -> set[str]:
    """Load checkpoint-named ``weights`` into ``module`` through vLLM's ``AutoWeightsLoader``
    with ``mapper``, :func:`stacked_weights_mapper` of ``stacked``; returns the names of
    the parameters loaded.

    Hides two API changes. Packed parameters: where ``WeightsMapper`` has
    ``orig_to_new_stacked`` (0.25 and later) the mapper tags each stacked tensor with
    its shard id and the packed layer reads it; vLLM 0.23 and 0.24 load them through
    :mod:`loading_before_0_25`. Skipping: ``AutoWeightsLoader(skip_prefixes=...)`` was
    removed in vLLM 0.29, so names under ``skip_prefixes`` are dropped before the
    loader sees them, which works with and without that argument.
    """
    utils = _model_utils()
    skip = tuple(skip_prefixes)
    kept = ((name, tensor) for name, tensor in weights if not (skip and name.startswith(skip)))
    loader = utils.AutoWeightsLoader(module)
    if weights_mapper_stacks(type(mapper)):
        return loader.load_weights(kept, mapper=mapper)
    from vllm_spark2_5_plugin import loading_before_0_25

    return loading_before_0_25.load_weights(loader, module, kept, mapper, stacked)


def weight_update_mode() -> str:
    """How this vLLM updates weights in place: ``"direct"`` where it has
    ``VLLM_RELOAD_MODE`` (0.34 and later) and it says so, else ``"layerwise"``, the
    only mode of 0.23 to 0.33 (which ignore the variable)."""
    envs = importlib.import_module("vllm.envs")
    if "VLLM_RELOAD_MODE" not in getattr(envs, "environment_variables", {}):
        return "layerwise"
    return envs.VLLM_RELOAD_MODE


def local_argmax_mixin() -> type:
    """vLLM's ``LocalArgmaxMixin`` (0.24 and later): ``get_top_tokens``, the greedy
    token a draft model's proposer takes with ``use_local_argmax_reduction``. On 0.23,
    whose in-tree models lack the hook too, an empty base stands in."""
    interfaces = importlib.import_module("vllm.model_executor.models.interfaces")
    return getattr(interfaces, "LocalArgmaxMixin", _NoLocalArgmax)


class _NoLocalArgmax:
    pass


def quantized_checkpoint_names(
    quant_config: Any, weights: Iterable[tuple[str, Any]]
) -> Iterable[tuple[str, Any]]:
    """``weights`` renamed and filtered the way ``quant_config``'s method reads a
    checkpoint (``get_checkpoint_weight_mapper``, vLLM 0.32: GPTQ drops ``g_idx``,
    which its kernels do not take). Unchanged without quantization and on 0.23
    to 0.31, whose quantization configs have no such hook."""
    mapper_fn = getattr(quant_config, "get_checkpoint_weight_mapper", None)
    if mapper_fn is None:
        return weights
    return mapper_fn().apply(weights)


# --- tool-call parser -----------------------------------------------------------


def _abstract_tool_parser() -> Any:
    return importlib.import_module("vllm.tool_parsers.abstract_tool_parser")


def tool_parser_manager() -> Any:
    """vLLM's ``ToolParserManager``."""
    return _abstract_tool_parser().ToolParserManager


def tool_parser_base() -> type:
    """The ``ToolParser`` base class every registered parser must subclass."""
    return _abstract_tool_parser().ToolParser


def tool_call_protocol() -> Any:
    """The module with ``DeltaMessage``, ``DeltaToolCall``, ``DeltaFunctionCall``,
    ``ToolCall``, ``FunctionCall`` and ``ExtractedToolCallInformation``.

    ``vllm.entrypoints.generate.base.protocol`` in vLLM 0.29 and later,
    ``vllm.entrypoints.openai.engine.protocol`` in 0.23 to 0.28.
    """
    return _first_importable(
        "vllm.entrypoints.generate.base.protocol",
        "vllm.entrypoints.openai.engine.protocol",
    )


def tool_call_id_factory() -> Any:
    """vLLM's ``make_tool_call_id``: in ``vllm.renderers.chat_utils`` in vLLM 0.32 and
    later, ``vllm.entrypoints.chat_utils`` in 0.23 to 0.31. Called with no arguments
    it returns a random id."""
    module = _first_importable("vllm.renderers.chat_utils", "vllm.entrypoints.chat_utils")
    return module.make_tool_call_id


def _tool_parser_utils() -> Any:
    """``vllm.tool_parsers.utils``, looked up per call so tests can take attributes away."""
    return importlib.import_module("vllm.tool_parsers.utils")


def _function_tools(tools: Iterable[Any]) -> Iterable[tuple[str, Any]]:
    """``(name, parameters)`` of the plain function tools in a request's ``tools``:
    Chat Completions tools (``tool.function``) and Responses function tools."""
    for tool in tools:
        function = getattr(tool, "function", None)
        if function is not None:
            yield function.name, function.parameters
        elif getattr(tool, "type", None) == "function":
            yield tool.name, tool.parameters


def function_tools(tools: Sequence[Any] | None) -> list[tuple[str, Any]]:
    """``(name, parameters)`` of the function tools in a request's ``tools``.

    vLLM 0.32 has ``vllm.tool_parsers.utils.get_function_tools`` (it flattens
    Responses-API namespace tools to ``namespace__name`` and turns custom tools
    into functions); on 0.23 to 0.31 the plain function tools.
    """
    if not tools:
        return []
    host_list = getattr(_tool_parser_utils(), "get_function_tools", None)
    if host_list is None:
        return list(_function_tools(tools))
    functions = [getattr(tool, "function", tool) for tool in host_list(tools)]
    return [(function.name, function.parameters) for function in functions]


def structural_tag_models() -> frozenset[str]:
    """The tool-call structural-tag formats this vLLM can turn into a grammar.

    vLLM 0.24 and later list them; 0.23 cannot constrain ``tool_choice="required"``
    or named calls to a model's own syntax at all, and for it this is empty.
    """
    registry = importlib.import_module("vllm.tool_parsers.structural_tag_registry")
    return frozenset(getattr(registry, "SUPPORTED_STRUCTURAL_TAG_MODELS", ()))


def request_validation_error(message: str, parameter: str, value: Any) -> Exception:
    """``vllm.exceptions.VLLMValidationError``: the API server answers it with HTTP 400
    naming ``parameter``."""
    error_cls = importlib.import_module("vllm.exceptions").VLLMValidationError
    return error_cls(message, parameter=parameter, value=value)
