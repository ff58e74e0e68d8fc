# SPDX-License-Identifier: Apache-2.0
"""The carrier's environment variables besides its switch (standard library only).

The switch itself (``SPARK2_5_PLUGIN_ENABLE``) is declared in the bundle manifest and
read by the toolkit; every variable here starts with the same prefix, so the
carrier's processes, Ray actors included, receive it (``CarrierSwitch.settings_in``).
Values are read with the toolkit's on/off rules.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from vllm_hust_bundle_kit.switch import switch_value

# Replaces an implementation vLLM already has in tree instead of standing down.
OVERRIDE_ENV = "SPARK2_5_PLUGIN_OVERRIDE"
# Checks every checkpoint weight for NaN/Inf while loading (costs load time).
CHECK_FINITE_ENV = "SPARK2_5_PLUGIN_CHECK_FINITE"


def check_finite_requested(environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``SPARK2_5_PLUGIN_CHECK_FINITE`` asks for the NaN/Inf check of every
    weight; a value that is not on/off is an error (a check asked for by a typo
    must not silently not run)."""
    env = os.environ if environ is None else environ
    try:
        return bool(switch_value(CHECK_FINITE_ENV, env.get(CHECK_FINITE_ENV)))
    except ValueError as exc:
        raise ValueError(f"{exc}; on checks every weight for NaN/Inf while loading") from None
