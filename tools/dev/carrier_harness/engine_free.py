"""The engine-free run: every test, each up to the moment it would start a vLLM engine.

For a release whose engine cannot start here (vLLM 0.34's x86 CPU platform needs
triton-cpu, which no package source here serves), ``scripts/run-matrix
--engine-free`` runs the suite with ``CARRIER_HARNESS_ENGINE_FREE=1`` (the root
``conftest.py`` then loads this plugin) and ``-m "not serve"``. Building a
``VllmConfig`` is the first step of every engine (and where 0.34 refuses): a test
that builds one, in its own process or in a process it starts (a driver, a
script), is reported skipped with :data:`MARK` as the reason, whatever it checked
before; every other test runs as in a whole-suite run. The count of those skips is
what the run did not cover.

Processes the tests start get the same hook from ``tools/engine_free/sitecustomize.py``,
put on their ``PYTHONPATH`` here; ``scripts/as-cpu-class`` uses a ``sitecustomize``
of its own, so the two do not combine.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from vllm_hust_bundle_kit import deferred

ENV = "CARRIER_HARNESS_ENGINE_FREE"
MARK = "engine-free run: it would start a vLLM engine (it builds a VllmConfig)"
SITE = Path(__file__).resolve().parents[2] / "engine_free"
EXIT_STATUS = 75  # a process stopped by the hook, its MARK on stderr
HEADER = f"{ENV}=1: each test that builds a VllmConfig, here or in a process it starts, is skipped"


def active() -> bool:
    return os.environ.get(ENV) == "1"


def refuse_engines(stop: Callable[[str], Any]) -> None:
    """Make building a ``VllmConfig`` in this process call ``stop(MARK)`` instead."""

    def patch(config: ModuleType) -> None:
        cls = config.VllmConfig
        if getattr(cls.__post_init__, "engine_free", False):
            return

        def refuse(self: Any, *args: Any, **kwargs: Any) -> None:
            stop(MARK)

        refuse.engine_free = True  # type: ignore[attr-defined]
        cls.__post_init__ = refuse

    deferred.after_import(("vllm.config",), patch)


def exit_process(message: str) -> None:
    """A started process ends here, saying why where its log is read."""
    print(message, file=sys.stderr, flush=True)
    os._exit(EXIT_STATUS)


# --- the pytest process (the root conftest.py calls these when ENV is set) ---------------


def start(skip: Callable[..., Any]) -> None:
    """Refuse engines here with ``skip`` (``pytest.skip``), and in every process the
    tests start, through their ``PYTHONPATH``."""
    paths = [path for path in os.environ.get("PYTHONPATH", "").split(os.pathsep) if path]
    os.environ["PYTHONPATH"] = os.pathsep.join([str(SITE), *(p for p in paths if p != str(SITE))])
    os.environ[ENV] = "1"
    refuse_engines(lambda reason: skip(reason, allow_module_level=True))


def as_skip(report: Any) -> None:
    """Report a test stopped at :data:`MARK` as a skip at the test: one that failed
    because a process it started stopped there, and one ``pytest.skip`` stopped in
    pytest's own process (pytest names the line that raised, in this module)."""
    if (report.failed or report.skipped) and MARK in report.longreprtext:
        report.outcome = "skipped"
        report.longrepr = (report.location[0], report.location[1] or 0, f"Skipped: {MARK}")
