"""Fixtures of the extension-manager contract and release tests: this project's
bundle as installed, and its wheel as built."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from carrier_harness.env import clean_env
from carrier_harness.manager import run
from carrier_harness.project import (
    PROJECT_ROOT,
    bundle_source,
    fake_host_distribution,
    our_bundles,
)
from vllm_hust_bundle_kit import installed
from vllm_hust_bundle_kit.contract import VLLM_PLUGIN_GROUP


@pytest.fixture(scope="session")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This project's wheel, built once as the publish workflow builds it (a fixed
    ``SOURCE_DATE_EPOCH``), without the manager's variables in the environment."""
    out = tmp_path_factory.mktemp("wheel")
    result = run(
        [sys.executable, "-m", "build", "--wheel", "--outdir", str(out), str(PROJECT_ROOT)],
        env=clean_env(SOURCE_DATE_EPOCH="1700000000"),
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (built,) = out.glob("*.whl")
    return built


@pytest.fixture(scope="module")
def bundle() -> installed.Bundle:
    return our_bundles()[0]


@pytest.fixture(scope="module")
def switch(bundle) -> str:
    (name,) = [n for n, v in bundle.manifest["activation"]["environment"].items() if v == "1"]
    return name


@pytest.fixture(scope="module")
def plugin(bundle) -> str:
    (name,) = [
        ep["name"]
        for ep in bundle.manifest["activation"]["entry_points"]
        if ep["group"] == VLLM_PLUGIN_GROUP
    ]
    return name


@pytest.fixture
def verified_host(bundle, tmp_path):
    """A metadata-only vllm of the first verified release, for launch predictions that
    must not depend on which vLLM runs the suite."""
    verified = bundle_source(bundle.extension_id)["host"]["verified_on"][0]
    return fake_host_distribution(tmp_path / "host", "vllm", verified)


@pytest.fixture
def state_file(tmp_path):
    return tmp_path / "config" / "vllm-hust-ext.json"
