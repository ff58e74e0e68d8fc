"""Run the Spark2_5 carrier's evidence and archive it (called by ``scripts/evidence``).

Three parts, each a record in ``extensions/spark2_5/evidence/``:

- ``default-off.json``: the default-off smoke and entry-point purity tests;
- ``correctness.json``: the parity matrix against the reference, and the
  end-to-end tool-calling tests through ``vllm serve``;
- ``quick-perf-*.json``: the benchmark scripts' quick runs.

Full benchmark runs (``perf-*.json``, written by the commands in
``docs/benchmarks.md``) stay in the folder and are hashed with the rest. Then
``README.md`` (the report, generated from the records) and ``SHA256SUMS``.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EVIDENCE = ROOT / "extensions" / "spark2_5" / "evidence"
PYTHON = sys.executable

DEFAULT_OFF_TESTS = ["tests/test_default_off.py", "tests/test_entry_point.py"]
E2E_TESTS = ["tests/test_e2e_serve.py"]
BENCHMARKS = {
    "quick-perf-model.json": "benchmarks/bench_model.py",
    "quick-perf-carrier.json": "benchmarks/bench_carrier.py",
}
GENERATED = {"default-off.json", "correctness.json", *BENCHMARKS, "README.md", "SHA256SUMS"}


def run(command: list[str], **kwargs) -> subprocess.CompletedProcess[str]:
    print("$", " ".join(command), flush=True)
    return subprocess.run(command, cwd=ROOT, text=True, **kwargs)


def environment() -> dict:
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
        "what": "CPU run of vLLM's CPU build on tiny stand-in Spark2_5 checkpoints built "
        "by the tests; not a GPU result and not the real Spark-X2.5-4B weights",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": commit,
        "vllm": vllm.__version__,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "loadavg_at_start": os.getloadavg(),
    }


def pytest_record(tests: list[str], workdir: Path) -> dict:
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


def parity_record(workdir: Path) -> dict:
    out = workdir / "parity.json"
    env = {**os.environ, "SPARK2_5_PLUGIN_ENABLE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    module = "vllm_spark2_5_plugin.testing.parity"
    result = run(
        [PYTHON, "-m", module, "--workdir", str(workdir / "ckpt"), "--out", str(out)], env=env
    )
    if result.returncode != 0:
        return {"command": f"python -m {module}", "exit_code": result.returncode}
    return {"command": f"python -m {module}", "exit_code": 0, **json.loads(out.read_text())}


def write_json(name: str, record: dict) -> None:
    (EVIDENCE / name).write_text(json.dumps(record, indent=2, ensure_ascii=False) + "\n")


def verdict(ok: bool) -> str:
    return "pass" if ok else "**FAIL**"


def report(env: dict, records: dict[str, dict]) -> str:
    off, correctness = records["default-off.json"], records["correctness.json"]
    parity, e2e = correctness["parity"], correctness["end_to_end"]
    lines = [
        "# Spark2_5 carrier evidence",
        "",
        f"Produced by `scripts/evidence` on {env['date']} at commit `{env['commit']}`.",
        f"vLLM {env['vllm']} (CPU build), torch {env['torch']}, Python {env['python']}, "
        f"{env['cpu']} ({env['cpu_count']} cores).",
        "",
        f"**Scope:** {env['what']}.",
        "",
        "| part | result | record |",
        "|---|---|---|",
        f"| default-off smoke | {verdict(off['exit_code'] == 0)}: {off['passed']} passed, "
        f"{off['failed']} failed | `default-off.json` |",
        f"| parity vs reference | {verdict(parity['exit_code'] == 0)}: worst float32 log-prob "
        f"difference {parity.get('worst_fp32_logprob_diff', float('nan')):.2e} | "
        "`correctness.json` |",
        f"| tool calling via `vllm serve` | {verdict(e2e['exit_code'] == 0)}: {e2e['passed']} "
        f"passed, {e2e['failed']} failed | `correctness.json` |",
    ]
    for name, record in records.items():
        if name in BENCHMARKS:
            ran = verdict(record["exit_code"] == 0)
            lines.append(
                f"| performance, quick run | {ran}: `{record.get('command')}` | `{name}` |"
            )
    full_runs = sorted(p.name for p in EVIDENCE.glob("perf-*.json"))
    lines += [
        "",
        "Full benchmark runs kept here, with their figures explained in "
        "`docs/benchmarks.md`: " + (", ".join(f"`{n}`" for n in full_runs) or "none") + ".",
        "",
        "Check the archive with `sha256sum -c SHA256SUMS` in this folder.",
        "",
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.parse_args()
    EVIDENCE.mkdir(parents=True, exist_ok=True)
    for name in GENERATED:
        (EVIDENCE / name).unlink(missing_ok=True)

    env = environment()
    records: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="spark2_5-evidence-") as tmp:
        work = Path(tmp)
        (work / "off").mkdir()
        (work / "e2e").mkdir()
        records["default-off.json"] = {
            "environment": env,
            **pytest_record(DEFAULT_OFF_TESTS, work / "off"),
        }
        records["correctness.json"] = {
            "environment": env,
            "parity": parity_record(work),
            "end_to_end": pytest_record(E2E_TESTS, work / "e2e"),
        }
        for name, script in BENCHMARKS.items():
            out = work / name
            result = run([PYTHON, script, "--quick", "--out", str(out)])
            record = json.loads(out.read_text()) if result.returncode == 0 else {}
            records[name] = {"environment": env, "exit_code": result.returncode, **record}

    for name, record in records.items():
        write_json(name, record)
    (EVIDENCE / "README.md").write_text(report(env, records))
    sums = [
        f"{hashlib.sha256(path.read_bytes()).hexdigest()}  {path.name}"
        for path in sorted(EVIDENCE.iterdir())
        if path.name != "SHA256SUMS"
    ]
    (EVIDENCE / "SHA256SUMS").write_text("\n".join(sums) + "\n")
    failed = [name for name, record in records.items() if _failed(record)]
    print(f"evidence written to {EVIDENCE.relative_to(ROOT)}; failing parts: {failed or 'none'}")
    return 1 if failed else 0


def _failed(record: dict) -> bool:
    if "exit_code" in record:
        return record["exit_code"] != 0
    return any(_failed(part) for part in record.values() if isinstance(part, dict))


if __name__ == "__main__":
    sys.exit(main())
