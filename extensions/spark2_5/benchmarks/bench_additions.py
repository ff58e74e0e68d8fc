"""What the carrier's additions cost inside one engine of it, forward by forward, at
the Spark-X2.5-4B's layer dimensions, on real vLLM (CPU, eager).

The additions are the work a Spark2_5 layer does beyond an in-tree Llama layer of
the same dims: the head-wise output gate (``g_proj`` and the fp32 gate math) and,
on vLLM's CPU build, the finite keys/values guard. A fresh engine of a Spark2_5
checkpoint (``bench_model.py``'s scenarios and weights) serves timed
``LLM.generate`` runs while benchmark-only hooks on its model switch the
additions on and off from one model forward to the next (on, off, off, on, ...)
and take each forward's process CPU time. A forward without them does an
in-tree Llama layer's work, but for RoPE: the full-attention layers rotate 64
of 256 dims where Llama's rotate all (RoPE is under 0.5% of a run either way,
``perf-model-4b.json``'s operator tables). Its output is not the model's, which
the fixed-length runs (``ignore_eos``) do not care about.

Consecutive forwards of the same token rows form a pair; a pair's ratio is the
off-forward's CPU time over the on-forward's: the model's speed with its
additions relative to without. Both run on the same weights in the same process
within a fraction of a second, so neither how a process lays out its memory
(which makes two engines of one model differ by several percent) nor the
machine's drift enters the ratio. The report gives the geometric mean over
pairs, the engines' pairs pooled, with its 95% interval, whose half-width is the
resolution achieved. The figure bounds the throughput cost from above: the
engine's work outside the model forward (scheduling, sampling) is the same for
both. ``bench_model.py --dims 4b-layers`` compares against in-tree Llama itself,
at the resolution fresh processes allow.

    python extensions/spark2_5/benchmarks/bench_additions.py [--quick] [--runs N] \
        [--engines N] [--scenario TEXT] [--out PATH.json]
"""

from __future__ import annotations

import sys
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench_model import Scenario, build_spark2_5, chosen_scenarios, random_prompts
from common import (
    FOUR_B_LAYER_DIMS,
    Record,
    allocator,
    base_parser,
    positive_int,
    ratio_interval,
    table,
    warn_without_tcmalloc,
)
from model_engine import Engine, EngineSpec
from model_report import samples_cell


def run_scenario(scenario: Scenario, engines: int, runs: int) -> dict[str, Any]:
    print(f"\n== {scenario.name}", flush=True)
    request = {
        "prompts": random_prompts(scenario.batch, scenario.prompt_len, seed=1),
        "output_len": scenario.output_len,
    }
    ratios: list[float] = []
    with tempfile.TemporaryDirectory(prefix="bench-additions-") as tmp:
        path = build_spark2_5(Path(tmp), scenario, FOUR_B_LAYER_DIMS)
        spec = EngineSpec(str(path), scenario.max_model_len, "bfloat16")
        for index in range(engines):
            engine_ratios = _engine_pairs(spec, request, runs)
            print(
                f"  engine {index + 1}: {samples_cell(ratio_interval(engine_ratios), 'pairs')}",
                flush=True,
            )
            ratios += engine_ratios
    return {
        "scenario": asdict(scenario),
        "engines": engines,
        "runs_per_engine": runs,
        "speed with / without additions": ratio_interval(ratios),
    }


def _engine_pairs(spec: EngineSpec, request: dict[str, Any], runs: int) -> list[float]:
    """One fresh engine's pair ratios over ``runs`` generate runs."""
    forwards: list[tuple[bool, int, float]] = []
    with Engine(spec) as engine:
        engine.ask("generate", {"prompts": request["prompts"][:4], "output_len": 4})
        if not engine.ask("alternate additions")["layers"]:
            raise SystemExit("the engine's model has no Spark2_5 attention layer to switch")
        for _ in range(runs):
            engine.ask("generate", request)
            forwards += engine.ask("forward times")["forwards"]
    ratios = []
    for first, second in zip(forwards[::2], forwards[1::2], strict=False):
        (first_on, first_rows, first_s), (_, second_rows, second_s) = first, second
        if first_rows == second_rows:
            on_s, off_s = (first_s, second_s) if first_on else (second_s, first_s)
            ratios.append(off_s / on_s)
    return ratios


def print_report(results: list[dict[str, Any]]) -> None:
    rows = [
        (
            item["scenario"]["name"],
            samples_cell(item["speed with / without additions"], "pairs"),
            f"±{item['speed with / without additions']['resolution']:.2%}",
        )
        for item in results
    ]
    print("\nModel forward speed with / without the additions, geometric mean of pairs [95%]:")
    print(table(("scenario", "with / without", "resolution"), rows))


def main() -> int:
    parser = base_parser(__doc__.split("\n\n")[0])
    parser.add_argument(
        "--runs", type=positive_int, help="generate runs per engine (default 12, quick 2)"
    )
    parser.add_argument(
        "--engines", type=positive_int, help="fresh engines per scenario (default 2, quick 1)"
    )
    parser.add_argument("--scenario", metavar="TEXT", help="only the scenarios naming TEXT")
    args = parser.parse_args()
    warn_without_tcmalloc()
    runs = args.runs or (2 if args.quick else 12)
    engines = args.engines or (1 if args.quick else 2)
    scenarios = chosen_scenarios(args.quick, "4b-layers", args.scenario)
    record = Record(
        "additions",
        {
            "dims": FOUR_B_LAYER_DIMS,
            "dtype": "bfloat16",
            "omp_threads_per_engine": 1,
            "engines_per_scenario": engines,
            "runs_per_engine": runs,
            "alternation": "model forwards with the additions on, off, off, on, ...",
            "allocator": allocator(),
            "engine": "offline LLM.generate, in-process engine, enforce_eager, "
            "VLLM_CPU_KVCACHE_SPACE=1, prefix caching off",
        },
    )
    record.data["results"] = [run_scenario(s, engines, runs) for s in scenarios]
    print_report(record.data["results"])
    record.finish(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
