"""The publish workflow's guards, read from the workflow and run where they are shell.

One build; TestPyPI gets those files first, then a clean install from TestPyPI
pinned to their sha256 and an attestation check; PyPI gets the same files only
for a ``v<version>`` tag push on a commit ``ci`` passed, after a recorded
approval; then PyPI's copy is verified (``scripts/verify-release``). Steps that
call GitHub's API run here with a stand-in ``gh`` on PATH that answers as the API
would and records what it was asked; the verifying jobs' steps run with stand-ins
for the scripts and ``python`` that record their arguments, read back with the
scripts' own argument parsers.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import runpy
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from carrier_harness.project import pyproject, read_workflow

ROOT = Path(__file__).resolve().parent.parent
check_dist = runpy.run_path(str(ROOT / "scripts" / "check-dist"))
verify_release = runpy.run_path(str(ROOT / "scripts" / "verify-release"))
VERSION = pyproject()["version"]
APPROVALS_JQ = re.compile(r"--jq '([^']+)'")


def _jobs() -> dict:
    return read_workflow("publish.yml")["jobs"]


def _step(job: str, step_id: str) -> dict:
    return next(s for s in _jobs()[job]["steps"] if s.get("id") == step_id)


def _uses(job: str) -> list[str]:
    return [s["uses"].split("@")[0] for s in _jobs()[job]["steps"] if "uses" in s]


def _needs(job: str) -> set[str]:
    needs = _jobs()[job].get("needs", [])
    return {needs} if isinstance(needs, str) else set(needs)


def _run_step(step: dict, env: dict[str, str], tmp_path: Path, gh_answer: str = "") -> tuple:
    """Run a step's shell as the runner would; return (status, output, GITHUB_OUTPUT, gh calls)."""
    assert set(step.get("env", {})) >= set(env), "the test sets a variable the step lacks"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    calls = tmp_path / "gh-calls"
    gh = bin_dir / "gh"
    gh.write_text(f'#!/bin/sh\necho "$@" >> "{calls}"\nprintf "%s\\n" "$GH_ANSWER"\n')
    gh.chmod(0o755)
    outputs = tmp_path / "github-output"
    done = subprocess.run(
        ["bash", "-e", "-c", step["run"]],
        cwd=ROOT,
        env={
            **os.environ,
            **env,
            "GH_ANSWER": gh_answer,
            "GITHUB_OUTPUT": str(outputs),
            "PATH": f"{bin_dir}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}"
            + os.environ["PATH"],
        },
        capture_output=True,
        text=True,
    )
    return (
        done.returncode,
        done.stdout + done.stderr,
        outputs.read_text() if outputs.exists() else "",
        calls.read_text().splitlines() if calls.exists() else [],
    )


# --- triggers, permissions, the job graph ------------------------------------------------


def test_a_tag_push_releases_and_a_manual_run_only_rehearses():
    workflow = read_workflow("publish.yml")
    assert workflow["on"] == {"push": {"tags": ["v*"]}, "workflow_dispatch": None}
    assert workflow["permissions"] == {}


def test_each_job_has_the_least_permissions_and_only_publishers_get_id_token():
    assert {name: job.get("permissions") for name, job in _jobs().items()} == {
        "build": {"contents": "read", "actions": "read"},
        "publish-testpypi": {"id-token": "write"},
        "verify-testpypi": {"contents": "read"},
        "publish-pypi": {"id-token": "write", "actions": "read"},
        "receipt": {"contents": "read"},
    }


def test_pypi_gets_only_what_testpypi_served_and_verified_and_only_on_a_release():
    jobs = _jobs()
    assert _needs("publish-testpypi") == {"build"} and "if" not in jobs["publish-testpypi"]
    assert _needs("verify-testpypi") == {"build", "publish-testpypi"}
    assert _needs("publish-pypi") == {"build", "verify-testpypi"}
    assert jobs["publish-pypi"]["if"] == "needs.build.outputs.release == 'true'"
    assert _needs("receipt") == {"build", "publish-pypi"}
    assert jobs["receipt"]["if"] == "needs.publish-pypi.result == 'success'"
    assert jobs["publish-testpypi"]["environment"] == {"name": "testpypi"}
    assert jobs["publish-pypi"]["environment"] == {"name": "pypi"}


def test_the_files_are_built_once_and_everyone_else_downloads_them():
    jobs = _jobs()
    builders = [n for n, j in jobs.items() if "-m build" in yaml.safe_dump(j.get("steps"))]
    assert builders == ["build"]
    for name in ("publish-testpypi", "verify-testpypi", "publish-pypi", "receipt"):
        downloads = [
            s["with"] for s in jobs[name]["steps"] if s.get("uses", "").startswith("actions/down")
        ]
        assert {"name": "dist", "path": "dist/"} in downloads, name


def test_publish_jobs_only_check_approval_download_and_upload():
    assert _uses("publish-testpypi") == ["actions/download-artifact", "pypa/gh-action-pypi-publish"]
    assert _uses("publish-pypi") == ["actions/download-artifact", "pypa/gh-action-pypi-publish"]
    steps = _jobs()["publish-pypi"]["steps"]
    assert steps[0]["id"] == "approval"  # before the files are even downloaded
    assert [s for s in steps if "run" in s] == [steps[0]]
    testpypi = _jobs()["publish-testpypi"]["steps"][-1]["with"]
    assert testpypi == {
        "repository-url": "${{ vars.TESTPYPI_REPOSITORY_URL }}",
        "attestations": True,
        "skip-existing": True,
    }
    assert steps[-1]["with"] == {"attestations": True}  # the action's default index: PyPI


# --- what the steps call, run with stand-ins that record their arguments -----------------

EXPRESSION = re.compile(r"\$\{\{\s*([\w.-]+)\s*\}\}")
RECORDER = """#!{python}
import json, os, sys
with open(os.environ["RECORDED_CALLS"], "a", encoding="utf-8") as calls:
    calls.write(json.dumps([os.path.basename(sys.argv[0]), *sys.argv[1:]]) + "\\n")
"""


def _resolve(value: str, context: dict[str, str]) -> str:
    """``value`` with each ``${{ name }}`` taken from ``context``, as the runner would."""
    return EXPRESSION.sub(lambda match: context[match.group(1)], value)


def _recorded_calls(steps: list[dict], context: dict[str, str], tmp_path: Path) -> list[list]:
    """Run the shell ``steps``, their env resolved from ``context``, in a checkout whose
    ``scripts/check-dist``, ``scripts/verify-release`` and ``python`` only record their
    arguments: each call, in order."""
    checkout, bin_dir = tmp_path / "checkout", tmp_path / "stand-ins"
    calls = tmp_path / "recorded-calls"
    for recorder in (
        checkout / "scripts" / "check-dist",
        checkout / "scripts" / "verify-release",
        bin_dir / "python",
    ):
        recorder.parent.mkdir(parents=True, exist_ok=True)
        recorder.write_text(RECORDER.format(python=sys.executable))
        recorder.chmod(0o755)
    for step in steps:
        env = {name: _resolve(value, context) for name, value in step.get("env", {}).items()}
        env |= {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "RECORDED_CALLS": str(calls)}
        done = subprocess.run(
            ["bash", "-e", "-c", step["run"]],
            cwd=checkout,
            env={**os.environ, **env},
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, (step.get("name"), done.stdout + done.stderr)
    lines = calls.read_text(encoding="utf-8").splitlines() if calls.exists() else []
    return [json.loads(line) for line in lines]


def _shell_steps(job: str) -> list[dict]:
    return [step for step in _jobs()[job]["steps"] if "run" in step]


def _artifacts(job: str, action: str) -> dict[str, Path]:
    """Artifact name -> the path ``job`` downloads it to or uploads it from."""
    steps = _jobs()[job]["steps"]
    used = [s["with"] for s in steps if s.get("uses", "").startswith(f"actions/{action}@")]
    return {artifact["name"]: Path(artifact["path"]) for artifact in used}


def _verify_release_args(call: list[str], job: str) -> argparse.Namespace:
    """A ``verify-release published`` call as the script reads it. Its files are those the
    job downloaded (the build job's receipt, the files built) and the one it uploads."""
    assert call[:2] == ["verify-release", "published"], call
    args = verify_release["parser"]().parse_args(call[1:])
    downloaded = _artifacts(job, "download-artifact")
    build_receipt = _artifacts("build", "upload-artifact")["build-receipt"]
    assert args.receipt == downloaded["build-receipt"] / build_receipt.name
    assert args.dist_dir == downloaded["dist"]
    assert [args.out] == list(_artifacts(job, "upload-artifact").values())
    return args


@pytest.mark.parametrize("base", ["https://test.example.org", "https://test.example.org/"])
def test_testpypi_is_checked_by_installing_from_it_and_verifying_attestations(tmp_path, base):
    context = {"vars.TESTPYPI_BASE_URL": base}
    calls = _recorded_calls(_shell_steps("verify-testpypi"), context, tmp_path)
    assert [call[0] for call in calls] == ["python", "check-dist", "verify-release"]
    installed = check_dist["parser"]().parse_args(calls[1][1:])
    assert installed.dist_dir == _artifacts("verify-testpypi", "download-artifact")["dist"]
    assert installed.install_check
    assert installed.install_from == "https://test.example.org/simple/"
    verified = _verify_release_args(calls[2], "verify-testpypi")
    assert (verified.index, verified.environment) == (base, "testpypi")


def test_the_receipt_job_verifies_pypi_and_records_the_approvers(tmp_path):
    """The approvers the approval step outputs reach verify-release through the job outputs."""
    approval = tmp_path / "approval"
    approval.mkdir()
    status, output, outputs, _ = _run_step(
        _step("publish-pypi", "approval"), _approval_env(), approval, gh_answer="alice,bob"
    )
    assert status == 0, output
    steps = {
        f"steps.approval.outputs.{line.split('=', 1)[0]}": line.split("=", 1)[1]
        for line in outputs.splitlines()
    }
    context = {
        f"needs.publish-pypi.outputs.{name}": _resolve(value, steps)
        for name, value in _jobs()["publish-pypi"]["outputs"].items()
    }
    context["vars.PYPI_BASE_URL"] = "https://index.example.org"
    calls = _recorded_calls(_shell_steps("receipt"), context, tmp_path)
    assert [call[0] for call in calls] == ["python", "verify-release"]
    verified = _verify_release_args(calls[1], "receipt")
    assert (verified.index, verified.environment) == ("https://index.example.org", "pypi")
    assert verified.approvers == "alice,bob"


# What each job installs: the tools its steps run.
TOOLS = {
    "build": {"build", "twine", "check-wheel-contents", "pip-audit"},
    "verify-testpypi": {"pypi-attestations"},
    "receipt": {"pypi-attestations"},
}


def test_every_tool_a_job_installs_is_pinned_to_one_version(tmp_path):
    for name in _jobs():
        installers = [step for step in _shell_steps(name) if "pip install" in step["run"]]
        installed = {}
        for call in _recorded_calls(installers, {}, tmp_path / name):
            assert call[:4] == ["python", "-m", "pip", "install"], call
            for requirement in call[4:]:
                pinned = re.fullmatch(r"([\w.-]+)==(\d+(?:\.\d+)*)", requirement)
                assert pinned, f"{name} installs {requirement}, not pinned to one version"
                installed[pinned.group(1)] = pinned.group(2)
        assert set(installed) == TOOLS.get(name, set()), name


# --- the target and the release gate, run ------------------------------------------------


@pytest.mark.parametrize(
    ("event", "ref_type", "release"),
    [
        ("push", "tag", "true"),
        ("workflow_dispatch", "tag", "false"),
        ("workflow_dispatch", "branch", "false"),
        ("push", "branch", "false"),
    ],
)
def test_only_a_tag_push_is_a_release(tmp_path, event, ref_type, release):
    env = {"EVENT": event, "REF_TYPE": ref_type}
    status, output, outputs, _ = _run_step(_step("build", "target"), env, tmp_path)
    assert status == 0, output
    assert outputs.splitlines() == [f"release={release}", f"version={VERSION}"]


GOOD_VALUES = {
    "TESTPYPI_REPOSITORY_URL": "https://upload.example.org/legacy/",
    "TESTPYPI_BASE_URL": "https://test-index.example.org",
    "PYPI_BASE_URL": "https://index.example.org",
}


@pytest.mark.parametrize(
    ("release", "required"),
    [
        ("false", ["TESTPYPI_REPOSITORY_URL", "TESTPYPI_BASE_URL"]),
        ("true", ["TESTPYPI_REPOSITORY_URL", "TESTPYPI_BASE_URL", "PYPI_BASE_URL"]),
    ],
)
def test_the_build_job_refuses_empty_variables_the_run_needs(tmp_path, release, required):
    step = _step("build", "variables")
    empty = dict.fromkeys(GOOD_VALUES, "")
    status, output, _, _ = _run_step(step, {"RELEASE": release, **empty}, tmp_path)
    assert status == 1
    assert [n for n in GOOD_VALUES if f"repository variable {n} is empty" in output] == required
    just_enough = {**empty, **{name: GOOD_VALUES[name] for name in required}}
    assert _run_step(step, {"RELEASE": release, **just_enough}, tmp_path)[:2] == (0, "")


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("TESTPYPI_BASE_URL", "test-index.example.org", "must start with https://"),
        ("TESTPYPI_REPOSITORY_URL", "http://upload.example.org/legacy/", "must start with"),
        ("TESTPYPI_REPOSITORY_URL", "https://upload.example.org/", "must be the legacy upload"),
    ],
)
def test_the_build_job_refuses_a_malformed_variable(tmp_path, name, value, message):
    env = {"RELEASE": "false", **GOOD_VALUES, name: value}
    status, output, _, _ = _run_step(_step("build", "variables"), env, tmp_path)
    assert status == 1 and f"repository variable {name}=" in output and message in output


def _gate_env(tag: str) -> dict[str, str]:
    return {"TAG": tag, "VERSION": VERSION, "SHA": "0" * 40, "REPOSITORY": "owner/repo"}


def test_the_release_gate_runs_only_for_releases_and_before_the_build():
    steps = _jobs()["build"]["steps"]
    gate = _step("build", "release-gate")
    assert gate["if"] == "steps.target.outputs.release == 'true'"
    assert gate["env"]["GH_TOKEN"] == "${{ github.token }}"
    building = next(i for i, s in enumerate(steps) if "-m build" in s.get("run", ""))
    assert steps.index(gate) < building


def test_a_release_is_built_only_from_code_the_whole_matrix_passed():
    """The check itself: tests/test_matrix_record.py."""
    steps = _jobs()["build"]["steps"]
    gate = _step("build", "matrix-gate")
    assert gate["if"] == "steps.target.outputs.release == 'true'"
    assert gate["run"].strip() == "python tools/matrix_record.py --release-check"
    building = next(i for i, s in enumerate(steps) if "-m build" in s.get("run", ""))
    assert steps.index(gate) < building


def test_the_release_gate_refuses_a_tag_that_is_not_the_version(tmp_path):
    status, output, _, calls = _run_step(
        _step("build", "release-gate"), _gate_env("v9.9.9"), tmp_path, gh_answer="1"
    )
    assert status == 1
    assert f"tag 'v9.9.9' does not match the version: pyproject.toml says {VERSION}" in output
    assert calls == []


@pytest.mark.parametrize(("successful_runs", "status"), [("0", 1), ("1", 0)])
def test_the_release_gate_needs_a_successful_ci_run_of_the_commit(
    tmp_path, successful_runs, status
):
    found, output, _, calls = _run_step(
        _step("build", "release-gate"), _gate_env(f"v{VERSION}"), tmp_path, successful_runs
    )
    assert found == status, output
    assert calls == [
        "api repos/owner/repo/actions/workflows/ci.yml/runs?head_sha="
        + "0" * 40
        + "&status=success&per_page=1 --jq .total_count"
    ]
    if status:
        assert "no successful ci run for " + "0" * 40 in output


# --- the approval, run ---------------------------------------------------------------------


def _approval_env() -> dict[str, str]:
    return {"REPOSITORY": "owner/repo", "RUN_ID": "42"}


def test_pypi_upload_refuses_without_a_recorded_approval(tmp_path):
    status, output, outputs, calls = _run_step(
        _step("publish-pypi", "approval"), _approval_env(), tmp_path, gh_answer=""
    )
    assert status == 1 and "no reviewer approved this run's pypi deployment" in output
    assert outputs == "" and calls[0].startswith("api repos/owner/repo/actions/runs/42/approvals")


def test_pypi_upload_names_its_approvers(tmp_path):
    status, output, outputs, _ = _run_step(
        _step("publish-pypi", "approval"), _approval_env(), tmp_path, gh_answer="alice,bob"
    )
    assert (status, outputs) == (0, "approvers=alice,bob\n"), output


@pytest.mark.skipif(shutil.which("jq") is None, reason="jq is not installed")
def test_the_approval_filter_keeps_approvals_of_the_pypi_environment_only():
    """gh's --jq is jq's language; run the step's filter on an approvals API answer."""
    jq = APPROVALS_JQ.search(_step("publish-pypi", "approval")["run"]).group(1)
    answer = [
        {"state": "approved", "environments": [{"name": "pypi"}], "user": {"login": "alice"}},
        {"state": "rejected", "environments": [{"name": "pypi"}], "user": {"login": "mallory"}},
        {"state": "approved", "environments": [{"name": "testpypi"}], "user": {"login": "carol"}},
        {
            "state": "approved",
            "environments": [{"name": "docs"}, {"name": "pypi"}],
            "user": {"login": "bob"},
        },
    ]
    done = subprocess.run(
        ["jq", "-r", jq], input=json.dumps(answer), capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "alice,bob"
    empty = subprocess.run(["jq", "-r", jq], input="[]", capture_output=True, text=True)
    assert empty.stdout.strip() == ""


# --- the repository variables are the documented ones ------------------------------------

VARIABLES = {
    "build": {"TESTPYPI_REPOSITORY_URL", "TESTPYPI_BASE_URL", "PYPI_BASE_URL"},
    "publish-testpypi": {"TESTPYPI_REPOSITORY_URL"},
    "verify-testpypi": {"TESTPYPI_BASE_URL"},
    "receipt": {"PYPI_BASE_URL"},
}


def test_jobs_read_exactly_the_documented_repository_variables():
    used = {}
    for name, job in _jobs().items():
        if found := set(re.findall(r"\bvars\.(\w+)", yaml.safe_dump(job))):
            used[name] = found
    assert used == VARIABLES
    ci = (ROOT / ".github" / "workflows" / "ci.yml").read_text(encoding="utf-8")
    assert "vars." not in ci
    section = (ROOT / "docs" / "release.md").read_text(encoding="utf-8").split("## 4.")[1]
    documented = set(re.findall(r"^\| `([A-Z][A-Z0-9_]+)` \|", section.split("## 5.")[0], re.M))
    assert documented == set().union(*VARIABLES.values())
