"""``scripts/evidence CARRIER --rehash``: a full benchmark run added to an archive is
listed in its report and hashed, and every other record stays as it was produced."""

from __future__ import annotations

import hashlib

from carrier_harness import evidence


def _plan(carrier: str) -> evidence.EvidencePlan:
    return evidence.EvidencePlan(carrier, "t", "s", (), lambda _: {}, lambda _: [], {})


def test_rehash_lists_a_new_full_run_and_every_hash_matches(tmp_path, monkeypatch):
    monkeypatch.setattr(evidence, "PROJECT_ROOT", tmp_path)
    folder = tmp_path / "extensions" / "x" / "evidence"
    folder.mkdir(parents=True)
    (folder / "perf-old.json").write_text("{}\n")
    (folder / "correctness.json").write_text('{"kept": true}\n')
    report = f"# t\n\nProduced on a day.\n\n{evidence._full_runs_line(folder)}\n\nCheck it.\n"
    (folder / "README.md").write_text(report)
    (folder / "perf-new.json").write_text('{"new": 1}\n')

    assert evidence.rehash(_plan("x")) == 0

    rewritten = (folder / "README.md").read_text()
    assert "`perf-new.json`, `perf-old.json`" in rewritten
    assert rewritten.replace(evidence._full_runs_line(folder), "") == report.replace(
        report.split("\n")[4], ""
    ), "only the full-runs line changes"
    sums = dict(
        reversed(line.split("  ")) for line in (folder / "SHA256SUMS").read_text().splitlines()
    )
    assert set(sums) == {"README.md", "correctness.json", "perf-new.json", "perf-old.json"}
    for name, digest in sums.items():
        assert hashlib.sha256((folder / name).read_bytes()).hexdigest() == digest
