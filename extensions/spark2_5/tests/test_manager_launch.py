"""A real ``vllm serve`` started with exactly what ``vllm-hust-ext run`` injects.

The environment is the toolkit's prediction of the manager's launch (the
bundle's switch, the bundle list, ``VLLM_PLUGINS`` with the manager's built-in
``ascend`` added) plus the variables only a real launch sets. Measured against
the real manager: ``ascend`` names a plugin this host does not have, and vLLM
warns about each unknown variable; neither may keep the carrier from loading.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from carrier_harness.server import CPU_SERVE_ENV, VllmServer
from spark2_5_dev.carrier import BUNDLE_ID, ENABLE_ENV, LOAD_LINE, SWITCH, clean_env
from vllm_hust_bundle_kit import installed, manager_launch, manager_refusals
from vllm_hust_bundle_kit.contract import (
    ENABLED_BUNDLES_ENVS,
    MANAGER_LAUNCH_ONLY_ENVS,
    PLUGINS_ENV,
    STATE_ENV,
)

pytestmark = pytest.mark.serve


@pytest.fixture
def launch_env(tmp_path, monkeypatch) -> dict[str, str]:
    (bundle,) = installed.select(installed.discover(), [BUNDLE_ID])
    if manager_refusals.launch_refusal(bundle):
        pytest.skip(
            f"the manager would refuse this host: {manager_refusals.launch_refusal(bundle)}"
        )
    # An operator's own allowlist: the manager keeps it and appends to it.
    env = clean_env(**{PLUGINS_ENV: "lora_filesystem_resolver"}, **CPU_SERVE_ENV)
    injected = manager_launch.activation_environment([bundle], env)
    assert injected == {
        ENABLE_ENV: "1",
        ENABLED_BUNDLES_ENVS[0]: BUNDLE_ID,
        PLUGINS_ENV: "lora_filesystem_resolver,ascend,spark2_5",
    }
    launch_only = {name: f"measured-{index}" for index, name in enumerate(MANAGER_LAUNCH_ONLY_ENVS)}
    return {**env, **injected, **launch_only, STATE_ENV: str(tmp_path / "state.json")}


def test_vllm_serve_under_the_managers_environment_loads_the_carrier(
    launch_env, tiny_llama, tmp_path
):
    server = VllmServer(tiny_llama, env=launch_env, log_path=tmp_path / "serve.log")
    with server:
        pass
    log = server.log()
    lines = [line for line in log.splitlines() if LOAD_LINE in line]
    assert len(lines) >= 3, log[-4000:]  # API server, engine core, worker
    for line in lines:
        assert "enabled=1" in line and f"verified={SWITCH.host_range}" in line, line
        # The manager sets the switch and the list; the load line credits the manager.
        assert f"via={ENABLED_BUNDLES_ENVS[0]} lists {BUNDLE_ID}" in line, line
    # The first process puts the carrier's variables on vLLM's Ray copy list; the
    # processes it starts inherit the list (docs/multi-node-and-ray.md).
    copied = [line for line in lines if "ray_actors_copy=" in line]
    assert len(copied) == 1, lines
    assert f"ray_actors_copy={ENABLE_ENV},{ENABLED_BUNDLES_ENVS[0]}" in copied[0]
    # What docs/bundle.md tells operators they will see, and that it is harmless.
    for name in (*MANAGER_LAUNCH_ONLY_ENVS, STATE_ENV):
        assert f"Unknown vLLM environment variable detected: {name}" in log, name


LOAD_PLUGINS = "from vllm.plugins import load_general_plugins; load_general_plugins()"


@pytest.mark.parametrize("manager_kind", ["recorded", "vllm_hust_ext"])
def test_one_launch_without_the_carrier_under_the_manager(launch_env, tmp_path, manager_kind):
    """docs/bundle.md, point 2: `vllm-hust-ext run -- env SPARK2_5_PLUGIN_ENABLE=0 vllm ...`
    launches vLLM without the carrier while the bundle stays enabled."""
    command = ["env", f"{ENABLE_ENV}=0", sys.executable, "-c", LOAD_PLUGINS]
    if manager_kind == "recorded":
        env = launch_env  # what the manager sets, the caller's 0 replaced
    else:
        cli = Path(sys.executable).with_name("vllm-hust-ext")
        if importlib.util.find_spec("vllm_hust_ext") is None or not cli.exists():
            pytest.skip("vllm_hust_ext is not importable here (not on the package index)")
        env = clean_env(**CPU_SERVE_ENV, **{STATE_ENV: str(tmp_path / "state.json")})
        enabled = subprocess.run([cli, "extension", "enable", BUNDLE_ID], env=env, check=False)
        assert enabled.returncode == 0
        command = [str(cli), "run", "--", *command]
    result = subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (line,) = [x for x in (result.stdout + result.stderr).splitlines() if LOAD_LINE in x]
    assert f"enabled=0, reason={ENABLE_ENV}=0" in line, line
