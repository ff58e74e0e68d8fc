"""The engine-free run: every test, each up to the moment it would start a vLLM engine.

For a release whose engine cannot start here (vLLM 0.34's x86 CPU platform needs
triton-cpu, which no package source here serves), ``scripts/run-matrix
--engine-free`` runs the suite with ``CARRIER_HARNESS_ENGINE_FREE=1`` (the root
``conftest.py`` then registers :func:`plugin`) and ``-m "not serve"``. Building a
``VllmConfig`` is the first step of every engine (and where 0.34 refuses): a test
that builds one, in pytest's process or in a process it starts (a driver, a
benchmark's engine, a script), is reported skipped with :data:`MARK` as the reason,
whatever it checked before; every other test runs as in a whole-suite run. The
count of those skips is what the run did not cover.

Processes the tests start get the hook from ``tools/sitecustomize/sitecustomize.py``,
put on their ``PYTHONPATH`` here; each process it stops writes a line to the file
:data:`STOPS_ENV` names, so a test that fails after one of its processes stopped
is known to have failed for that, whatever its message shows.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

ENV = "CARRIER_HARNESS_ENGINE_FREE"
STOPS_ENV = "CARRIER_HARNESS_ENGINE_FREE_STOPS"
MARK = "engine-free run: it would start a vLLM engine (it builds a VllmConfig)"
HEADER = f"{ENV}=1: each test that builds a VllmConfig, here or in a process it starts, is skipped"
SITE = Path(__file__).resolve().parents[2] / "sitecustomize"
EXIT_STATUS = 75  # a process stopped by the hook
_stop: list[Callable[[str], Any]] = []  # what building a VllmConfig does in this process


def active() -> bool:
    return os.environ.get(ENV) == "1"


def refuse_engines(stop: Callable[[str], Any]) -> None:
    """Make building a ``VllmConfig`` in this process call ``stop(MARK)`` instead (the
    last ``stop`` given: pytest's process replaces the one its sitecustomize set)."""
    from carrier_harness.import_hook import after_import

    first = not _stop
    _stop[:] = [stop]

    def patch(config: ModuleType) -> None:
        def refuse(self: Any, *args: Any, **kwargs: Any) -> None:
            _stop[0](MARK)

        config.VllmConfig.__post_init__ = refuse

    if first:
        after_import(("vllm.config",), patch)


def exit_process(message: str) -> None:
    """A started process ends here, saying why on stderr and in the stops file."""
    print(f"[{ENV}] stopped: {message}", file=sys.stderr, flush=True)
    with open(os.environ[STOPS_ENV], "a", encoding="utf-8") as stops:
        stops.write(f"{os.getpid()} {' '.join(sys.argv)}\n")
    os._exit(EXIT_STATUS)


def stops() -> int:
    """How many started processes the hook stopped so far in this run."""
    with open(os.environ[STOPS_ENV], encoding="utf-8") as file:
        return sum(1 for _ in file)


# --- the pytest process ------------------------------------------------------------------


def start(skip: Callable[..., Any]) -> None:
    """Refuse engines here with ``skip`` (``pytest.skip``), and in every process the
    tests start, through their ``PYTHONPATH``."""
    paths = [path for path in os.environ.get("PYTHONPATH", "").split(os.pathsep) if path]
    os.environ["PYTHONPATH"] = os.pathsep.join([str(SITE), *(p for p in paths if p != str(SITE))])
    os.environ[ENV] = "1"
    handle, os.environ[STOPS_ENV] = tempfile.mkstemp(prefix="engine-free-stops-")
    os.close(handle)
    refuse_engines(lambda reason: skip(reason, allow_module_level=True))


def plugin() -> Any:
    """The hooks that report each test stopped at :data:`MARK` as a skip at the test."""
    import pytest

    class EngineFree:
        def __init__(self) -> None:
            self.before: dict[str, int] = {}
            self.stopped: list[BaseException] = []  # a module fixture re-raises its own

        @pytest.hookimpl(hookwrapper=True)
        def pytest_runtest_setup(self, item: Any) -> Any:
            self.before[item.nodeid] = stops()
            yield

        @pytest.hookimpl(hookwrapper=True)
        def pytest_runtest_makereport(self, item: Any, call: Any) -> Any:
            report = (yield).get_result()
            error = call.excinfo.value if call.excinfo else None
            # A process it started stopped: whether it then failed or passed (a test
            # that wants a process to fail), it did not check what it was for.
            stopped = stops() > self.before.get(item.nodeid, stops())
            reraised = error is not None and any(error is seen for seen in self.stopped)
            if (report.failed or report.when == "call") and (stopped or reraised):
                if error is not None:
                    self.stopped.append(error)
            elif not (report.skipped and MARK in str(report.longrepr)):
                return
            # pytest names the line that raised (here), not the test.
            report.outcome = "skipped"
            report.longrepr = (report.location[0], report.location[1] or 0, f"Skipped: {MARK}")

        def pytest_report_header(self) -> str:
            return HEADER

    return EngineFree()
