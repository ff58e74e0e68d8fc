"""The publish workflow's guards, read from the workflow and run where they are shell.

One build; TestPyPI gets those files first, then a clean install from TestPyPI
pinned to their sha256 and an attestation check; PyPI gets the same files only
for a ``v<version>`` tag push on a commit ``ci`` passed, after a recorded
approval; then PyPI's copy is verified (``scripts/verify-release``). Steps that
call GitHub's API run here with a stand-in ``gh`` on PATH that answers as the API
would and records what it was asked.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from carrier_harness.project import pyproject, read_workflow

ROOT = Path(__file__).resolve().parent.parent
PUBLISH = ROOT / ".github" / "workflows" / "publish.yml"
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


def test_testpypi_is_checked_by_installing_from_it_and_verifying_attestations():
    runs = "\n".join(s.get("run", "") for s in _jobs()["verify-testpypi"]["steps"])
    assert (
        'scripts/check-dist dist --install-check --install-from "${TESTPYPI_BASE_URL%/}/simple/"'
        in runs
    )
    assert "scripts/verify-release published receipt/receipt.json dist" in runs
    assert '--index "$TESTPYPI_BASE_URL" --environment testpypi' in runs
    assert re.search(r'pip install "pypi-attestations==[\d.]+"', runs)


def test_the_receipt_job_verifies_pypi_and_records_the_approvers():
    step = next(s for s in _jobs()["receipt"]["steps"] if "verify-release" in s.get("run", ""))
    assert step["env"]["APPROVERS"] == "${{ needs.publish-pypi.outputs.approvers }}"
    assert '--index "$PYPI_BASE_URL" --environment pypi --approvers "$APPROVERS"' in step["run"]
    assert _jobs()["publish-pypi"]["outputs"] == {
        "approvers": "${{ steps.approval.outputs.approvers }}"
    }


def test_build_tools_are_pinned_exactly():
    install = next(
        s for s in _jobs()["build"]["steps"] if s.get("name") == "Install the build tools"
    )
    tools = ("build", "twine", "check-wheel-contents", "pip-audit")
    pins = " ".join(rf'"{tool}==[\d.]+"' for tool in tools)
    assert re.fullmatch(rf"python -m pip install {pins}", install["run"])


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
