"""The GPU run: parity at the real 4B shape and the seed's serving load, in one go.

Needs one NVIDIA GPU, a CUDA build of vLLM in the carrier's verified range and
this package; takes about 25 minutes. Steps, each in its own process so that
the GPU is free again after it:

1. ``build``: a checkpoint of the Spark-X2.5-4B's shape with seeded random
   weights (normal, std 0.02, the 4B's ``initializer_range``), saved in bf16.
2. ``parity-float32``, ``parity-bfloat16``: that checkpoint and an in-tree control
   of the same dimensions (``gpu_parity``), each served eager and compiled (CUDA
   graphs; greedy, 32 new tokens, prompts of 19, 57 and 1525 tokens, the last
   longer than the 512-token window), each scored by its own reference on the same
   GPU. Float32 runs with TF32 off (vLLM, Triton, the references): identical
   greedy tokens, log-probs within the project's tolerance; a control that misses
   too makes the verdict inconclusive. Bfloat16 is judged against the band the
   control measures. Compiled tokens must equal eager ones. The attention backend
   vLLM picked is recorded.
3. ``serving``: ``bench_serving.py --gpu-4b-shape``, the 4B shape at
   the seed's load (500 concurrent, 1525 input and 127 output tokens), CUDA
   graphs on, beside an in-tree Llama of the same shape in the same run.

Needs at least 40 GB of GPU memory at the 4B shape (checked before any step): an
engine holds 16.4 GB of float32 weights in its half of the GPU, the reference its
own 16.4 GB in the other half.

It then writes one JSON record (``--out``): the machine and its GPU, each
step's status, the parity results, the serving results, Spark2_5 / in-tree and
the seed README's figures beside this run's. ``--dry-run`` prints the plan and
runs nothing; ``--steps`` runs some steps (the others' results are read from
``--workdir`` if an earlier run left them there).

    python extensions/spark2_5/benchmarks/gpu_run.py --workdir DIR \
        --out extensions/spark2_5/evidence/gpu-run.json
    python extensions/spark2_5/benchmarks/gpu_run.py --dry-run
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from bench_serving import IN_TREE, SEED_README, SEED_TOKEN_MIX, SPARK
from common import ROOT, Record, table
from gpu_parity import PRECISE_FLOAT32_ENV, build_control, parity_phase

SCRIPT = Path(__file__).resolve()
BENCH_SERVING = SCRIPT.with_name("bench_serving.py")
DTYPES = ("float32", "bfloat16")
STEPS = ("build", *(f"parity-{dtype}" for dtype in DTYPES), "serving")
# Seconds a step may take at the 4B shape on a GPU; the whole run stops at
# --budget-s (default 28 minutes), each step getting at most what is left.
STEP_TIMEOUTS = {"build": 300, "parity-float32": 480, "parity-bfloat16": 480, "serving": 420}
DEFAULT_BUDGET_S = 1680
# A step not started with less than this left is skipped rather than cut short.
MIN_STEP_S = 45
PARITY_PROMPT_LENGTHS = (19, 57, SEED_TOKEN_MIX["input_len"])
PARITY_MAX_MODEL_LEN = 2048
PARITY_SEED = 0
# "tiny" is the CPU test's stand-in for the 4B, same code path.
SHAPES = ("4b", "tiny")
WEIGHT_STD = {"4b": 0.02, "tiny": 0.25}
# The seed README's headline figures, shown beside this run's.
HEADLINE = (
    ("request throughput (req/s)", "request_throughput"),
    ("output throughput (tok/s)", "output_throughput"),
    ("mean TPOT (ms)", "mean_tpot_ms"),
)


@dataclass(frozen=True)
class Step:
    name: str
    command: list[str]
    timeout_s: int
    output: Path
    env: dict[str, str] = field(default_factory=dict)


def plan(args: argparse.Namespace) -> list[Step]:
    """The steps ``args`` asks for, with their commands."""
    phase = [sys.executable, str(SCRIPT), "--workdir", str(args.workdir), "--shape", args.shape]
    commands = {
        "build": [*phase, "--phase", "build"],
        **{f"parity-{d}": [*phase, "--phase", "parity", "--dtype", d] for d in DTYPES},
        "serving": [
            sys.executable,
            str(BENCH_SERVING),
            "--gpu-4b-shape",
            "--out",
            str(args.workdir / "serving.json"),
        ],
    }
    # A CPU check's steps take what the machine needs, within the budget.
    timeouts = STEP_TIMEOUTS if args.shape == "4b" else dict.fromkeys(STEPS, int(args.budget_s))
    envs = {"parity-float32": PRECISE_FLOAT32_ENV}
    return [
        Step(
            name, commands[name], timeouts[name], args.workdir / f"{name}.json", envs.get(name, {})
        )
        for name in STEPS
        if name in args.steps
    ]


def run_step(step: Step, timeout_s: float) -> dict[str, Any]:
    """Run one step in its own process group; on timeout interrupt it (so that a
    ``vllm serve`` it started is stopped by its context manager), then kill it."""
    log = step.output.with_suffix(".log")
    started = time.monotonic()
    with open(log, "w") as log_file:
        process = subprocess.Popen(
            step.command,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, **step.env},
        )
        try:
            returncode = process.wait(timeout=timeout_s)
            status = "ok" if returncode == 0 else f"failed (exit {returncode})"
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGINT)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
            status = f"timed out after {timeout_s:.0f} s"
    outcome = {"status": status, "seconds": round(time.monotonic() - started, 1)}
    if status != "ok":
        outcome["log_tail"] = log.read_text(errors="replace")[-4000:]
    return outcome


def gpu_record(
    record: Record, steps: dict[str, dict[str, Any]], outputs: dict[str, Any]
) -> dict[str, Any]:
    """Fill ``record`` with the steps' outcomes and results (``outputs``: each step's
    JSON, or None), Spark2_5 / in-tree, and the seed README beside this run."""
    serving = outputs.get("serving")
    side_by_side = None
    if serving:
        spark, in_tree = serving["results"][SPARK], serving["results"][IN_TREE]
        side_by_side = [
            {
                "metric": label,
                "spark2_5": spark[key],
                "in_tree": in_tree[key],
                "spark2_5_over_in_tree": serving["spark2_5_over_in_tree"][key],
                "seed_readme": SEED_README[key],
                "spark2_5_over_seed_readme": spark[key] / SEED_README[key],
            }
            for label, key in HEADLINE
        ]
    record.data["steps"] = steps
    record.data["results"] = {
        "parity": {d: outputs.get(f"parity-{d}") for d in DTYPES},
        "serving": serving,
        "seed_readme_side_by_side": side_by_side,
    }
    return record.data


def _shape_config(shape: str) -> dict[str, Any]:
    from spark2_5_dev.checkpoints import spark2_5_config_dict
    from spark2_5_dev.spark_x25_4b import SPARK_X25_4B_CONFIG

    if shape == "tiny":
        return spark2_5_config_dict()
    # save_checkpoint writes the architecture, model type, auto_map and dtype itself.
    written = ("architectures", "auto_map", "model_type", "torch_dtype")
    return {k: v for k, v in SPARK_X25_4B_CONFIG.items() if k not in written}


def needed_gpu_bytes(shape: str) -> int:
    """GPU memory the parity steps need: the engine's half of the GPU holds the float32
    weights with a fifth more for activations and KV cache; the reference's float32
    copy fits in the other half."""
    from spark2_5_dev.reference import Spark2_5Reference

    with torch.device("meta"):
        parameters = sum(p.numel() for p in Spark2_5Reference(_shape_config(shape)).parameters())
    return int(2 * 4 * parameters * 1.2)


def refuse_a_small_gpu(shape: str) -> str | None:
    """Why this machine cannot run the steps at ``shape``, or None."""
    if not torch.cuda.is_available():
        return "no CUDA GPU is visible (the tiny shape runs on CPU: --shape tiny)"
    total = torch.cuda.get_device_properties(0).total_memory
    needed = needed_gpu_bytes(shape)
    if total < needed:
        return (
            f"the parity steps at shape {shape} need {needed / 1e9:.0f} GB of GPU memory "
            f"and {torch.cuda.get_device_name(0)} has {total / 1e9:.0f} GB: use a larger "
            "GPU, or run --steps serving alone"
        )
    return None


def build_phase(workdir: Path, shape: str) -> dict[str, Any]:
    import torch

    from spark2_5_dev.checkpoints import random_spark2_5, save_checkpoint

    config = _shape_config(shape)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = random_spark2_5(config, seed=PARITY_SEED, std=WEIGHT_STD[shape], device=device)
    model = model.to(torch.bfloat16)
    path = save_checkpoint(model, config, workdir / "checkpoint")
    parameters = sum(p.numel() for p in model.parameters())
    del model
    control = build_control(workdir / "control", config, WEIGHT_STD[shape], PARITY_SEED, device)
    return {
        "checkpoint": path.name,
        "control": control.name,
        "shape": shape,
        "parameters": parameters,
        "weights": f"normal(0, {WEIGHT_STD[shape]}), norms uniform(0.8, 1.2), seed "
        f"{PARITY_SEED} on {device}, saved in bfloat16",
    }


def _steps_argument(value: str) -> list[str]:
    names = [name.strip() for name in value.split(",") if name.strip()]
    unknown = [name for name in names if name not in STEPS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"--steps {value!r}: unknown step(s) {unknown or [value]}; choose from "
            f"{', '.join(STEPS)} (comma-separated)"
        )
    return names


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="write the JSON record here")
    parser.add_argument(
        "--workdir", type=Path, help="checkpoint, step logs and results (default: a temp dir)"
    )
    parser.add_argument(
        "--steps",
        type=_steps_argument,
        default=list(STEPS),
        help=f"comma-separated steps to run, of {', '.join(STEPS)} (default: all)",
    )
    parser.add_argument(
        "--budget-s",
        type=float,
        default=DEFAULT_BUDGET_S,
        help=f"stop the run after this many seconds (default {DEFAULT_BUDGET_S})",
    )
    parser.add_argument("--dry-run", action="store_true", help="print the plan, run nothing")
    parser.add_argument(
        "--shape",
        choices=SHAPES,
        default="4b",
        help="4b (the GPU run) or tiny (a CPU check of the same code path)",
    )
    parser.add_argument(
        "--phase", choices=("build", "parity"), help="internal: run one step in this process"
    )
    parser.add_argument("--dtype", choices=DTYPES, help="internal: the parity step's dtype")
    return parser


def _shown(command: list[str]) -> str:
    """A step's command as typed from the repository root."""
    shown = ["python" if part == sys.executable else part for part in command]
    root = f"{ROOT}{os.sep}"
    return shlex.join([part.removeprefix(root) for part in shown])


def print_plan(steps: list[Step], args: argparse.Namespace) -> None:
    longest = sum(step.timeout_s for step in steps)
    print(
        f"GPU run, shape {args.shape}, workdir {args.workdir}: {len(steps)} steps, at most "
        f"{min(longest, args.budget_s):.0f} s (each step stops at its timeout or the budget)"
    )
    for number, step in enumerate(steps, 1):
        print(f"  {number}. {step.name:<16} <= {step.timeout_s:>3} s  $ {_shown(step.command)}")
    print(f"record: {args.out or '(none: no --out)'}")


def print_summary(data: dict[str, Any]) -> None:
    rows = [
        [name, outcome["status"], outcome["seconds"]] for name, outcome in data["steps"].items()
    ]
    print(table(["step", "status", "seconds"], rows))
    for dtype, result in data["results"]["parity"].items():
        if result:
            backends = {r["eager"]["attention_backend"] for r in result["results"].values()}
            print(
                f"parity {dtype} on {result['device']} ({', '.join(sorted(backends))}): "
                f"within tolerance {result['within_tolerance']}, conclusive "
                f"{result['conclusive']}, compiled equals eager {result['compiled_equals_eager']}"
            )
    side_by_side = data["results"]["seed_readme_side_by_side"]
    if side_by_side:
        headers = ["metric", "Spark2_5", "in-tree", "Spark2_5 / in-tree", "seed README"]
        keys = ("metric", "spark2_5", "in_tree", "spark2_5_over_in_tree", "seed_readme")
        print(table(headers, [[row[key] for key in keys] for row in side_by_side]))


def _run_phase(args: argparse.Namespace) -> None:
    """One step inside this process (``--phase``); its JSON goes to the workdir."""
    if args.phase == "build":
        name, result = "build", build_phase(args.workdir, args.shape)
    else:
        result = parity_phase(args.workdir, args.dtype, PARITY_PROMPT_LENGTHS, PARITY_SEED)
        name = f"parity-{args.dtype}"
    (args.workdir / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.phase == "parity" and args.dtype is None:
        parser.error(f"--phase parity needs --dtype, one of {', '.join(DTYPES)}")
    if args.workdir is None:
        args.workdir = Path("WORKDIR" if args.dry_run else tempfile.mkdtemp(prefix="gpu-run-"))
    if args.phase:
        _run_phase(args)
        return 0
    steps = plan(args)
    print_plan(steps, args)
    if args.dry_run:
        return 0
    parity_steps = any(name.startswith("parity") for name in args.steps)
    refusal = refuse_a_small_gpu(args.shape) if args.shape == "4b" and parity_steps else None
    if refusal:
        print(f"gpu_run: {refusal}", file=sys.stderr)
        return 2
    args.workdir.mkdir(parents=True, exist_ok=True)
    record = Record("gpu-run", {"shape": args.shape, "steps": args.steps})
    deadline = time.monotonic() + args.budget_s
    outcomes = {}
    for step in steps:
        step.output.unlink(missing_ok=True)  # never report an earlier run's result
        left = deadline - time.monotonic()
        if left < MIN_STEP_S:
            outcomes[step.name] = {"status": f"skipped: {left:.0f} s of the budget left"}
            continue
        print(f"\n== {step.name}", flush=True)
        outcomes[step.name] = run_step(step, min(step.timeout_s, left))
    outputs = {}
    for name in STEPS:
        output = args.workdir / f"{name}.json"
        outputs[name] = json.loads(output.read_text()) if output.exists() else None
    data = gpu_record(record, outcomes, outputs)
    print_summary(data)
    record.finish(args.out)
    return 0 if all(o["status"] == "ok" for o in outcomes.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
