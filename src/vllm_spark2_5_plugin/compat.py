# SPDX-License-Identifier: Apache-2.0
"""Every difference between vLLM releases that the carrier depends on, in one place.

Each helper detects a feature (an attribute, a module, a keyword) rather than
comparing version strings, so vLLM forks and CPU builds with other version schemes
work; each branch names the releases of the verified range (0.23 to 0.33) that take
it. Like vLLM's in-tree models, the model file imports vLLM's stable layer APIs
(linear layers, the activation, the vocabulary embedding) directly; what moved or
changed between releases is reached through here. Where the carrier reaches into
vLLM's private state (no public hook exists) is :mod:`host_hooks`.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from vllm_hust_bundle_kit import deferred


def _first_importable(*module_names: str) -> Any:
    errors = []
    for name in module_names:
        try:
            return importlib.import_module(name)
        except ImportError as exc:
            errors.append(f"{name}: {exc}")
    raise ImportError("none of these vLLM modules can be imported: " + "; ".join(errors))


# --- registries ---------------------------------------------------------------


def _abstract_tool_parser() -> Any:
    return importlib.import_module("vllm.tool_parsers.abstract_tool_parser")


def tool_parser_manager() -> Any:
    """vLLM's ``ToolParserManager``."""
    return _abstract_tool_parser().ToolParserManager


# The module whose import completes each registry the carrier writes to. vLLM's
# processes import only the registries they use (the tool-parser one in the API
# server alone); the carrier registers into each when it loads.
REGISTRY_MODULES = {
    "config": "vllm.transformers_utils.config",
    "model": "vllm.model_executor.models.registry",
    "tool_parser": "vllm.tool_parsers",
}


def registry_loaded(registry: str) -> bool:
    """Whether this process has imported vLLM's ``registry`` (a ``REGISTRY_MODULES`` key)."""
    return REGISTRY_MODULES[registry] in sys.modules


def when_registry_loads(registry: str, register: Callable[[], None]) -> None:
    """Run ``register`` right after this process imports vLLM's ``registry``, before
    anything uses it. ``register`` must not raise: it runs inside that import."""
    deferred.after_import((REGISTRY_MODULES[registry],), lambda _module: register())


def model_registry() -> Any:
    """vLLM's ``ModelRegistry``, from its own module: ``from vllm import ModelRegistry``
    fails while that module's package is still being imported."""
    return importlib.import_module(REGISTRY_MODULES["model"]).ModelRegistry


def registered_tool_parsers() -> set[str]:
    return set(tool_parser_manager().list_registered())


def register_tool_parser(name: str, module_path: str, class_name: str) -> None:
    """Register a parser by import path so its module loads on first use only."""
    tool_parser_manager().register_lazy_module(name, module_path, class_name)


def host_config_registry() -> dict[str, Any]:
    """vLLM's ``model_type -> config class`` table, consulted before remote code."""
    return importlib.import_module("vllm.transformers_utils.config")._CONFIG_REGISTRY


def register_config(model_type: str, config_cls: type) -> None:
    """Make ``model_type`` resolve to ``config_cls`` in vLLM and in transformers.

    An entry in vLLM's table also makes vLLM load the config without running
    the checkpoint's remote code, even when ``--trust-remote-code`` is given.
    """
    from transformers import AutoConfig

    host_config_registry()[model_type] = config_cls
    AutoConfig.register(model_type, config_cls, exist_ok=True)


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


def attention_reads_stale_kv_slots() -> bool:
    """Whether this platform's attention reads the stale slots of reused KV-cache
    blocks, weighted zero: vLLM's CPU attention (0.23 to 0.33). There 0 * NaN is
    NaN, so the NaN keys or values of one request whose activations overflow (a
    damaged LoRA adapter) would corrupt every later request that reuses its blocks,
    and the model writes only finite ones. Off on other platforms (GPU backends were
    not run here), where the guard would cost kernels per layer and hide NaNs."""
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


def gate_math_in_row_blocks() -> bool:
    """Whether eager elementwise math over a whole prefill is cheaper a block of
    rows at a time: on CPU an fp32 copy of every head's output (64 MiB for 4,096
    tokens of the 4B) is streamed through memory three times, and with glibc's
    allocator page-faulted in afresh; a block's copy stays in cache. GPU eager
    would launch three kernels per block instead of three in all."""
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


def linears_compute_with_copies() -> bool:
    """Whether vLLM's linear layers compute with copies of their weights made when
    loading finished: its CPU backend (0.23 to 0.33) packs each unquantized linear
    for oneDNN or its SGL kernel and empties the layer's ``weight``, and computes an
    LM head from a packed copy too. Other platforms' kernels read the parameters, so
    a weight written into them serves from the next step."""
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


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
    with ``mapper``, :func:`stacked_weights_mapper` of ``stacked``.

    Hides two API changes:

    * packed parameters: where ``WeightsMapper`` has ``orig_to_new_stacked`` (0.25
      and later) the mapper tags each stacked tensor with its shard id and the
      packed layer reads it; vLLM 0.23 and 0.24 have neither (the mapper is empty),
      so there each stacked tensor goes to ``param.weight_loader(param, tensor,
      shard_id)`` here, those releases' idiom.
      Tensors that are not stacked (a fused ``q_k_v_proj``) load with no shard id
      on both.
    * skipping: ``AutoWeightsLoader(skip_prefixes=...)`` was removed in vLLM 0.29;
      names under ``skip_prefixes`` are dropped before the loader sees them, which
      works with and without that argument.

    Returns the names of the parameters that were loaded.
    """
    utils = _model_utils()
    skip = tuple(skip_prefixes)
    kept = ((name, tensor) for name, tensor in weights if not (skip and name.startswith(skip)))
    loader = utils.AutoWeightsLoader(module)
    if weights_mapper_stacks(type(mapper)):
        return loader.load_weights(kept, mapper=mapper)

    params = dict(module.named_parameters())
    stacked_loaded: set[str] = set()

    def load_stacked_yield_rest() -> Iterable[tuple[str, Any]]:
        for name, tensor in kept:
            for part, (packed_part, shard_id) in stacked.items():
                if part in name:
                    target = name.replace(part, packed_part, 1)
                    if not utils.is_pp_missing_parameter(target, module):
                        param = params[target]
                        param.weight_loader(param, tensor, shard_id)
                        stacked_loaded.add(target)
                    break
            else:
                yield name, tensor

    rest_loaded = loader.load_weights(load_stacked_yield_rest(), mapper=mapper)
    return stacked_loaded | set(rest_loaded)


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


# --- the environment of Ray actors ------------------------------------------------

RAY_EXTRA_ENV_VARS = "VLLM_RAY_EXTRA_ENV_VARS_TO_COPY"


def copy_to_ray_actors(names: Iterable[str]) -> list[str]:
    """Have vLLM copy ``names`` from this process into the Ray actors it starts; the
    names added (none where this vLLM has no such list).

    The V2 Ray executor (the default) copies the whole driver environment, filling
    in only what a node lacks. The older Ray executor (``VLLM_USE_RAY_V2_EXECUTOR_BACKEND=0``,
    0.23 to 0.32) and the data-parallel engine-core actors copy vLLM's own variables, a
    few prefixes and the names in ``VLLM_RAY_EXTRA_ENV_VARS_TO_COPY`` (0.23 to 0.33
    alike): the names are appended to that list, after the operator's own. Done
    when this process imports ``vllm.envs`` (right away where it has), which every
    process that starts Ray actors does first; the list returned is filled then.
    """
    wanted = tuple(dict.fromkeys(names))
    added: list[str] = []

    def extend(envs: Any) -> None:
        if RAY_EXTRA_ENV_VARS not in getattr(envs, "environment_variables", {}):
            return
        raw = os.environ.get(RAY_EXTRA_ENV_VARS, "")
        listed = [name.strip() for name in raw.split(",") if name.strip()]
        added.extend(name for name in wanted if name not in listed)
        if added:
            os.environ[RAY_EXTRA_ENV_VARS] = ",".join([*listed, *added])

    deferred.after_import(("vllm.envs",), extend)
    return added
