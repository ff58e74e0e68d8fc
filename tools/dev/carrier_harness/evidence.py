"""Run a carrier's evidence on real vLLM and archive it (``scripts/evidence CARRIER``).

A carrier describes its evidence as an :class:`EvidencePlan` in its dev package
(``<carrier>_dev.evidence``): which tests make the default-off smoke, how its
correctness record is made, which benchmarks' quick runs to keep. This module
runs the plan, writes one JSON record per part into the carrier's
``extensions/<carrier>/evidence/`` folder, then ``README.md`` (the report,
generated from the records) and ``SHA256SUMS``. Full benchmark runs
(``perf-*.json``) already in the folder stay and are hashed with the rest.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from carrier_harness.project import PROJECT_ROOT

PYTHON = sys.executable


@dataclass(frozen=True)
class EvidencePlan:
    carrier: str  # the folder under extensions/
    title: str
    scope: str  # what the evidence is and is not, one sentence
    default_off_tests: Sequence[str]  # relative to the project root
    correctness: Callable[[Path], dict[str, Any]]  # workdir -> record parts
    correctness_rows: Callable[[dict[str, Any]], list[str]]  # record -> report rows
    quick_benchmarks: Mapping[str, str]  # record name -> script, relative to the root

    @property
    def folder(self) -> Path:
        return PROJECT_ROOT / "extensions" / self.carrier / "evidence"


def run(command: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    print("$", " ".join(command), flush=True)
    return subprocess.run(command, cwd=PROJECT_ROOT, text=True, **kwargs)


def environment(scope: str) -> dict[str, Any]:
    import torch
    import vllm

    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    commit = run(["git", "rev-parse", "HEAD"], capture_output=True).stdout.strip()
    return {
        "what": scope,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": commit,
        "vllm": vllm.__version__,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "loadavg_at_start": os.getloadavg(),
    }


def pytest_record(tests: Sequence[str], workdir: Path) -> dict[str, Any]:
    junit = workdir / "junit.xml"
    command = [PYTHON, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}"]
    result = run([*command, *tests])
    cases = []
    for case in ET.parse(junit).iter("testcase"):
        failed = case.find("failure") is not None or case.find("error") is not None
        skipped = case.find("skipped") is not None
        cases.append(
            {
                "test": f"{case.get('classname')}::{case.get('name')}",
                "outcome": "failed" if failed else "skipped" if skipped else "passed",
                "seconds": round(float(case.get("time", 0)), 2),
            }
        )
    return {
        "command": " ".join(["pytest", *tests]),
        "exit_code": result.returncode,
        "passed": sum(c["outcome"] == "passed" for c in cases),
        "failed": sum(c["outcome"] == "failed" for c in cases),
        "skipped": sum(c["outcome"] == "skipped" for c in cases),
        "tests": cases,
    }


def verdict(ok: bool) -> str:
    return "pass" if ok else "**FAIL**"


def report(plan: EvidencePlan, env: dict[str, Any], records: dict[str, dict[str, Any]]) -> str:
    off = records["default-off.json"]
    lines = [
        f"# {plan.title}",
        "",
        f"Produced by `scripts/evidence {plan.carrier}` on {env['date']} at commit "
        f"`{env['commit']}`.",
        f"vLLM {env['vllm']} (CPU build), torch {env['torch']}, Python {env['python']}, "
        f"{env['cpu']} ({env['cpu_count']} cores).",
        "",
        f"**Scope:** {env['what']}.",
        "",
        "| part | result | record |",
        "|---|---|---|",
        f"| default-off smoke | {verdict(off['exit_code'] == 0)}: {off['passed']} passed, "
        f"{off['failed']} failed | `default-off.json` |",
        *plan.correctness_rows(records["correctness.json"]),
    ]
    for name in plan.quick_benchmarks:
        record = records[name]
        ran = verdict(record["exit_code"] == 0)
        lines.append(f"| performance, quick run | {ran}: `{record.get('command')}` | `{name}` |")
    lines += [
        "",
        _full_runs_line(plan.folder),
        "",
        "Check the archive with `sha256sum -c SHA256SUMS` in this folder.",
        "",
    ]
    return "\n".join(lines)


FULL_RUNS = "Full benchmark runs kept here"


def _full_runs_line(folder: Path) -> str:
    full_runs = sorted(p.name for p in folder.glob("perf-*.json"))
    return (
        f"{FULL_RUNS}, with their figures explained in the carrier's `docs/benchmarks.md`: "
        + (", ".join(f"`{n}`" for n in full_runs) or "none")
        + "."
    )


def _write_sums(folder: Path) -> None:
    sums = [
        f"{hashlib.sha256(path.read_bytes()).hexdigest()}  {path.name}"
        for path in sorted(folder.iterdir())
        if path.name != "SHA256SUMS"
    ]
    (folder / "SHA256SUMS").write_text("\n".join(sums) + "\n", encoding="utf-8")


def rehash(plan: EvidencePlan) -> int:
    """After a full benchmark run was added or redone: list the full runs in the report
    and rewrite SHA256SUMS, leaving every other record as it was produced."""
    report_path = plan.folder / "README.md"
    lines = report_path.read_text(encoding="utf-8").split("\n")
    lines = [_full_runs_line(plan.folder) if ln.startswith(FULL_RUNS) else ln for ln in lines]
    report_path.write_text("\n".join(lines), encoding="utf-8")
    _write_sums(plan.folder)
    print(f"{plan.folder.relative_to(PROJECT_ROOT)}: full runs listed, SHA256SUMS rewritten")
    return 0


def _failed(record: dict[str, Any]) -> bool:
    if "exit_code" in record:
        return record["exit_code"] != 0
    return any(_failed(part) for part in record.values() if isinstance(part, dict))


def _records(plan: EvidencePlan, env: dict[str, Any], work: Path) -> dict[str, dict[str, Any]]:
    (work / "off").mkdir()
    records = {
        "default-off.json": {
            "environment": env,
            **pytest_record(plan.default_off_tests, work / "off"),
        },
        "correctness.json": {"environment": env, **plan.correctness(work)},
    }
    for name, script in plan.quick_benchmarks.items():
        out = work / name
        result = run([PYTHON, script, "--quick", "--out", str(out)])
        record = json.loads(out.read_text()) if result.returncode == 0 else {}
        records[name] = {"environment": env, "exit_code": result.returncode, **record}
    return records


def archive(plan: EvidencePlan) -> int:
    """Run ``plan``, write its records, report and SHA256SUMS; 1 if a part failed."""
    generated = {"default-off.json", "correctness.json", *plan.quick_benchmarks}
    plan.folder.mkdir(parents=True, exist_ok=True)
    for name in (*generated, "README.md", "SHA256SUMS"):
        (plan.folder / name).unlink(missing_ok=True)
    env = environment(plan.scope)
    with tempfile.TemporaryDirectory(prefix=f"{plan.carrier}-evidence-") as tmp:
        records = _records(plan, env, Path(tmp))
    for name, record in records.items():
        text = json.dumps(record, indent=2, ensure_ascii=False) + "\n"
        (plan.folder / name).write_text(text, encoding="utf-8")
    (plan.folder / "README.md").write_text(report(plan, env, records), encoding="utf-8")
    _write_sums(plan.folder)
    failed = [name for name, record in records.items() if _failed(record)]
    print(
        f"evidence written to {plan.folder.relative_to(PROJECT_ROOT)}; failing parts: "
        f"{failed or 'none'}"
    )
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    import argparse
    import importlib

    parser = argparse.ArgumentParser(
        prog=f"python -m {__spec__.name}", description=__doc__.splitlines()[0]
    )
    parser.add_argument("carrier", help="the carrier's folder under extensions/, e.g. spark2_5")
    parser.add_argument(
        "--rehash",
        action="store_true",
        help="run nothing: list the full benchmark runs (perf-*.json) and rewrite SHA256SUMS",
    )
    args = parser.parse_args(argv)
    plan = importlib.import_module(f"{args.carrier}_dev.evidence").PLAN
    return rehash(plan) if args.rehash else archive(plan)


if __name__ == "__main__":
    sys.exit(main())
