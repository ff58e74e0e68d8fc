"""Processes the tests start (``python -m spark2_5_dev...``, ``vllm serve``) import
the same development helpers as pytest: its ``pythonpath`` setting, exported. With
``CARRIER_HARNESS_ENGINE_FREE=1`` the run is engine-free (``carrier_harness.engine_free``):
a test that would start a vLLM engine is skipped, saying so."""

from __future__ import annotations

import os

import pytest

from carrier_harness import engine_free


def pytest_configure(config) -> None:
    paths = [str(path) for path in config.getini("pythonpath")]
    inherited = [path for path in os.environ.get("PYTHONPATH", "").split(os.pathsep) if path]
    missing = [path for path in paths if path not in inherited]
    os.environ["PYTHONPATH"] = os.pathsep.join([*missing, *inherited])
    if engine_free.active():
        engine_free.start(pytest.skip)
        config.pluginmanager.register(engine_free.plugin(), "engine-free")
