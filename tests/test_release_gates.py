"""Release gates in scripts/check-dist: MAINTAINERS.md must name the release
approvers for ``--release``; ``--install-from`` installs exactly the built wheel
from an index (sha256-pinned) and smoke-tests it; ``--audit`` fails only on a
fixable vulnerability in a declared dependency (both in tools/fresh_install.py);
the build backend is pinned.
"""

from __future__ import annotations

import json
import re
import runpy
import shutil
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
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
fresh_install = check_dist["fresh_install"]  # the module check-dist runs
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


# --- the dependency audit (pip-audit, against a stand-in OSV service on loopback) ---------


def _osv_vuln(vuln_id: str, package: str, fixed: str | None) -> dict:
    events = [{"introduced": "0"}] + ([{"fixed": fixed}] if fixed else [])
    return {
        "id": vuln_id,
        "summary": "planted by the test",
        "affected": [
            {
                "package": {"name": package, "ecosystem": "PyPI"},
                "ranges": [{"type": "ECOSYSTEM", "events": events}],
            }
        ],
    }


PLANTED_VULNS = {
    "jsonschema": [_osv_vuln("TEST-1", "jsonschema", "4.99.0")],  # declared, fixed
    "attrs": [_osv_vuln("TEST-2", "attrs", "99.0")],  # a dependency's dependency
    "packaging": [_osv_vuln("TEST-3", "packaging", None)],  # declared, no fix yet
}


class _OSVQuery(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        query = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        vulns = PLANTED_VULNS.get(query["package"]["name"])
        body = json.dumps({"vulns": vulns} if vulns else {}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


def _use_osv_at(monkeypatch: pytest.MonkeyPatch, url: str) -> None:
    """pip-audit's own variables: its OSV service, at ``url``, not through a proxy."""
    monkeypatch.setenv("PIP_AUDIT_VULNERABILITY_SERVICE", "osv")
    monkeypatch.setenv("PIP_AUDIT_OSV_URL", url)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    monkeypatch.setenv("no_proxy", "127.0.0.1")


def _audit(pins: list[str], capsys: pytest.CaptureFixture) -> tuple[list[str], str]:
    declared = {fresh_install.requirement_name(r) for r in PYPROJECT["project"]["dependencies"]}
    assert declared == {"packaging", "jsonschema", "platformdirs", "tomli"}
    problems: list[str] = []
    fresh_install.audit_dependencies(pins, declared, problems)
    return problems, " ".join(capsys.readouterr().err.split())


def test_the_audit_fails_only_on_a_fixable_vulnerability_in_a_declared_dependency(
    monkeypatch, capsys
):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _OSVQuery)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        _use_osv_at(monkeypatch, f"http://127.0.0.1:{server.server_port}/v1/query")
        pins = ["jsonschema==4.18.0", "attrs==22.1.0", "packaging==23.0", "platformdirs==3.0.0"]
        problems, notes = _audit(pins, capsys)
    finally:
        server.shutdown()
        server.server_close()
    assert problems == [
        "dependency audit: jsonschema 4.18.0 has TEST-1, fixed in 4.99.0: raise its lower "
        "bound in pyproject.toml [project] dependencies to a fixed version"
    ]
    assert "attrs 22.1.0 has TEST-2 (not failed: not a dependency this project declares)" in notes
    assert "packaging 23.0 has TEST-3 (not failed: no fixed release)" in notes
    assert "platformdirs" not in notes and "skipped" not in notes


def test_the_audit_is_skipped_with_a_message_when_its_service_is_unreachable(monkeypatch, capsys):
    with socket.socket() as closed:  # a loopback port nothing listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    _use_osv_at(monkeypatch, f"http://127.0.0.1:{port}/v1/query")
    problems, notes = _audit(["jsonschema==4.18.0"], capsys)
    assert problems == []
    assert "dependency audit skipped: pip-audit got no answer from its vulnerability" in notes


def test_the_audit_needs_the_install_check(tmp_path, capsys):
    with pytest.raises(SystemExit):
        check_dist["main"]([str(tmp_path), "--audit"])
    assert "--audit only apply with --install-check" in capsys.readouterr().err


# --- what the install check and the receipt rely on --------------------------------------


def test_the_build_backend_is_pinned_exactly():
    requires = PYPROJECT["build-system"]["requires"]
    assert requires and all(re.fullmatch(r"[A-Za-z0-9_.-]+==\d+(\.\d+)*", r) for r in requires)
    assert PYPROJECT["build-system"]["build-backend"] == "hatchling.build"


def test_the_install_check_turns_on_every_carriers_real_switch(wheel):
    switches = {
        name
        for bundle in our_bundles()
        for name, value in bundle.manifest["activation"]["environment"].items()
        if value == "1"
    }
    assert switches and fresh_install.carrier_switches(wheel) == switches


def _install_check(wheel: Path, index_url: str) -> list[str]:
    problems: list[str] = []
    project = check_dist["Project"](ROOT)
    fresh_install.check(wheel, project, problems, index_url)
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
