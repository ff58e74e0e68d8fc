"""Processes the tests start (``python -m spark2_5_dev...``, ``vllm serve``) import
the same development helpers as pytest: its ``pythonpath`` setting, exported."""

from __future__ import annotations

import os


def pytest_configure(config) -> None:
    paths = [str(path) for path in config.getini("pythonpath")]
    inherited = [path for path in os.environ.get("PYTHONPATH", "").split(os.pathsep) if path]
    missing = [path for path in paths if path not in inherited]
    os.environ["PYTHONPATH"] = os.pathsep.join([*missing, *inherited])
