"""Write the machine-readable record of one ``scripts/run-matrix`` run.

    python tools/matrix_record.py JUNIT_XML OUT_JSON key=value ...
    python tools/matrix_record.py --release-check   # exit 1 naming each missing record

Reads pytest's JUnit XML and writes a JSON record: the keys given (release,
kernels, suite, torch, python, minutes, exit_code, commit, code, ...), the commit
and code identity when not given (``commit()``, ``code()``), the date, the machine's
CPU and the CPU class the run took (``cpu_class``), the test counts and the id of
every test that failed or errored. The support matrix is rendered from these
records (``spark2_5_dev.support_matrix``); a release needs one passing whole-suite
record per verified host at the code it ships (``release_problems``: the publish
workflow's ``--release-check``).
"""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import tomllib


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


def skipped_for(junit: Path, reason: str) -> int:
    """How many tests skipped with ``reason`` in their message."""
    return sum(
        reason in skipped.get("message", "")
        for case in ET.parse(junit).getroot().iter("testcase")
        if (skipped := case.find("skipped")) is not None
    )


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


def code(revision: str = "HEAD", root: Path = Path()) -> str:
    """The identity of the code a run verified: the tree under ``src/`` at ``revision``,
    which is what the wheel ships. Tests, benchmarks and docs do not move it, so a
    change to them alone keeps every record's verification."""
    return _git("-C", str(root), "rev-parse", f"{revision}:src").strip()[:12]


def release_problems(root: Path) -> list[str]:
    """Why the code checked out may not be released yet: every host a bundle of
    ``manifest.toml`` lists in ``verified_on`` needs a passing whole-suite record
    (``extensions/*/matrix-records/``) at the code identity being released."""
    with open(root / "manifest.toml", "rb") as f:
        hosts = [
            host for bundle in tomllib.load(f)["bundle"] for host in bundle["host"]["verified_on"]
        ]
    shipped = code(root=root)
    found = {
        path.name: json.loads(path.read_text())
        for path in root.glob("extensions/*/matrix-records/vllm-*.json")
    }
    problems = []
    for host in dict.fromkeys(host.split("+")[0] for host in hosts):
        record = found.get(f"vllm-{host}.json", {})
        passed = record.get("suite") == "whole" and record.get("exit_code") == 0
        if not (passed and record.get("code") == shipped):
            problems.append(
                f"vLLM {host} has no passing whole-suite record at code {shipped} (found: "
                f"{record.get('suite')} suite, exit code {record.get('exit_code')}, code "
                f"{record.get('code')}): run `scripts/run-matrix` here and commit its records"
            )
    return problems


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def _cpu_class() -> str:
    """The CPU class this run took: the one ``scripts/as-cpu-class`` emulated, else the
    machine's (``carrier_harness.cpu_classes``)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent / "dev"))
    from carrier_harness import cpu_classes

    in_force = cpu_classes.class_in_force()
    return in_force.name if in_force else "below-avx2"


def main(argv: list[str]) -> int:
    if argv == ["--release-check"]:
        problems = release_problems(Path.cwd())
        for problem in problems:
            print(f"matrix_record: {problem}", file=sys.stderr)
        return 1 if problems else 0
    junit, out, *pairs = argv
    counts, failures = outcomes(Path(junit))
    record = dict(pair.split("=", 1) for pair in pairs)
    previous = Path(record.pop("previous", ""))  # the release's record this run replaces
    if previous.is_file() and "note" in (kept := json.loads(previous.read_text())):
        record["note"] = kept["note"]  # written by hand (why a release is not served): kept
    if record.get("suite") == "engine-free":  # its source check, and what it left out
        sys.path.insert(0, str(Path(__file__).resolve().parent / "dev"))
        from carrier_harness import engine_free

        record["source_check_exit"] = int(record.get("source_check_exit", 1))
        record["engine_skips"] = skipped_for(Path(junit), engine_free.MARK)
    record.update(
        exit_code=int(record.get("exit_code", 1)),
        minutes=int(record.get("minutes", 0)),
        commit=record.get("commit") or commit(),
        code=record.get("code") or code(),
        date=datetime.date.today().isoformat(),
        cpu=cpu_model(),
        cpu_class=record.get("cpu_class") or _cpu_class(),
        counts=counts,
        failures=failures,
    )
    Path(out).write_text(json.dumps(record, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
