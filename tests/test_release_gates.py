"""Release gates in scripts/check-dist: MAINTAINERS.md must name the release
approvers for ``--release``; ``--install-from`` installs exactly the built wheel
from an index (sha256-pinned) and smoke-tests it; the build backend is pinned.
"""

from __future__ import annotations

import os
import re
import runpy
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
from hypothesis import given, settings
from hypothesis import strategies as st

from carrier_harness.package_index import build_simple_index
from carrier_harness.project import PROJECT_ROOT as ROOT
from carrier_harness.project import our_bundles

CHECK_DIST = ROOT / "scripts" / "check-dist"
VERIFY_RELEASE = ROOT / "scripts" / "verify-release"
check_dist = runpy.run_path(str(CHECK_DIST))
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
NAME, VERSION = PYPROJECT["project"]["name"], PYPROJECT["project"]["version"]
PLACEHOLDER = "to be filled before the first release from this repository"


def _maintainers(folder: Path, *rows: str) -> Path:
    table = "| GitHub account | roles |\n|---|---|\n" + "".join(f"| {row} |\n" for row in rows)
    text = f"# Maintainers\n\n## Current holders\n\n{table}\n## Changing this file\n\nx\n"
    (folder / "MAINTAINERS.md").write_text(text, encoding="utf-8")
    return folder


def _maintainer_problems(folder: Path) -> list[str]:
    problems: list[str] = []
    check_dist["check_maintainers"](folder, problems)
    return problems


# --- MAINTAINERS.md gate -------------------------------------------------------------------


def test_the_repository_names_its_approvers_or_says_it_has_not_yet():
    problems = _maintainer_problems(ROOT)
    text = (ROOT / "MAINTAINERS.md").read_text(encoding="utf-8")
    if PLACEHOLDER in text:
        assert len(problems) == 1 and PLACEHOLDER in problems[0]
    else:
        assert problems == []


def test_release_refuses_the_placeholder_and_normal_checks_do_not_care(tmp_path, capsys):
    project = tmp_path / "project"
    project.mkdir()
    shutil.copy2(ROOT / "pyproject.toml", project / "pyproject.toml")
    _maintainers(project, f"*{PLACEHOLDER}* | maintainer, release approver")
    empty_dist = tmp_path / "dist"
    empty_dist.mkdir()
    root = ["--project-root", str(project)]
    check_dist["main"]([str(empty_dist), *root])
    assert "MAINTAINERS.md" not in capsys.readouterr().err
    assert check_dist["main"]([str(empty_dist), "--release", *root]) == 1
    refused = capsys.readouterr().err
    assert "MAINTAINERS.md names no release approver under '## Current holders'" in refused
    assert f"(it says '{PLACEHOLDER}'" in refused
    assert "make the release approvers the pypi environment's required reviewers" in refused


@pytest.mark.parametrize(
    ("rows", "problem"),
    [
        (["@alice | maintainer, release approver"], None),
        (["@alice | maintainer", "@bob-2 | release approver, evidence reviewer"], None),
        (["@alice | maintainer, evidence reviewer"], "names no release approver"),
        ([], "names no release approver"),
        (["@alice | release approver", "Bob Smith | maintainer"], "['Bob Smith'] are not GitHub"),
        (["@-alice | release approver"], "names no release approver"),
        (["@alice | release approver", f"{PLACEHOLDER} | maintainer"], "names no release"),
    ],
)
def test_the_holders_table_is_read_as_github_accounts_and_roles(tmp_path, rows, problem):
    problems = _maintainer_problems(_maintainers(tmp_path, *rows))
    if problem is None:
        assert problems == []
    else:
        assert len(problems) == 1 and problem in problems[0]


def test_a_missing_maintainers_file_is_refused(tmp_path):
    assert "names no release approver" in _maintainer_problems(tmp_path)[0]


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=400))
def test_any_maintainers_text_gives_a_verdict_not_a_crash(tmp_path_factory, text):
    folder = tmp_path_factory.getbasetemp() / "maintainers-text"
    folder.mkdir(exist_ok=True)
    (folder / "MAINTAINERS.md").write_text(text, encoding="utf-8", errors="replace")
    problems = _maintainer_problems(folder)
    written = (folder / "MAINTAINERS.md").read_text(encoding="utf-8")
    approver_row = re.compile(r"\|\s*@[A-Za-z0-9][\w-]*\s*\|.*release approver")
    if PLACEHOLDER in written or not any(map(approver_row.match, written.splitlines())):
        assert problems


# --- what the install check and the receipt rely on --------------------------------------


def test_the_build_backend_is_pinned_exactly():
    requires = PYPROJECT["build-system"]["requires"]
    assert requires and all(re.fullmatch(r"[A-Za-z0-9_.-]+==\d+(\.\d+)*", r) for r in requires)
    assert PYPROJECT["build-system"]["build-backend"] == "hatchling.build"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This project's wheel, built as the publish workflow builds it."""
    out = tmp_path_factory.mktemp("wheel")
    done = subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--outdir", str(out), str(ROOT)],
        env={**os.environ, "SOURCE_DATE_EPOCH": "1700000000"},
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return next(out.glob("*.whl"))


def test_the_install_check_opens_every_carriers_real_gate(wheel):
    switches = {
        name
        for bundle in our_bundles()
        for name, value in bundle.manifest["activation"]["environment"].items()
        if value == "1"
    }
    assert switches and check_dist["_carrier_switches"](wheel) == switches


def _install_check(wheel: Path, index_url: str) -> list[str]:
    problems: list[str] = []
    project = check_dist["Project"](ROOT)
    check_dist["install_check"](wheel, project, problems, index_url)
    return problems


@pytest.mark.slow
def test_install_from_an_index_takes_exactly_the_built_wheel_and_smoke_tests_it(wheel, tmp_path):
    index = build_simple_index(tmp_path / "index", [wheel])
    assert _install_check(wheel, index.as_uri() + "/") == []


@pytest.mark.slow
def test_install_from_an_index_refuses_other_bytes_under_the_same_name(wheel, tmp_path):
    other = tmp_path / "other" / wheel.name
    other.parent.mkdir()
    other.write_bytes(wheel.read_bytes() + b"\0")  # a zip still, with other bytes
    index = build_simple_index(tmp_path / "index", [other])
    problems = _install_check(wheel, index.as_uri() + "/")
    assert len(problems) == 1 and "DO NOT MATCH THE HASHES" in problems[0]
