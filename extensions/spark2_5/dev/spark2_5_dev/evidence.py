"""The Spark2_5 carrier's evidence plan (run by ``scripts/evidence spark2_5``).

- ``default-off.json``: the default-off smoke and entry-point purity tests;
- ``correctness.json``: the parity matrix against the reference, the
  end-to-end tool-calling tests through ``vllm serve``, and the serving soak
  (:mod:`spark2_5_dev.soak`: load, hung-up streams, malformed requests);
- ``quick-perf-*.json``: the benchmark scripts' quick runs.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from carrier_harness.evidence import PYTHON, EvidencePlan, pytest_record, run, verdict
from spark2_5_dev.carrier import ENABLE_ENV

HERE = "extensions/spark2_5"


def _parity(workdir: Path) -> dict[str, Any]:
    out = workdir / "parity.json"
    env = {**os.environ, ENABLE_ENV: "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    module = "spark2_5_dev.parity"
    result = run(
        [PYTHON, "-m", module, "--workdir", str(workdir / "ckpt"), "--out", str(out)], env=env
    )
    if result.returncode != 0:
        return {"command": f"python -m {module}", "exit_code": result.returncode}
    return {"command": f"python -m {module}", "exit_code": 0, **json.loads(out.read_text())}


def _soak(workdir: Path) -> dict[str, Any]:
    out = workdir / "soak.json"
    module = "spark2_5_dev.soak"
    result = run([PYTHON, "-m", module, "--out", str(out)])
    record = json.loads(out.read_text()) if out.exists() else {}
    record.pop("environment", None)  # the same as the evidence's own
    return {"command": f"python -m {module}", **record, "exit_code": result.returncode}


def correctness(workdir: Path) -> dict[str, Any]:
    (workdir / "e2e").mkdir()
    return {
        "parity": _parity(workdir),
        "end_to_end": pytest_record([f"{HERE}/tests/test_e2e_serve.py"], workdir / "e2e"),
        "soak": _soak(workdir),
    }


def _soak_row(soak: dict[str, Any]) -> str:
    requests = sum(soak.get("requests", {}).values())
    passes = [part for name, part in soak.get("passes", {}).items() if name != "alone"]
    peak = min((part.get("peak_in_flight", 0) for part in passes), default=0)
    growth = soak.get("rss_growth", float("nan"))
    rounds = len(soak.get("rss_growth_per_round", []))
    return (
        f"| serving soak via `vllm serve` | {verdict(soak['exit_code'] == 0)}: {requests} "
        f"requests ({peak} at once), {len(soak.get('failures', []))} failures, RSS "
        f"{growth:+.2%} per measured round (median of {rounds}) | `correctness.json` |"
    )


def correctness_rows(record: dict[str, Any]) -> list[str]:
    parity, e2e = record["parity"], record["end_to_end"]
    worst = parity.get("worst_fp32_logprob_diff", float("nan"))
    return [
        f"| parity vs reference | {verdict(parity['exit_code'] == 0)}: worst float32 log-prob "
        f"difference {worst:.2e} | `correctness.json` |",
        f"| tool calling via `vllm serve` | {verdict(e2e['exit_code'] == 0)}: {e2e['passed']} "
        f"passed, {e2e['failed']} failed | `correctness.json` |",
        _soak_row(record["soak"]),
    ]


PLAN = EvidencePlan(
    carrier="spark2_5",
    title="Spark2_5 carrier evidence",
    scope="CPU run of vLLM's CPU build on tiny stand-in Spark2_5 checkpoints built by the "
    "tests; not a GPU result and not the real Spark-X2.5-4B weights",
    default_off_tests=[f"{HERE}/tests/test_default_off.py", f"{HERE}/tests/test_entry_point.py"],
    correctness=correctness,
    correctness_rows=correctness_rows,
    quick_benchmarks={
        "quick-perf-model.json": f"{HERE}/benchmarks/bench_model.py",
        "quick-perf-carrier.json": f"{HERE}/benchmarks/bench_carrier.py",
    },
)
