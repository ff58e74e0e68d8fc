"""What the carrier's additions cost end to end, inside one engine of it, at the
Spark-X2.5-4B's layer dimensions, on real vLLM (CPU, eager).

The additions are the work a Spark2_5 layer does beyond an in-tree Llama layer of
the same dims: the head-wise output gate (``g_proj`` and the fp32 gate math) and,
on vLLM's CPU build, the finite keys/values guard. One fresh engine of a Spark2_5
checkpoint (``bench_model.py``'s scenarios and weights) alternates timed
``LLM.generate`` runs with its additions on and switched off (``apply_model``
drops ``g_proj`` and the guard from every layer, a benchmark-only switch: the
runs' work then is an in-tree Llama layer's, their outputs are not the model's).

Both arms run in one process on the same weights, so how a process happens to
lay out its memory, which makes two engines of one model differ by several
percent, cancels; runs alternate on, off, off, on, ... so a drift of the machine
cancels within each pair of runs too. A pair's ratio is its on-run's output
tokens per process CPU second over its off-run's; the report gives the geometric
mean over pairs, the engines' pairs pooled, with its 95% interval, whose
half-width is the resolution achieved. ``bench_model.py --dims 4b-layers`` then
compares against in-tree Llama itself, at the resolution fresh processes allow.

    python extensions/spark2_5/benchmarks/bench_additions.py [--quick] [--pairs N] \
        [--engines N] [--scenario TEXT] [--out PATH.json]
"""

from __future__ import annotations

import sys
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench_model import Scenario, build_spark2_5, random_prompts
from common import (
    FOUR_B_LAYER_DIMS,
    Record,
    allocator,
    base_parser,
    positive_int,
    ratio_interval,
    spread,
    table,
    warn_without_tcmalloc,
)
from model_engine import Engine, EngineSpec


def run_scenario(scenario: Scenario, engines: int, pairs: int) -> dict[str, Any]:
    print(f"\n== {scenario.name}", flush=True)
    request = {
        "prompts": random_prompts(scenario.batch, scenario.prompt_len, seed=1),
        "output_len": scenario.output_len,
    }
    ratios: list[float] = []
    rates: dict[str, list[float]] = {"on": [], "off": []}
    with tempfile.TemporaryDirectory(prefix="bench-additions-") as tmp:
        path = build_spark2_5(Path(tmp), scenario, FOUR_B_LAYER_DIMS)
        spec = EngineSpec(str(path), scenario.max_model_len, "bfloat16")
        for index in range(engines):
            with Engine(spec) as engine:
                engine.ask("generate", {"prompts": request["prompts"][:4], "output_len": 4})
                for pair in range(pairs):
                    arms = ("on", "off") if pair % 2 == 0 else ("off", "on")
                    pair_rates = {arm: _timed_run(engine, arm, request) for arm in arms}
                    for arm, rate in pair_rates.items():
                        rates[arm].append(rate)
                    ratios.append(pair_rates["on"] / pair_rates["off"])
            engine_ratio = ratio_interval(ratios[-pairs:])
            print(f"  engine {index + 1}: on / off {_cell(engine_ratio)}", flush=True)
    return {
        "scenario": asdict(scenario),
        "engines": engines,
        "pairs_per_engine": pairs,
        "output_tok_per_cpu_s": {arm: spread(values) for arm, values in rates.items()},
        "on / off": ratio_interval(ratios),
    }


def _timed_run(engine: Engine, arm: str, request: dict[str, Any]) -> float:
    if not engine.ask("additions", {"on": arm == "on"})["layers"]:
        raise SystemExit("the engine's model has no Spark2_5 attention layer to switch")
    result = engine.ask("generate", request)
    return result["output_tokens"] / result["cpu_s"]


def _cell(ratio: dict[str, Any]) -> str:
    low, high = ratio["ci95"]
    return f"{ratio['geomean']:.4f} [{low:.4f}, {high:.4f}]"


def print_report(results: list[dict[str, Any]]) -> None:
    rows = [
        (
            item["scenario"]["name"],
            item["engines"] * item["pairs_per_engine"],
            _cell(item["on / off"]),
            f"±{item['on / off']['resolution']:.2%}",
        )
        for item in results
    ]
    print("\nOutput tok per CPU second, additions on / off, geometric mean of pairs [95%]:")
    print(table(("scenario", "pairs", "on / off", "resolution"), rows))


def main() -> int:
    parser = base_parser(__doc__.split("\n\n")[0])
    parser.add_argument(
        "--pairs", type=positive_int, help="on/off run pairs per engine (default 24, quick 4)"
    )
    parser.add_argument(
        "--engines", type=positive_int, help="fresh engines per scenario (default 2, quick 1)"
    )
    parser.add_argument("--scenario", metavar="TEXT", help="only the scenarios naming TEXT")
    args = parser.parse_args()
    warn_without_tcmalloc()
    pairs = args.pairs or (4 if args.quick else 24)
    engines = args.engines or (1 if args.quick else 2)
    scenarios = [
        s
        for s in Scenario.for_mode(args.quick, "4b-layers")
        if args.scenario is None or args.scenario in s.name
    ]
    if not scenarios:
        raise SystemExit(f"--scenario {args.scenario!r} names no scenario of bench_model.py")
    record = Record(
        "additions",
        {
            "dims": FOUR_B_LAYER_DIMS,
            "dtype": "bfloat16",
            "omp_threads_per_engine": 1,
            "engines_per_scenario": engines,
            "pairs_per_engine": pairs,
            "allocator": allocator(),
            "engine": "offline LLM.generate, in-process engine, enforce_eager, "
            "VLLM_CPU_KVCACHE_SPACE=1, prefix caching off",
        },
    )
    record.data["results"] = [run_scenario(s, engines, pairs) for s in scenarios]
    print_report(record.data["results"])
    record.finish(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
