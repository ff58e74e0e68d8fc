"""The switch reaches every Ray actor vLLM starts for the engine, on a head started without it.

vLLM's CPU build refuses Ray executors, so ``spark2_5_dev.ray_workers`` runs
vLLM's own ``RayWorkerWrapper`` in real Ray actors and hands each one the
driver's environment by one of vLLM's rules: the V2 executor's (the whole
environment, filling in what the node lacks), the older executor's (0.23 to
0.32) and the data-parallel engine-core actors' (vLLM's copy list). Each worker then runs
``init_worker``, where it loads its plugins, and reports whether
``Spark2_5ForCausalLM`` resolves there.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from carrier_harness.server import CPU_SERVE_ENV
from spark2_5_dev.carrier import BUNDLE_ID, ENABLE_ENV, clean_env
from vllm_hust_bundle_kit.contract import ENABLED_BUNDLES_ENVS, PLUGINS_ENV
from vllm_spark2_5_plugin._registration import ARCHITECTURE, RAY_EXTRA_ENV_VARS

# Rules that hand actors only the names on vLLM's copy list (the older executor:
# 0.23 to 0.32).
COPY_LIST_RULES = ("ray_executor", "dp_engine_actor")
LIST = ENABLED_BUNDLES_ENVS[0]


def workers(model, switch: dict[str, str], node: dict[str, str] = (), control=False) -> dict:
    """One Ray head (started before the switch is set), one worker per rule: their reports."""
    pytest.importorskip("ray")
    argv = [sys.executable, "-m", "spark2_5_dev.ray_workers", str(model)]
    argv += [f"--switch={k}={v}" for k, v in switch.items()]
    argv += [f"--node={k}={v}" for k, v in dict(node).items()]
    argv += [f"--report={name}" for name in (ENABLE_ENV, LIST, RAY_EXTRA_ENV_VARS)]
    argv += ["--control"] if control else []
    env = clean_env(**CPU_SERVE_ENV, RAY_USAGE_STATS_ENABLED="0")
    process = subprocess.Popen(
        argv,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = process.communicate(timeout=600)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        out, err = process.communicate()
    assert process.returncode == 0, err[-4000:]
    return json.loads(out.splitlines()[-1])


def test_the_carrier_appends_to_the_copy_list_and_keeps_the_operators_names(monkeypatch):
    import vllm.envs  # noqa: F401 - where it is imported, the list is extended right away

    from vllm_spark2_5_plugin import _registration

    monkeypatch.setenv(RAY_EXTRA_ENV_VARS, " OPERATORS_FLAG, ")
    assert _registration.copy_to_ray_actors([ENABLE_ENV, LIST, ENABLE_ENV]) == [ENABLE_ENV, LIST]
    assert _registration.copy_to_ray_actors([ENABLE_ENV]) == []  # already listed: nothing changes
    assert os.environ[RAY_EXTRA_ENV_VARS] == f"OPERATORS_FLAG,{ENABLE_ENV},{LIST}"


COPY_WHEN_VLLM_LOADS = f"""
import os, sys
from vllm_spark2_5_plugin import _registration
added = _registration.copy_to_ray_actors([{ENABLE_ENV!r}])
before = (list(added), os.environ.get({RAY_EXTRA_ENV_VARS!r}), "vllm" in sys.modules)
import vllm.envs
print(before, (added, os.environ.get({RAY_EXTRA_ENV_VARS!r})))
"""


def test_the_copy_list_is_extended_when_vllm_loads_and_vllm_is_not_imported_for_it():
    result = subprocess.run(
        [sys.executable, "-c", COPY_WHEN_VLLM_LOADS],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    before, after = result.stdout.strip().splitlines()[-1].split(") (")
    assert before == "([], None, False"
    assert after == f"[{ENABLE_ENV!r}], {ENABLE_ENV!r})"


@pytest.mark.slow
def test_the_switch_reaches_the_workers_of_every_executor(spark_chat_model):
    """`SPARK2_5_PLUGIN_ENABLE=1 vllm serve ...` on the head; the Ray node never saw it."""
    report = workers(spark_chat_model, {ENABLE_ENV: "1"}, control=True)
    # Without the carrier's entry in vLLM's copy list, a copy-list rule drops the switch.
    control = report["control_copy_list"]
    assert control["environment"][ENABLE_ENV] is None
    assert ARCHITECTURE in control["resolve_error"]
    assert report["driver_copy_list"] == ENABLE_ENV
    for rule in report["rules"]:
        assert report[rule]["environment"][ENABLE_ENV] == "1", rule
        assert report[rule]["resolve_error"] is None, (rule, report[rule])


@pytest.mark.slow
def test_under_the_manager_each_worker_gets_the_bundle_list_and_the_node_keeps_its_value(
    spark_chat_model,
):
    """The manager's launch environment on the head; the node set the switch to 0 itself."""
    launch = {ENABLE_ENV: "1", LIST: BUNDLE_ID, PLUGINS_ENV: "ascend,spark2_5"}
    launch[RAY_EXTRA_ENV_VARS] = "OPERATORS_FLAG"
    report = workers(spark_chat_model, launch, node={ENABLE_ENV: "0"})
    # The operator's own entries stay first; the carrier adds its variables after them.
    assert report["driver_copy_list"] == f"OPERATORS_FLAG,{ENABLE_ENV},{LIST}"
    for rule in report["rules"]:
        assert report[rule]["environment"][LIST] == BUNDLE_ID, rule
    # The V2 executor fills in only what the node lacks: its 0 stays, and wins over the list.
    assert report["v2_executor"]["environment"][ENABLE_ENV] == "0"
    assert ARCHITECTURE in report["v2_executor"]["resolve_error"]
    # The older executor and the engine-core actors give the driver's value precedence
    # (vLLM's rule for every variable it copies): the carrier is on there.
    for rule in set(COPY_LIST_RULES) & set(report["rules"]):
        assert report[rule]["environment"][ENABLE_ENV] == "1", rule
        assert report[rule]["resolve_error"] is None, (rule, report[rule])
