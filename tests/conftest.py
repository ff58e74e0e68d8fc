"""Fixtures of the extension-manager contract tests: this project's bundle as installed."""

from __future__ import annotations

import pytest

from carrier_harness.project import bundle_source, fake_host_distribution, our_bundles
from vllm_hust_bundle_kit import installed
from vllm_hust_bundle_kit.contract import VLLM_PLUGIN_GROUP


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
