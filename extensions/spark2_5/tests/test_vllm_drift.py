"""Drift guard: the vLLM internals the carrier calls still take what it passes.

Each entry names a vLLM symbol, the call the carrier makes (positional count and
keyword names, read from ``spark2_5.py``, ``spark2_5_tool_parser/``, ``compat.py``
and ``host_hooks.py``) and where to fix a break. A vLLM upgrade that renames or
drops one of those parameters fails here with the symbol, the parameter and the
function to update, instead of deep inside an engine start.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from collections.abc import Callable
from typing import Any

import pytest
import torch
from packaging.version import Version

from spark2_5_dev.host_features import flushes_stream_end
from spark2_5_dev.model_building import vllm_model_env
from vllm_spark2_5_plugin import compat

__all__ = ["vllm_model_env"]  # the fixture, for pytest


@dataclasses.dataclass(frozen=True)
class Call:
    """One way the carrier calls a symbol: ``positional`` arguments, then ``keywords``."""

    positional: int = 0
    keywords: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Use:
    symbol: str
    load: Callable[[], Any]
    calls: tuple[Call, ...]  # the carrier works when any one of them binds
    fix: str  # the compat.py function that hides this symbol's drift

    def problems(self) -> list[str]:
        target = self.load()
        return [problem for call in self.calls if (problem := call_problem(target, call))]

    def check(self) -> None:
        problems = self.problems()
        if len(problems) == len(self.calls):
            raise AssertionError(
                f"vLLM drift in {self.symbol}: {'; or '.join(problems)}. "
                f"Update {self.fix} (detect the new shape, keep the old one) and its test."
            )


def accepted(target: Any) -> inspect.Signature:
    fields = getattr(target, "model_fields", None)
    if isinstance(fields, dict):  # pydantic: the fields, whatever extra= allows
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
    """Why ``target`` cannot be called as ``call``, or None."""
    signature = accepted(target)
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


def attr(module: str, *path: str) -> Callable[[], Any]:
    def load() -> Any:
        target = importlib.import_module(module)
        for name in path:
            target = getattr(target, name)
        return target

    return load


def protocol(name: str) -> Callable[[], Any]:
    return lambda: getattr(compat.tool_call_protocol(), name)


LINEAR = "vllm.model_executor.layers.linear"
UTILS = "vllm.model_executor.models.utils"
EMBEDDING = "vllm.model_executor.layers.vocab_parallel_embedding"
# Layers spark2_5.py builds directly: compat has no helper for them yet.
DIRECT = "a new compat.py helper that spark2_5.py calls instead of {}"
PROJECTION = ("bias", "quant_config", "prefix")

USES = [
    Use(
        "Attention",
        compat.attention_cls,
        (
            Call(
                3,
                (
                    "num_kv_heads",
                    "cache_config",
                    "quant_config",
                    "per_layer_sliding_window",
                    "prefix",
                ),
            ),
        ),
        "compat.attention_cls",
    ),
    Use(
        "get_rope",
        attr("vllm.model_executor.layers.rotary_embedding", "get_rope"),
        (Call(1, ("max_position", "is_neox_style", "rope_parameters")),),
        "compat.get_rope",
    ),
    Use(
        "QKVParallelLinear",
        attr(LINEAR, "QKVParallelLinear"),
        (Call(4, PROJECTION),),
        DIRECT.format("QKVParallelLinear"),
    ),
    Use(
        "MergedColumnParallelLinear",
        attr(LINEAR, "MergedColumnParallelLinear"),
        (Call(2, PROJECTION),),
        DIRECT.format("MergedColumnParallelLinear"),
    ),
    Use(
        "ColumnParallelLinear",
        attr(LINEAR, "ColumnParallelLinear"),
        (Call(2, PROJECTION),),
        DIRECT.format("ColumnParallelLinear"),
    ),
    Use(
        "RowParallelLinear",
        attr(LINEAR, "RowParallelLinear"),
        (Call(2, PROJECTION),),
        DIRECT.format("RowParallelLinear"),
    ),
    Use(
        "VocabParallelEmbedding",
        attr(EMBEDDING, "VocabParallelEmbedding"),
        (Call(2, ("quant_config", "prefix")),),
        DIRECT.format("VocabParallelEmbedding"),
    ),
    Use(
        "ParallelLMHead",
        attr(EMBEDDING, "ParallelLMHead"),
        (Call(2, ("quant_config", "prefix")),),
        DIRECT.format("ParallelLMHead"),
    ),
    Use(
        "ParallelLMHead.tie_weights",
        attr(EMBEDDING, "ParallelLMHead", "tie_weights"),
        (Call(2),),  # (self, embed_tokens)
        DIRECT.format("ParallelLMHead.tie_weights"),
    ),
    Use(
        "RMSNorm",
        attr("vllm.model_executor.layers.layernorm", "RMSNorm"),
        (Call(1, ("eps",)),),
        DIRECT.format("RMSNorm"),
    ),
    Use(
        "GeluAndMul",
        attr("vllm.model_executor.layers.activation", "GeluAndMul"),
        (Call(0, ("approximate",)),),
        DIRECT.format("GeluAndMul"),
    ),
    Use(
        "LogitsProcessor",
        attr("vllm.model_executor.layers.logits_processor", "LogitsProcessor"),
        (Call(1),),
        DIRECT.format("LogitsProcessor"),
    ),
    Use("make_layers", attr(UTILS, "make_layers"), (Call(2, ("prefix",)),), DIRECT.format("it")),
    Use(
        "make_empty_intermediate_tensors_factory",
        attr(UTILS, "make_empty_intermediate_tensors_factory"),
        (Call(2),),
        DIRECT.format("it"),
    ),
    Use(
        "is_pp_missing_parameter",
        attr(UTILS, "is_pp_missing_parameter"),
        (Call(2),),
        "compat.load_weights (and spark2_5_loading's CheckpointLedger)",
    ),
    Use(
        "WeightsMapper",
        attr(UTILS, "WeightsMapper"),
        (Call(0, ("orig_to_new_stacked",)), Call(0)),
        "compat.stacked_weights_mapper / compat.weights_mapper_stacks",
    ),
    Use(
        "WeightsMapper.apply",
        attr(UTILS, "WeightsMapper", "apply"),
        (Call(2),),  # (self, weights)
        "compat.load_weights",
    ),
    Use(
        "AutoWeightsLoader",
        attr(UTILS, "AutoWeightsLoader"),
        (Call(1),),
        "compat.load_weights",
    ),
    Use(
        "AutoWeightsLoader.load_weights",
        attr(UTILS, "AutoWeightsLoader", "load_weights"),
        (Call(2, ("mapper",)),),
        "compat.load_weights",
    ),
    Use(
        "ToolParser",
        compat.tool_parser_base,
        (Call(1),),
        "compat.tool_parser_base (and Spark25ToolParser.__init__)",
    ),
    Use(
        "ToolParserManager.register_lazy_module",
        lambda: compat.tool_parser_manager().register_lazy_module,
        (Call(3),),
        "_registration.register_tool_parser",
    ),
    Use(
        "DeltaMessage",
        protocol("DeltaMessage"),
        (Call(0, ("content", "tool_calls")),),
        "compat.tool_call_protocol",
    ),
    Use(
        "DeltaToolCall",
        protocol("DeltaToolCall"),
        (Call(0, ("index", "id", "type", "function")),),
        "compat.tool_call_protocol",
    ),
    Use(
        "DeltaFunctionCall",
        protocol("DeltaFunctionCall"),
        (Call(0, ("name", "arguments")),),
        "compat.tool_call_protocol",
    ),
    Use(
        "ToolCall",
        protocol("ToolCall"),
        (Call(0, ("id", "function")),),
        "compat.tool_call_protocol",
    ),
    Use(
        "FunctionCall",
        protocol("FunctionCall"),
        (Call(0, ("name", "arguments")),),
        "compat.tool_call_protocol",
    ),
    Use(
        "ExtractedToolCallInformation",
        protocol("ExtractedToolCallInformation"),
        (Call(0, ("tools_called", "tool_calls", "content")),),
        "compat.tool_call_protocol",
    ),
    Use(
        "make_tool_call_id",
        compat.tool_call_id_factory,
        (Call(0),),
        "compat.tool_call_id_factory",
    ),
    Use(
        "LoRAModelManager._add_adapter",
        attr("vllm.lora.model_manager", "LoRAModelManager", "_add_adapter"),
        (Call(2),),  # (self, lora_model)
        "host_hooks.check_lora_adapters",
    ),
    Use(
        "VLLMValidationError",
        attr("vllm.exceptions", "VLLMValidationError"),
        (Call(1, ("parameter", "value")),),
        "compat.request_validation_error",
    ),
]


@pytest.mark.parametrize("use", USES, ids=[use.symbol for use in USES])
def test_vllm_still_takes_what_the_carrier_passes(use: Use):
    use.check()


def test_vllm_lora_manager_still_announces_itself_to_the_model():
    """The carrier's adapter checks start when vLLM sets ``model.lora_manager``."""
    from vllm.lora.model_manager import LoRAModelManager

    assert "self.model.lora_manager = self" in inspect.getsource(LoRAModelManager.__init__), (
        "vLLM drift: LoRAModelManager no longer sets model.lora_manager, so "
        "Spark2_5ForCausalLM.lora_manager never installs the adapter checks. Find the new "
        "place a model learns of its LoRA manager and update host_hooks.check_lora_adapters."
    )


# What vLLM calls on Spark25ToolParser: the base's parameters must all be ours.
OVERRIDDEN = ["__init__", "adjust_request", "extract_tool_calls", "extract_tool_calls_streaming"]


@pytest.mark.parametrize("method", OVERRIDDEN)
def test_the_parser_overrides_take_every_parameter_vllm_passes(method: str):
    from vllm_spark2_5_plugin.spark2_5_tool_parser import Spark25ToolParser

    base = inspect.signature(getattr(compat.tool_parser_base(), method)).parameters
    ours = inspect.signature(getattr(Spark25ToolParser, method)).parameters
    missing = [name for name in base if name not in ours]
    assert not missing, (
        f"vLLM drift in ToolParser.{method}: vLLM now passes {missing} "
        f"(base signature {inspect.signature(getattr(compat.tool_parser_base(), method))}). "
        f"Update Spark25ToolParser.{method} in spark2_5_tool_parser/adapter.py."
    )


# Class attributes the parser sets that vLLM must still read; a renamed one is
# silently ignored (forced calls unconstrained, the stream's tail never flushed).
# Each with the feature of RELEASE_SHAPES that brought it (None: every release).
PARSER_SWITCHES = {
    "supports_required_and_named": None,
    "structural_tag_model": "tag_formats",
    "engine_based_streaming": "stream_end",
}


@pytest.mark.parametrize("name", PARSER_SWITCHES)
def test_vllm_still_reads_the_parser_switches(name: str):
    feature = PARSER_SWITCHES[name]
    if feature and not RELEASE_SHAPES[installed_shape()][feature]:
        pytest.skip(f"vLLM {installed_shape()} predates {name!r}: {feature} is not there")
    assert hasattr(compat.tool_parser_base(), name), (
        f"vLLM drift in ToolParser: it no longer defines {name!r}, so the value "
        f"Spark25ToolParser sets is ignored. Find what replaced it and update "
        f"spark2_5_tool_parser/adapter.py (and compat.tool_parser_base if the base moved)."
    )


def test_structural_tag_registry_still_lists_its_formats():
    if not RELEASE_SHAPES[installed_shape()]["tag_formats"]:
        pytest.skip(f"vLLM {installed_shape()} predates the structural-tag format list")
    registry = importlib.import_module("vllm.tool_parsers.structural_tag_registry")
    assert hasattr(registry, "SUPPORTED_STRUCTURAL_TAG_MODELS"), (
        "vLLM drift in vllm.tool_parsers.structural_tag_registry: "
        "SUPPORTED_STRUCTURAL_TAG_MODELS is gone, so forced tool calls would be refused. "
        "Update compat.structural_tag_models."
    )


# --- the guard itself -----------------------------------------------------------------------


def test_the_guard_names_the_symbol_the_parameter_and_the_fix():
    def get_rope(head_size, max_position, is_neox_style=True, rope_params=None):
        """A release that renamed ``rope_parameters``."""

    renamed = Use(
        "get_rope",
        lambda: get_rope,
        (
            Call(1, ("max_position", "is_neox_style", "rope_parameters")),
            Call(1, ("rotary_dim", "max_position", "base", "is_neox_style")),
        ),
        "compat.get_rope",
    )
    with pytest.raises(AssertionError) as error:
        renamed.check()
    message = str(error.value)
    assert message.startswith("vLLM drift in get_rope: no parameter 'rope_parameters'")
    assert "or no parameter 'rotary_dim', 'base'" in message
    assert message.endswith(
        "Update compat.get_rope (detect the new shape, keep the old one) and its test."
    )


def test_the_guard_counts_positional_arguments_and_accepts_either_shape():
    def two_positional(a, b, *, prefix=""):
        pass

    assert call_problem(two_positional, Call(2, ("prefix",))) is None
    assert "too many positional arguments" in call_problem(two_positional, Call(3))
    either = Use("f", lambda: two_positional, (Call(3), Call(2)), "compat.f")
    either.check()  # the second shape binds


def test_the_guard_reads_pydantic_fields_not_extra_keywords():
    from pydantic import BaseModel, ConfigDict

    class Message(BaseModel):
        model_config = ConfigDict(extra="allow")
        content: str | None = None

    assert call_problem(Message, Call(0, ("content",))) is None
    assert "no parameter 'tool_calls'" in call_problem(Message, Call(0, ("content", "tool_calls")))


# --- each release's shape ------------------------------------------------------------------
#
# What each release of the range offers for the features compat and the tests
# detect, read from its published wheel; scripts/run-matrix runs the suite on each:
#
#   release  WeightsMapper  structural-tag  end-of-stream call to the
#            stacking       format list     tool parser (engine_based_streaming)
#   0.23     no             no              no
#   0.24     no             yes             yes
#   0.25+    yes            yes             yes
#
# The installed release must have exactly its row's features: a newer release that
# loses one fails here instead of silently taking an older release's path.
RELEASE_SHAPES = {
    "0.23": {"stacking": False, "tag_formats": False, "stream_end": False},
    "0.24": {"stacking": False, "tag_formats": True, "stream_end": True},
    "0.25+": {"stacking": True, "tag_formats": True, "stream_end": True},
}


def installed_shape() -> str:
    """The ``RELEASE_SHAPES`` row the installed vLLM's release should have."""
    import vllm

    minor = Version(vllm.__version__).release[:2]
    return {(0, 23): "0.23", (0, 24): "0.24"}.get(minor, "0.25+")


def installed_features() -> dict[str, bool]:
    import vllm.tool_parsers.structural_tag_registry as registry

    return {
        "stacking": compat.weights_mapper_stacks(),
        "tag_formats": hasattr(registry, "SUPPORTED_STRUCTURAL_TAG_MODELS"),
        "stream_end": flushes_stream_end(),
    }


def test_the_installed_vllm_has_its_releases_shape():
    import vllm

    shape, features = installed_shape(), installed_features()
    assert features == RELEASE_SHAPES[shape], (
        f"vLLM drift: vLLM {vllm.__version__} has {features}, the {shape} row of "
        f"RELEASE_SHAPES says {RELEASE_SHAPES[shape]}. Give compat.py a branch for the "
        f"new shape (or correct the row), and update the support matrix."
    )


@pytest.fixture
def release_shape(request, monkeypatch):
    """Make the installed vLLM look like ``request.param``'s API (see ``RELEASE_SHAPES``)."""
    import vllm.tool_parsers.structural_tag_registry as registry

    from spark2_5_dev.older_vllm import use_older_weight_loading

    shape, installed = RELEASE_SHAPES[request.param], installed_features()
    lacking = [feature for feature, needed in shape.items() if needed and not installed[feature]]
    if lacking:
        pytest.skip(f"the installed vLLM is older than the {request.param} shape: no {lacking}")
    if not shape["stacking"]:
        use_older_weight_loading(monkeypatch)
    if not shape["tag_formats"]:
        monkeypatch.delattr(registry, "SUPPORTED_STRUCTURAL_TAG_MODELS", raising=False)
    return shape


@pytest.mark.parametrize("release_shape", RELEASE_SHAPES, indirect=True)
def test_compat_takes_the_path_each_release_needs(release_shape, vllm_model_env):
    from vllm.config import VllmConfig, set_current_vllm_config

    from spark2_5_dev.packed_layer import LOADED, Layer, expected_packed, split_weights
    from spark2_5_dev.tool_parsing import TOOLS, chat_request
    from vllm_spark2_5_plugin.spark2_5_names import STACKED_PARAMS

    assert compat.weights_mapper_stacks() is release_shape["stacking"]
    with set_current_vllm_config(VllmConfig()):
        layer = Layer()
    weights = split_weights(seed=2)
    loaded = compat.load_weights(
        layer,
        iter({**weights, "lm_head.weight": torch.zeros(3)}.items()),
        mapper=compat.stacked_weights_mapper(STACKED_PARAMS),
        stacked=STACKED_PARAMS,
        skip_prefixes=["lm_head."],
    )
    assert loaded == LOADED
    qkv, gate_up = expected_packed(weights)
    torch.testing.assert_close(layer.self_attn.q_k_v_proj.weight.detach(), qkv, rtol=0, atol=0)
    torch.testing.assert_close(layer.mlp.gate_up_proj.weight.detach(), gate_up, rtol=0, atol=0)

    tools = chat_request(TOOLS).tools
    (weather,) = [schema for name, schema in compat.function_tools(tools) if name == "get_weather"]
    assert set(weather["properties"]) == {"city", "days", "metric"}
    assert ("glm_4_7" in compat.structural_tag_models()) is release_shape["tag_formats"]
