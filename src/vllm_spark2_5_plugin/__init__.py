# SPDX-License-Identifier: Apache-2.0
"""Spark2_5 for vLLM, shipped as a default-off vLLM-HUST carrier.

``register`` is the ``vllm.general_plugins`` entry point (name ``spark2_5``).
vLLM calls it in every process. Until its switch is on it imports nothing but
the standard library and touches no registry; either way it logs exactly one
INFO line under the ``vllm`` logger so a normal ``vllm serve`` log proves the
carrier was discovered. The bundle id and the enable variable come from the
bundle manifest rendered from ``manifest.toml``.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache

from vllm_hust_bundle_kit.entry import carrier_entry_point
from vllm_hust_bundle_kit.switch import CarrierSwitch, SwitchDecision
from vllm_spark2_5_plugin.settings import OVERRIDE_ENV

__all__ = ["OVERRIDE_ENV", "carrier_switch", "register"]

BUNDLE_PACKAGE = "vllm_spark2_5_plugin.bundles.spark2_5"


@cache
def carrier_switch() -> CarrierSwitch:
    return CarrierSwitch.from_bundle_package(
        BUNDLE_PACKAGE, carrier=f"{__name__}:register", override_env=OVERRIDE_ENV
    )


def _register_enabled(decision: SwitchDecision) -> Sequence[str]:
    from vllm_spark2_5_plugin._registration import register_enabled

    report = register_enabled(override=decision.override, settings=carrier_switch().settings_in())
    return report.load_line_details()


register = carrier_entry_point(
    name="vllm-spark2_5-plugin",
    logger_name="vllm.spark2_5_plugin",
    load_switch=carrier_switch,
    register_enabled=_register_enabled,
)
