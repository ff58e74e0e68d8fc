"""Every place the carrier touches vLLM, in one list: what ``test_vllm_drift.py``
checks in the installed vLLM and ``python -m spark2_5_dev.source_check`` in any
release's source.

A touchpoint names a vLLM symbol (its module, with the former locations compat.py
still tries, and its attribute path), the calls the carrier makes to it (read
from ``spark2_5.py``, ``spark2_5_tool_parser/``, ``compat.py``, ``host_hooks.py``
and ``_registration.py``), what vLLM's own code must still do there for the
carrier's hooks to fire (``does``: statements as ``ast.unparse`` writes them),
and the carrier function to update when it drifts. Every name ``src/`` imports
from vLLM is a touchpoint too (:func:`touchpoints`), found in the source. Standard
library only: the source check runs where vLLM is not installed.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
from pathlib import Path
from typing import Any

SRC = Path(__file__).resolve().parents[4] / "src"
CARRIER = "vllm_spark2_5_plugin"


@dataclasses.dataclass(frozen=True)
class Call:
    """One way the carrier calls a symbol: ``positional`` arguments, then ``keywords``."""

    positional: int = 0
    keywords: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Touchpoint:
    symbol: str
    modules: tuple[str, ...]  # the first of them that exists must define it (compat's order)
    path: tuple[str, ...]  # attributes from the module: () is the module itself
    fix: str  # what to update when it drifts
    calls: tuple[Call, ...] = ()  # the carrier works when any one of them binds
    does: tuple[str, ...] = ()  # statements its source (or a function it calls) must hold
    overridden_by: str = ""  # "module:Class.method" of the carrier taking what vLLM passes
    without: str = ""  # what the carrier does where it is missing; "": it breaks
    feature: str | None = None  # the RELEASE_SHAPES feature that brought it (test_vllm_drift)


def use(dotted: str, modules: str | tuple[str, ...], fix: str, *calls: Call, **more: Any):
    """A touchpoint on ``modules``' attribute ``dotted`` (``"Class.method"``)."""
    modules = (modules,) if isinstance(modules, str) else modules
    return Touchpoint(dotted, modules, tuple(dotted.split(".")), fix, calls, **more)


LINEAR = "vllm.model_executor.layers.linear"
UTILS = "vllm.model_executor.models.utils"
EMBEDDING = "vllm.model_executor.layers.vocab_parallel_embedding"
PARSER = "vllm.tool_parsers.abstract_tool_parser"
PROTOCOL = ("vllm.entrypoints.generate.base.protocol", "vllm.entrypoints.openai.engine.protocol")
RELOAD = "vllm.model_executor.model_loader.reload"
LAYERWISE = f"{RELOAD}.layerwise"
LORA = "vllm.lora.model_manager"
RESPONSES = "vllm.entrypoints.openai.responses.serving"
MODELS = "vllm.model_executor.models.registry"
# Layers spark2_5.py builds directly: compat has no helper for them yet.
DIRECT = "a new compat.py helper that spark2_5.py calls instead of {}"
PROJECTION = ("bias", "quant_config", "prefix")
RELOAD_SETS = "._do_torchao_reload = "  # host_hooks.LAYERWISE_RELOAD_ATTRIBUTE, assigned
SPLIT = "host_hooks.keep_open_calls_before_content"
ATTENTION_KEYWORDS = ("num_kv_heads", "cache_config", "quant_config")
ATTENTION_KEYWORDS += ("per_layer_sliding_window", "prefix")

CURATED = (
    # --- the model's layers (spark2_5.py) ---
    use("Attention", "vllm.model_executor.layers.attention", "compat.attention_cls",
        Call(3, ATTENTION_KEYWORDS)),
    use("get_rope", "vllm.model_executor.layers.rotary_embedding", "compat.get_rope",
        Call(1, ("max_position", "is_neox_style", "rope_parameters"))),
    use("QKVParallelLinear", LINEAR, DIRECT.format("QKVParallelLinear"), Call(4, PROJECTION)),
    *(use(name, LINEAR, DIRECT.format(name), Call(2, PROJECTION))
      for name in ("MergedColumnParallelLinear", "ColumnParallelLinear", "RowParallelLinear")),
    *(use(name, EMBEDDING, DIRECT.format(name), Call(2, ("quant_config", "prefix")))
      for name in ("VocabParallelEmbedding", "ParallelLMHead")),
    use("ParallelLMHead.tie_weights", EMBEDDING, DIRECT.format("ParallelLMHead.tie_weights"),
        Call(2)),  # (self, embed_tokens)
    use("RMSNorm", "vllm.model_executor.layers.layernorm", DIRECT.format("RMSNorm"),
        Call(1, ("eps",))),
    use("GeluAndMul", "vllm.model_executor.layers.activation", DIRECT.format("GeluAndMul"),
        Call(0, ("approximate",))),
    use("LogitsProcessor", "vllm.model_executor.layers.logits_processor",
        DIRECT.format("LogitsProcessor"), Call(1)),
    use("make_layers", UTILS, DIRECT.format("it"), Call(2, ("prefix",))),
    use("make_empty_intermediate_tensors_factory", UTILS, DIRECT.format("it"), Call(2)),
    use("maybe_prefix", UTILS, DIRECT.format("it"), Call(2)),
    use("extract_layer_index", UTILS, DIRECT.format("it"), Call(1)),
    use("support_torch_compile", "vllm.compilation.decorators", DIRECT.format("it"), Call(1)),
    use("IntermediateTensors", "vllm.sequence", DIRECT.format("it"), Call(1)),
    use("LocalArgmaxMixin", "vllm.model_executor.models.interfaces",
        "compat.local_argmax_mixin", without="a draft model's proposer takes no local argmax"),
    use("Platform.is_cpu", "vllm.platforms.interface", "cpu_platform", Call(1)),
    # --- checkpoint loading (compat.load_weights, spark2_5_loading) ---
    use("is_pp_missing_parameter", UTILS,
        "compat.load_weights (and spark2_5_loading's CheckpointLedger)", Call(2)),
    use("WeightsMapper", UTILS, "compat.stacked_weights_mapper / compat.weights_mapper_stacks",
        Call(0, ("orig_to_new_stacked",)), Call(0)),
    use("WeightsMapper.apply", UTILS, "compat.load_weights", Call(2)),  # (self, weights)
    use("AutoWeightsLoader", UTILS, "compat.load_weights", Call(1)),
    use("AutoWeightsLoader.load_weights", UTILS, "compat.load_weights", Call(2, ("mapper",))),
    use("QuantizationConfig.get_checkpoint_weight_mapper",
        "vllm.model_executor.layers.quantization.base_config",
        "compat.quantized_checkpoint_names", Call(0),
        without="quantized checkpoints load every tensor by its own name"),
    # --- the tool parser (spark2_5_tool_parser/adapter.py, _registration.py) ---
    use("ToolParser", PARSER, "compat.tool_parser_base (and Spark25ToolParser.__init__)",
        Call(1)),
    use("ToolParserManager.register_lazy_module", PARSER, "_registration.register_tool_parser",
        Call(3)),
    use("ToolParserManager.list_registered", PARSER, "_registration.registered_tool_parsers",
        Call(0)),
    *(use(name, PROTOCOL, "compat.tool_call_protocol", Call(0, keywords))
      for name, keywords in (
          ("DeltaMessage", ("content", "tool_calls")),
          ("DeltaToolCall", ("index", "id", "type", "function")),
          ("DeltaFunctionCall", ("name", "arguments")),
          ("ToolCall", ("id", "function")),
          ("FunctionCall", ("name", "arguments")),
          ("ExtractedToolCallInformation", ("tools_called", "tool_calls", "content")),
      )),
    use("make_tool_call_id", ("vllm.renderers.chat_utils", "vllm.entrypoints.chat_utils"),
        "compat.tool_call_id_factory", Call(0)),
    use("get_function_tools", "vllm.tool_parsers.utils", "compat.function_tools", Call(1),
        without="namespace and custom tools are not flattened into functions"),
    use("SUPPORTED_STRUCTURAL_TAG_MODELS", "vllm.tool_parsers.structural_tag_registry",
        "compat.structural_tag_models", feature="tag_formats",
        without="tool_choice required or named is refused with a 400"),
    use("VLLMValidationError", "vllm.exceptions", "compat.request_validation_error",
        Call(1, ("parameter", "value"))),
    # Class attributes the parser sets that vLLM must still read; a renamed one is
    # silently ignored (forced calls unconstrained, the stream's tail never flushed).
    *(use(f"ToolParser.{name}", PARSER,
          "spark2_5_tool_parser/adapter.py (and compat.tool_parser_base if the base moved)",
          feature=feature, without=without)
      for name, feature, without in (
          ("supports_required_and_named", None, ""),
          ("structural_tag_model", "tag_formats", "forced tool calls are not constrained"),
          ("engine_based_streaming", "stream_end", "a stream's held tail is never sent"),
      )),
    # What vLLM calls on Spark25ToolParser: the base's parameters must all be ours.
    *(use(f"ToolParser.{method}", PARSER,
          f"Spark25ToolParser.{method} in spark2_5_tool_parser/adapter.py",
          overridden_by=f"vllm_spark2_5_plugin.spark2_5_tool_parser.adapter:"
          f"Spark25ToolParser.{method}")
      for method in ("__init__", "adjust_request", "extract_tool_calls",
                     "extract_tool_calls_streaming", "get_structural_tag")),
    use("split_delta", RESPONSES, SPLIT, Call(1),
        without="a last delta that closes a call and carries text fails the stream"),
    Touchpoint(RESPONSES, (RESPONSES,), (), SPLIT, does=("split_delta(",),
               without="a last delta that closes a call and carries text fails the stream"),
    use("DeltaMessage.reasoning", PROTOCOL, SPLIT),
    # --- registries (_registration.py, host_hooks.register_config) ---
    use("_CONFIG_REGISTRY", "vllm.transformers_utils.config", "host_hooks.host_config_registry"),
    use("ModelRegistry.get_supported_archs", MODELS, "_registration._register_model", Call(0)),
    use("ModelRegistry.register_model", MODELS, "_registration._register_model", Call(2)),
    Touchpoint("vllm.tool_parsers", ("vllm.tool_parsers",), (), "_registration.REGISTRY_MODULES"),
    use("environment_variables", "vllm.envs", "_registration.copy_to_ray_actors",
        does=("'VLLM_RAY_EXTRA_ENV_VARS_TO_COPY'",),
        without="the Ray actors vLLM starts get no carrier settings"),
    # --- weight updates (host_hooks: the layerwise reload) ---
    use("initialize_layerwise_reload", LAYERWISE, "host_hooks.LAYERWISE_RELOAD_ATTRIBUTE",
        does=(RELOAD_SETS,)),
    use("finalize_layerwise_reload", RELOAD, "host_hooks.finalize_layerwise_reload", Call(2),
        does=(RELOAD_SETS,)),
    use("LAYERWISE_INFO", LAYERWISE, "host_hooks.in_layerwise_reload"),
    use("LayerReloadingInfo.can_load", LAYERWISE, "host_hooks.in_layerwise_reload", Call(1)),
    # --- LoRA (host_hooks.check_lora_adapters, spark2_5_lora.AdapterChecks) ---
    use("LoRAModelManager._add_adapter", LORA, "host_hooks.check_lora_adapters",
        Call(2)),  # (self, lora_model)
    use("LoRAModelManager.__init__", LORA, "host_hooks.check_lora_adapters",
        does=("self.model.lora_manager = self",)),
    use("LoRAModel.loras", "vllm.lora.lora_model", "spark2_5_lora.AdapterChecks.check"),
    *(use(f"LoRALayerWeights.{name}", "vllm.lora.lora_weights",
          "spark2_5_lora.AdapterChecks.check") for name in ("lora_a", "lora_b", "rank")),
    # --- quantized layers on CPU (host_hooks) ---
    use("CPUWNA16LinearKernel", "vllm.model_executor.kernels.linear.mixed_precision.cpu",
        "host_hooks.CPU_KERNEL_OPS", without="a GPTQ layer on AVX2 fails at its first forward"),
    use("CPUInt8ScaledMMLinearKernel.process_weights_for_onednn",
        "vllm.model_executor.kernels.linear.scaled_mm.cpu", "host_hooks.keep_onednn_int8_scales",
        Call(2), without="an int8 layer is not kept whole across a layerwise reload"),
)  # fmt: skip


def imported(src: Path = SRC) -> list[Touchpoint]:
    """A touchpoint for each name ``src/`` imports from vLLM (``from vllm.x import y``)."""
    found = []
    for path in sorted(src.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("vllm."):
                fix = f"the import in {path.relative_to(src.parent).as_posix()}"
                found += [use(alias.name, node.module, fix) for alias in node.names]
    return found


def touchpoints(src: Path = SRC) -> list[Touchpoint]:
    """:data:`CURATED`, then each import of ``src/`` that none of them names."""
    named = {(t.modules, t.path) for t in CURATED}
    extra = {(t.modules, t.path): t for t in imported(src) if (t.modules, t.path) not in named}
    return [*CURATED, *extra.values()]


# --- calling ---------------------------------------------------------------------------


def accepted(target: Any) -> inspect.Signature:
    """How ``target`` takes arguments: a pydantic model by its fields, whatever
    ``extra=`` allows; anything else as ``inspect.signature`` says."""
    fields = getattr(target, "model_fields", None)
    if isinstance(fields, dict):
        return inspect.Signature(
            [
                inspect.Parameter(
                    name,
                    inspect.Parameter.KEYWORD_ONLY,
                    default=inspect.Parameter.empty if field.is_required() else None,
                )
                for name, field in fields.items()
            ]
        )
    return inspect.signature(target)


def call_problem(target: Any, call: Call) -> str | None:
    """Why ``target`` (or its ``inspect.Signature``) cannot be called as ``call``, or None."""
    signature = target if isinstance(target, inspect.Signature) else accepted(target)
    params = signature.parameters.values()
    takes_any_keyword = any(p.kind is p.VAR_KEYWORD for p in params)
    missing = [
        name for name in call.keywords if name not in signature.parameters and not takes_any_keyword
    ]
    if missing:
        return f"no parameter {', '.join(map(repr, missing))} (signature now {signature})"
    try:
        signature.bind(*range(call.positional), **dict.fromkeys(call.keywords))
    except TypeError as error:
        return f"{error} for {call.positional} positional argument(s) (signature now {signature})"
    return None


def not_taken(base: inspect.Signature, ours: inspect.Signature) -> list[str]:
    """The parameters of vLLM's ``base`` method that the carrier's override cannot take."""
    takes_any_keyword = any(p.kind is p.VAR_KEYWORD for p in ours.parameters.values())
    return [
        name
        for name, param in base.parameters.items()
        if name not in ours.parameters
        and not (takes_any_keyword and param.kind in (param.KEYWORD_ONLY, param.VAR_KEYWORD))
        and param.kind is not param.VAR_KEYWORD
    ]


def drift_message(symbol: str, problems: list[str], fix: str) -> str:
    return (
        f"vLLM drift in {symbol}: {'; or '.join(problems)}. "
        f"Update {fix} (detect the new shape, keep the old one) and its test."
    )


# --- the installed vLLM -----------------------------------------------------------------


def load(touchpoint: Touchpoint) -> Any:
    """The installed vLLM's object: the first of its modules that imports, then the path."""
    errors = []
    for name in touchpoint.modules:
        try:
            target = importlib.import_module(name)
        except ImportError as error:
            errors.append(f"{name}: {error}")
            continue
        for attribute in touchpoint.path:
            target = getattr(target, attribute)
        return target
    raise ImportError("none of these vLLM modules can be imported: " + "; ".join(errors))


def carrier_override(touchpoint: Touchpoint) -> Any:
    module, _, path = touchpoint.overridden_by.partition(":")
    target = importlib.import_module(module)
    for attribute in path.split("."):
        target = getattr(target, attribute)
    return target
