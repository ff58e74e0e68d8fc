"""Drift guard: the vLLM internals the carrier calls still take what it passes.

Each touchpoint (``spark2_5_dev.touchpoints``, one list for this test and the
source check) names a vLLM symbol, the call the carrier makes (positional count
and keyword names, read from ``spark2_5.py``, ``spark2_5_tool_parser/``,
``compat.py`` and ``host_hooks.py``), what vLLM's own code must still do for the
carrier's hooks to fire, and where to fix a break. A vLLM upgrade that renames or
drops one of those fails here with the symbol, the parameter and the function to
update, instead of deep inside an engine start.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from packaging.version import Version

from carrier_harness.source_tree import SourceTree
from spark2_5_dev import source_check
from spark2_5_dev.host_features import flushes_stream_end
from spark2_5_dev.model_building import vllm_model_env
from spark2_5_dev.touchpoints import (
    Call,
    Touchpoint,
    call_problem,
    carrier_override,
    drift_message,
    load,
    not_taken,
    touchpoints,
)
from vllm_spark2_5_plugin import compat

__all__ = ["vllm_model_env"]  # the fixture, for pytest

TOUCHPOINTS = touchpoints()


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
            raise AssertionError(drift_message(self.symbol, problems, self.fix))


def _ids(found: list[Touchpoint]) -> list[str]:
    return [touchpoint.symbol for touchpoint in found]


def loaded(touchpoint: Touchpoint) -> Any:
    """The installed vLLM's object; a skip where this release predates it or the
    carrier goes without it (the source check's ``--strict`` still names it)."""
    if touchpoint.feature and not RELEASE_SHAPES[installed_shape()][touchpoint.feature]:
        pytest.skip(f"vLLM {installed_shape()} predates {touchpoint.symbol}")
    try:
        return load(touchpoint)
    except (ImportError, AttributeError) as error:
        if touchpoint.without and not touchpoint.feature:
            pytest.skip(f"{touchpoint.symbol} is missing ({error}): {touchpoint.without}")
        raise AssertionError(
            drift_message(touchpoint.symbol, [f"gone ({error})"], touchpoint.fix)
        ) from error


@pytest.fixture(scope="module")
def installed_source() -> SourceTree:
    import vllm

    return SourceTree(Path(vllm.__file__).parent.parent, ("vllm",))


def assert_in_source(touchpoint: Touchpoint, installed_source: SourceTree) -> None:
    result = source_check.check(installed_source, touchpoint, source_check.carrier_tree())
    assert result.status == source_check.OK, drift_message(
        touchpoint.symbol, [result.detail], touchpoint.fix
    )


CALLED = [touchpoint for touchpoint in TOUCHPOINTS if touchpoint.calls]


@pytest.mark.parametrize("touchpoint", CALLED, ids=_ids(CALLED))
def test_vllm_still_takes_what_the_carrier_passes(touchpoint: Touchpoint):
    target = loaded(touchpoint)
    Use(touchpoint.symbol, lambda: target, touchpoint.calls, touchpoint.fix).check()


REACHED = [t for t in TOUCHPOINTS if not (t.calls or t.does or t.overridden_by)]


@pytest.mark.parametrize("touchpoint", REACHED, ids=_ids(REACHED))
def test_vllm_still_has_what_the_carrier_reaches(touchpoint: Touchpoint, installed_source):
    """Names the carrier imports, class attributes the parser sets that vLLM must still
    read (a renamed one is silently ignored: forced calls unconstrained, the stream's
    tail never flushed), private tables and attributes host_hooks reaches. A model's
    field or an attribute set in ``__init__`` is no class attribute: read in the source."""
    try:
        loaded(touchpoint)
    except AssertionError as gone:
        if not isinstance(gone.__cause__, AttributeError) or len(touchpoint.path) < 2:
            raise
        assert_in_source(touchpoint, installed_source)


WAITED_FOR = [touchpoint for touchpoint in TOUCHPOINTS if touchpoint.does]


@pytest.mark.parametrize("touchpoint", WAITED_FOR, ids=_ids(WAITED_FOR))
def test_vllm_still_does_what_the_carriers_hooks_wait_for(touchpoint, installed_source):
    """E.g. the adapter checks start when ``LoRAModelManager.__init__`` sets
    ``self.model.lora_manager = self``; a weight update starts and finishes when vLLM's
    layerwise reload sets ``model._do_torchao_reload``. Read in the installed source."""
    loaded(touchpoint)
    assert_in_source(touchpoint, installed_source)


OVERRIDDEN = [touchpoint for touchpoint in TOUCHPOINTS if touchpoint.overridden_by]


@pytest.mark.parametrize("touchpoint", OVERRIDDEN, ids=_ids(OVERRIDDEN))
def test_the_parser_overrides_take_every_parameter_vllm_passes(touchpoint: Touchpoint):
    """What vLLM calls on Spark25ToolParser: the base's parameters must all be ours."""
    base = inspect.signature(loaded(touchpoint))
    missing = not_taken(base, inspect.signature(carrier_override(touchpoint)))
    assert not missing, (
        f"vLLM drift in {touchpoint.symbol}: vLLM now passes {missing} "
        f"(base signature {base}). Update {touchpoint.fix}."
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
