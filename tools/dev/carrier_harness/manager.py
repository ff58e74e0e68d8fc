"""Driving the extension manager's contract from tests: the toolkit's CLI, the real
``vllm-hust-ext`` where it is installed, and state files written as it writes them."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from carrier_harness.env import clean_env
from vllm_hust_bundle_kit.contract import STATE_ENV

REAL_MANAGER_MISSING = (
    "vllm_hust_ext is not importable here (not on the package index; install it from its git "
    "repository to run the contract through the real manager)"
)
MANAGERS = ["recorded", "vllm_hust_ext"]
TOOL = str(Path(sys.executable).with_name("vllm-hust-bundle"))


def run(argv, env, **kwargs) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, env=env, capture_output=True, text=True, timeout=300, check=False, **kwargs
    )


def real_manager() -> str:
    """The real manager's command, or a skip saying why there is none."""
    executable = Path(sys.executable).with_name("vllm-hust-ext")
    if importlib.util.find_spec("vllm_hust_ext") is None or not executable.exists():
        pytest.skip(REAL_MANAGER_MISSING)
    return str(executable)


def manager_env(state_file: Path | None, host: Path | None = None, **extra: str) -> dict[str, str]:
    """A clean environment whose manager state is ``state_file`` (None: the per-user default)
    and whose host distribution is ``host`` (None: the installed one)."""
    env = clean_env(**({STATE_ENV: str(state_file)} if state_file else {}), **extra)
    if host is not None:  # first, so that it is the host importlib.metadata finds
        inherited = [path for path in env.get("PYTHONPATH", "").split(os.pathsep) if path]
        env["PYTHONPATH"] = os.pathsep.join([str(host), *inherited])
    return env


def write_state(path: Path, extensions: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"schema_version": 2, "extensions": extensions}))


def enable_in(state_file: Path, *extension_ids: str) -> None:
    """The state file as `vllm-hust-ext extension enable` writes it for ``extension_ids``."""
    write_state(state_file, {i: {"enabled": True, "configuration": {}} for i in extension_ids})


def inspect(extension_id: str, env: dict[str, str]) -> tuple[int, dict, str]:
    """``vllm-hust-bundle inspect --json``: exit status, the bundle's report, stderr."""
    result = run([TOOL, "inspect", "--json", extension_id], env=env)
    (report,) = json.loads(result.stdout)
    return result.returncode, report, result.stderr
