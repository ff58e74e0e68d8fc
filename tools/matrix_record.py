"""Write the machine-readable record of one ``scripts/run-matrix`` run.

    python tools/matrix_record.py JUNIT_XML OUT_JSON key=value ...

Reads pytest's JUnit XML and writes a JSON record: the keys given (release,
kernels, suite, torch, python, minutes, exit_code, commit, code, ...), the commit
and code identity when not given (``commit()``, ``code()``), the date, the machine's CPU,
the test counts and the id of every test that failed or errored. The support
matrix is rendered from these records (``spark2_5_dev.support_matrix``).
"""

from __future__ import annotations

import datetime
import fnmatch
import hashlib
import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def outcomes(junit: Path) -> tuple[dict[str, int], list[str]]:
    counts = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0}
    failures = []
    for case in ET.parse(junit).getroot().iter("testcase"):
        test_id = f"{case.get('classname', '')}::{case.get('name', '')}"
        if case.find("failure") is not None:
            counts["failed"] += 1
            failures.append(test_id)
        elif case.find("error") is not None:
            counts["errors"] += 1
            failures.append(test_id)
        elif case.find("skipped") is not None:
            counts["skipped"] += 1  # xfailed tests too
        else:
            counts["passed"] += 1
    return counts, failures


# The records and the table rendered from them: a run of several releases writes
# records as it goes, and those cannot change how the next release's suite ends.
RECORD_PATHS = ("extensions/*/matrix-records/**", "extensions/*/docs/support-matrix.md")


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], capture_output=True, text=True, check=True).stdout


def commit() -> str:
    """The commit checked out, ``+dirty`` when a file other than the records differs
    from it; run-matrix reads it before each release's suite starts."""
    excluded = [f":(exclude,glob){path}" for path in RECORD_PATHS]
    dirty = _git("status", "--porcelain", "--untracked-files=no", "--", ".", *excluded)
    return _git("rev-parse", "--short", "HEAD").strip() + ("+dirty" if dirty.strip() else "")


def code() -> str:
    """An identity of what the suite ran: the committed tree without the records, so
    runs at commits that differ only in records share it."""
    kept = [
        line
        for line in _git("ls-tree", "-r", "HEAD").splitlines()
        if not any(fnmatch.fnmatch(line.split("\t", 1)[1], path) for path in RECORD_PATHS)
    ]
    return hashlib.sha256("\n".join(kept).encode()).hexdigest()[:12]


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def main(argv: list[str]) -> int:
    junit, out, *pairs = argv
    counts, failures = outcomes(Path(junit))
    record = dict(pair.split("=", 1) for pair in pairs)
    record.update(
        exit_code=int(record.get("exit_code", 1)),
        minutes=int(record.get("minutes", 0)),
        commit=record.get("commit") or commit(),
        code=record.get("code") or code(),
        date=datetime.date.today().isoformat(),
        cpu=cpu_model(),
        counts=counts,
        failures=failures,
    )
    Path(out).write_text(json.dumps(record, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
