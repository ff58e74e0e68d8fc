"""The Spark2_5 carrier's switches as its tests and benchmarks use them."""

from __future__ import annotations

from carrier_harness import env
from vllm_hust_bundle_kit.contract import ENABLED_BUNDLES_ENVS, PLUGINS_ENV
from vllm_spark2_5_plugin import OVERRIDE_ENV, carrier_switch

SWITCH = carrier_switch()
BUNDLE_ID = SWITCH.bundle_id
ENABLE_ENV = SWITCH.enable_env
LOAD_LINE = "vllm-spark2_5-plugin loaded ("
CARRIER_ENVS = (ENABLE_ENV, OVERRIDE_ENV, *ENABLED_BUNDLES_ENVS, PLUGINS_ENV)


def clean_env(**overrides: str) -> dict[str, str]:
    """The test process environment without any carrier switch, plus ``overrides``."""
    return env.clean_env(drop=CARRIER_ENVS, **overrides)
