# SPDX-License-Identifier: Apache-2.0
"""A carrier's ``vllm.general_plugins`` entry point (standard library only).

vLLM calls a general plugin in every process it starts (API server, engine
core, workers). :func:`carrier_entry_point` builds that callable for a carrier:
it runs once per process, reads the carrier's switch, and logs exactly one INFO
load line under ``vllm.`` whether the carrier is enabled or not, so a normal
``vllm serve`` log proves the carrier was discovered. Only when the switch is
open does it call the carrier's ``register_enabled``, which is where anything
heavy (vLLM, torch) gets imported. Nothing raises into vLLM.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Sequence

from vllm_hust_bundle_kit.switch import CarrierSwitch, SwitchDecision

LOAD_LINE = "%s loaded (%s)"


def log_line(logger: logging.Logger, level: int, message: str, *args: object) -> None:
    """Log under ``vllm.``; before vLLM has configured logging, print it ourselves.

    ``vllm serve`` loads general plugins while it builds its argument parser,
    before it installs its log handler; without this the API server process
    would drop the line.
    """
    if logging.getLogger("vllm").handlers or logging.getLogger().handlers:
        logger.log(level, message, *args)
        return
    threshold = logging.getLevelName(os.environ.get("VLLM_LOGGING_LEVEL", "INFO").upper())
    if isinstance(threshold, int) and level < threshold:
        return
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(
        logging.Formatter(
            "(%(processName)s pid=%(process)d) %(levelname)s %(asctime)s "
            f"[{logger.name.rpartition('.')[2]}] %(message)s",
            "%m-%d %H:%M:%S",
        )
    )
    previous_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(level)
    try:
        logger.log(level, message, *args)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(previous_level)


def _host_version(switch: CarrierSwitch) -> str:
    import importlib.metadata  # enabled processes only: it costs a disabled one ~80 ms

    try:
        return importlib.metadata.version(switch.host_name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _outside_verified_range(switch: CarrierSwitch, host_version: str) -> str | None:
    """The warning for a host the carrier was not verified on, or None inside the range."""
    from vllm_hust_bundle_kit.versions import host_in_range  # enabled processes only

    if host_in_range(host_version, switch.host_range):
        return None
    return (
        f"{switch.host_name} {host_version} is outside the verified range {switch.host_range}; "
        "the carrier runs, but nothing it does was tested on this release. What was "
        f"verified, and what the extension manager would do: `vllm-hust-bundle inspect "
        f"{switch.bundle_id}`"
    )


def _enabled_details(
    logger: logging.Logger,
    name: str,
    switch: CarrierSwitch,
    decision: SwitchDecision,
    register_enabled: Callable[[SwitchDecision], Sequence[str]],
) -> list[str]:
    """Register the carrier and say so; a host outside the verified range is warned first."""
    host_version = _host_version(switch)
    outside = _outside_verified_range(switch, host_version)
    if outside:
        log_line(logger, logging.WARNING, "%s: %s", name, outside)
    return [
        "enabled=1",
        f"via={decision.source}",
        *register_enabled(decision),
        f"{switch.host_name}={host_version}",
        f"verified={switch.host_range}" + (" (outside it)" if outside else ""),
    ]


def _log_load_line(
    logger: logging.Logger,
    name: str,
    switch: CarrierSwitch,
    register_enabled: Callable[[SwitchDecision], Sequence[str]],
) -> None:
    """Decide, register only when the switch is on, and log the one load line."""
    decision = switch.decide()
    for warning in decision.warnings:
        log_line(logger, logging.WARNING, "%s: %s", name, warning)
    if decision.enabled:
        details = _enabled_details(logger, name, switch, decision, register_enabled)
    else:
        details = [
            "enabled=0",
            f"reason={decision.source}",
            f"to enable set {switch.enable_env}=1 or enable bundle {switch.bundle_id} "
            "with vllm-hust-ext",
        ]
    log_line(logger, logging.INFO, LOAD_LINE, name, ", ".join(details))


def _log_failure(
    logger: logging.Logger, name: str, switch: CarrierSwitch | None, exc: Exception
) -> None:
    """The error line in place of the load line; ``switch`` is None when it failed to load."""
    fix = (
        f"check that the installed {switch.host_name} is in the carrier's verified range "
        f"{switch.host_range} (`vllm-hust-bundle inspect {switch.bundle_id}`) or unset "
        f"{switch.enable_env} to disable the carrier"
        if switch is not None
        else "reinstall the distribution"
    )
    log_line(
        logger,
        logging.ERROR,
        "%s failed to register (%s: %s); vLLM continues without it. Fix: %s.",
        name,
        type(exc).__name__,
        exc,
        fix,
    )


def carrier_entry_point(
    *,
    name: str,
    logger_name: str,
    load_switch: Callable[[], CarrierSwitch],
    register_enabled: Callable[[SwitchDecision], Sequence[str]],
) -> Callable[[], None]:
    """The ``register`` callable for one carrier.

    ``name`` starts the load line (``<name> loaded (enabled=...)``); ``logger_name``
    must be under ``vllm.``. ``load_switch`` returns the carrier's switch (called once,
    inside the error guard). ``register_enabled`` registers the carrier with vLLM
    and returns ``key=value`` details for the load line.
    """
    logger = logging.getLogger(logger_name)
    done = False

    def register() -> None:
        nonlocal done
        if done:
            return
        done = True
        switch = None
        try:
            switch = load_switch()
            _log_load_line(logger, name, switch, register_enabled)
        except Exception as exc:  # vLLM must keep starting whatever happens here
            _log_failure(logger, name, switch, exc)

    return register
