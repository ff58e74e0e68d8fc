"""vllm-hust-bundle as an operator runs it: exit status 0/1/2, --json, --version, --help.

0: all good; 1: the command ran and found a problem; 2: it could not run as asked.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from carrier_harness.env import clean_env
from carrier_harness.project import our_bundles, pyproject
from vllm_hust_bundle_kit.contract import BUNDLE_GROUP, RENDERED_FILENAME, STATE_ENV

TOOL = str(Path(sys.executable).with_name("vllm-hust-bundle"))
ALIAS = str(Path(sys.executable).with_name("spark2-5-bundle"))


def run(*argv: str, pythonpath: Path | None = None, tool: str = TOOL, **env: str):
    environment = clean_env(**env)
    if pythonpath is not None:
        environment["PYTHONPATH"] = str(pythonpath)
    return subprocess.run(
        [tool, *argv], capture_output=True, text=True, env=environment, timeout=300
    )


def installed_broken_bundle(site: Path, manifest: dict) -> str:
    """A distribution installed in ``site`` whose bundle manifest is ``manifest``; its id."""
    package = site / "broken_bundle"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / RENDERED_FILENAME).write_text(json.dumps(manifest))
    dist_info = site / "broken_bundle_dist-1.0.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: broken-bundle-dist\nVersion: 1.0\n"
    )
    (dist_info / "entry_points.txt").write_text(
        f"[{BUNDLE_GROUP}]\norg.example.broken = broken_bundle\n"
    )
    (dist_info / "RECORD").write_text(
        f"broken_bundle/__init__.py,,\nbroken_bundle/{RENDERED_FILENAME},,\n"
    )
    return "org.example.broken"


@pytest.fixture
def broken_site(tmp_path) -> tuple[Path, str]:
    manifest = dict(
        our_bundles()[0].manifest, extension_id="org.example.broken", extension_version="1.0"
    )
    manifest["host"] = {**manifest["host"], "version_range": ">=0"}
    return tmp_path, installed_broken_bundle(tmp_path, manifest)


def test_validate_reports_every_bundle_and_exits_1_on_an_invalid_one(broken_site):
    site, broken = broken_site
    result = run("validate", "--json", pythonpath=site)
    assert result.returncode == 1
    report = {item["extension_id"]: item for item in json.loads(result.stdout)}
    assert report[broken]["valid"] is False
    assert "host.version_range" in report[broken]["problem"]
    assert all(item["valid"] for name, item in report.items() if name != broken)
    (line,) = result.stderr.splitlines()
    assert line == f"vllm-hust-bundle: error: {report[broken]['problem']}"
    assert line.startswith(f"vllm-hust-bundle: error: {site / 'broken_bundle'}")


def test_validate_and_inspect_exit_0_when_all_is_well():
    bundle_id = our_bundles()[0].extension_id
    valid = run("validate", bundle_id)
    assert valid.returncode == 0 and valid.stdout.startswith(f"valid: {bundle_id} ")


def test_inspect_reports_an_invalid_bundle_and_exits_1(broken_site, tmp_path):
    site, broken = broken_site
    result = run("inspect", "--json", broken, pythonpath=site, **{STATE_ENV: str(tmp_path / "s")})
    assert result.returncode == 1
    (item,) = json.loads(result.stdout)
    assert "host.version_range" in item["problem"]
    text = run("inspect", broken, pythonpath=site, **{STATE_ENV: str(tmp_path / "s")})
    assert text.stdout.startswith(f"{broken}: invalid: ")


@pytest.mark.parametrize(
    "argv",
    [
        ["inspect", "org.example.not-installed"],
        ["validate", "org.example.not-installed"],
        ["env"],
        ["frobnicate"],
        ["render", "--root", "/nonexistent-project-root"],
    ],
    ids=[
        "inspect-unknown-id",
        "validate-unknown-id",
        "env-without-ids",
        "no-such-command",
        "render-no-root",
    ],
)
def test_what_cannot_run_as_asked_exits_2(argv):
    result = run(*argv)
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""


def test_help_is_plain_text_and_version_names_the_distribution():
    help_text = run("--help").stdout
    assert "``" not in help_text and "Exit status" in help_text
    version = run("--version")
    assert version.returncode == 0
    project = pyproject()
    assert version.stdout.strip() == (
        f"vllm-hust-bundle, from {project['name']} {project['version']}"
    )


def test_the_deprecated_name_still_works_and_says_so_once():
    result = run("validate", tool=ALIAS)
    assert result.returncode == 0
    assert result.stdout.startswith("valid: ")
    (notice,) = result.stderr.splitlines()
    assert "deprecated, use vllm-hust-bundle" in notice
