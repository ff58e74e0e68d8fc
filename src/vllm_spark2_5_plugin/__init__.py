"""Spark2_5 for vLLM, shipped as a default-off vLLM-HUST carrier.

``register`` is the ``vllm.general_plugins`` entry point (name ``spark2_5``).
vLLM calls it in every process. Until the gate is open it imports nothing but
the standard library and touches no registry; either way it logs exactly one
INFO line under the ``vllm`` logger so a normal ``vllm serve`` log proves the
carrier was discovered.
"""

from __future__ import annotations

import logging
import os
import sys

from vllm_spark2_5_plugin._gate import BUNDLE_ID, ENABLE_ENV, OVERRIDE_ENV, decide

__all__ = ["register"]

# Under `vllm.` so that vLLM's logging configuration prints it.
logger = logging.getLogger("vllm.spark2_5_plugin")

_LOAD_LINE = "vllm-spark2_5-plugin loaded (%s)"
_registered_in_this_process = False


def _log(level: int, message: str, *args: object) -> None:
    """Log under ``vllm.``; before vLLM has configured logging, print it ourselves.

    ``vllm serve`` loads general plugins while it builds its argument parser,
    before it installs its log handler; without this the API server process
    would drop the load line.
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
            "[spark2_5_plugin] %(message)s",
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


def register() -> None:
    """Entry point: register Spark2_5 with vLLM when the carrier's gate is open."""
    global _registered_in_this_process
    if _registered_in_this_process:
        return
    _registered_in_this_process = True
    try:
        _register()
    except Exception as exc:  # vLLM must keep starting whatever happens here
        _log(
            logging.ERROR,
            "vllm-spark2_5-plugin failed to register Spark2_5 (%s: %s); vLLM continues "
            "without it. Fix: check that the installed vLLM is in the carrier's verified "
            "range (`spark2-5-bundle inspect`) or unset %s to disable the carrier.",
            type(exc).__name__,
            exc,
            ENABLE_ENV,
        )


def _register() -> None:
    decision = decide()
    for warning in decision.warnings:
        _log(logging.WARNING, "vllm-spark2_5-plugin: %s", warning)
    if not decision.enabled:
        _log(
            logging.INFO,
            _LOAD_LINE,
            f"enabled=0, reason={decision.source}; to serve Spark2_5ForCausalLM set "
            f"{ENABLE_ENV}=1 or enable bundle {BUNDLE_ID} with vllm-hust-ext",
        )
        return

    from vllm import __version__ as vllm_version

    from vllm_spark2_5_plugin._registration import register_enabled, verified_host_range

    report = register_enabled(override=decision.override)
    details = [
        "enabled=1",
        f"via={decision.source}",
        f"registered={','.join(report.registered) or 'nothing'}",
    ]
    if report.stood_down:
        details.append(
            f"stood_down={','.join(report.stood_down)} (vLLM already provides them; "
            f"set {OVERRIDE_ENV}=1 to use this carrier's)"
        )
    details += [f"vllm={vllm_version}", f"verified={verified_host_range()}"]
    _log(logging.INFO, _LOAD_LINE, ", ".join(details))
