"""The carrier's activation gate: pure environment parsing, no heavy imports.

This module is imported by the ``vllm.general_plugins`` entry point in every
vLLM process, so it must stay cheap: standard library only.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

ENABLE_ENV = "SPARK2_5_PLUGIN_ENABLE"
OVERRIDE_ENV = "SPARK2_5_PLUGIN_OVERRIDE"
BUNDLE_ID = "org.vllm-hust.spark2-5"
# What `vllm-hust-ext run` sets; older manager builds used the second name.
ENABLED_BUNDLES_ENVS = ("VLLMHUST_EXT_ENABLED_BUNDLES", "VLLM_HUST_EXT_ENABLED_BUNDLES")

_ENABLE_VALUES = {"1": True, "0": False}
_OVERRIDE_TRUE = {"1", "true", "yes", "on"}
_OVERRIDE_FALSE = {"0", "false", "no", "off"}


@dataclass(frozen=True)
class GateDecision:
    """Whether the carrier registers anything in this process, and why."""

    enabled: bool
    source: str
    override: bool = False
    warnings: tuple[str, ...] = field(default_factory=tuple)


def _bundle_listed(environ: Mapping[str, str]) -> str | None:
    for name in ENABLED_BUNDLES_ENVS:
        ids = {item.strip() for item in environ.get(name, "").split(",")}
        if BUNDLE_ID in ids:
            return name
    return None


def _parse_override(environ: Mapping[str, str], warnings: list[str]) -> bool:
    raw = environ.get(OVERRIDE_ENV)
    if raw is None or raw.strip().lower() in _OVERRIDE_FALSE | {""}:
        return False
    if raw.strip().lower() in _OVERRIDE_TRUE:
        return True
    warnings.append(
        f"{OVERRIDE_ENV}={raw!r} is not understood; accepted values are "
        f"{', '.join(sorted(_OVERRIDE_TRUE))} (override) or "
        f"{', '.join(sorted(_OVERRIDE_FALSE))} (no override); treating it as no override"
    )
    return False


def decide(environ: Mapping[str, str] | None = None) -> GateDecision:
    """Read the gate from ``environ`` (default: the process environment)."""
    env = os.environ if environ is None else environ
    warnings: list[str] = []
    override = _parse_override(env, warnings)

    raw = env.get(ENABLE_ENV)
    if raw == "1":
        return GateDecision(True, f"{ENABLE_ENV}=1", override, tuple(warnings))
    if raw == "0":
        # An explicit opt-out wins over the extension manager's bundle list.
        return GateDecision(False, f"{ENABLE_ENV}=0", override, tuple(warnings))
    if raw is not None:
        warnings.append(
            f"{ENABLE_ENV}={raw!r} is not an accepted value; use {ENABLE_ENV}=1 to enable "
            f"the Spark2_5 carrier or {ENABLE_ENV}=0 (or unset) to disable it; "
            "the carrier stays disabled"
        )
        return GateDecision(False, f"{ENABLE_ENV} invalid", override, tuple(warnings))

    listed_in = _bundle_listed(env)
    if listed_in is not None:
        return GateDecision(True, f"{listed_in} lists {BUNDLE_ID}", override, tuple(warnings))
    return GateDecision(False, f"{ENABLE_ENV} unset", override, tuple(warnings))
