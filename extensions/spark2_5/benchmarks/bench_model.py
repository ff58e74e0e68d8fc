"""Spark2_5 model cost on real vLLM (CPU): throughput against in-tree Llama, and memory.

Throughput: offline ``LLM.generate`` over a batch of random-token prompts with a
fixed output length (``ignore_eos``), the Spark2_5 carrier on a random
checkpoint against an in-tree model of identical dimensions (hidden, layers,
heads, KV heads, head_dim, intermediate, vocab) and the same layer_types and
sliding window, ``LlamaForCausalLM``, same dtype and engine settings. Llama has
no head-wise output gate and one RoPE for all layers, and its MLP is SiLU where
Spark2_5's is exact GELU. So the like-for-like baseline is a second Llama
engine whose MLP runs vLLM's exact-GELU ``GeluAndMul`` (a benchmark-only patch
of the in-tree ``LlamaMLP``): against it the gate is the only extra work, and
stock Llama over it is the cost of the activation itself. (Gemma v1 has an
exact-GELU MLP in-tree but no sliding window, so its KV cache is one group
where both hybrid models have two; in a trial it ran ~10% faster than the Llama
baseline, so it would not isolate the carrier's cost.) Each round starts a
fresh engine process per model, in rotating order (A B C, B C A, ...), and
times a few runs in it: the same engine runs within 2% of itself while two
processes of it can differ by 10% or more, so a sample is one process, and
medians over rounds are compared, by wall clock and by the engine process's
CPU time.

Memory: peak and resident RSS, RoPE cache bytes and KV-cache capacity of the
carrier when ``config.json`` says ``max_position_embeddings`` 1,048,576 versus
8,192 at the same ``--max-model-len``, and of the seed plugin's behaviour, which
builds the cos/sin cache over ``max_position_embeddings``. The seed behaviour is
reproduced on the carrier itself, in the measuring process only, by making its
RoPE constructor receive ``max_position_embeddings`` instead of
``max_model_len``; the rest of the model is unchanged.

``--dims 4b-layers`` times four of the Spark-X2.5-4B's own layers instead (hidden
2560, 16 heads of 256, 4 KV heads, intermediate 10240, vocab 16,384): decoding one
request and sixteen, and prefilling prompts past its 512-token window.

    python extensions/spark2_5/benchmarks/bench_model.py [--quick] [--dims 4b-layers] \
        [--out PATH.json]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from common import FOUR_B_LAYER_DIMS, SMALL_SPARK_DIMS, Record, base_parser, spread
from model_engine import Engine, EngineSpec
from model_report import print_report

MEMORY_DIMS = {
    "hidden_size": 256,
    "num_hidden_layers": 4,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 256,
    "intermediate_size": 512,
}
GELU_LLAMA = "llama with exact-GELU MLP"
# The headline (same work but the gate), against stock Llama, and the activation alone.
RATIOS = (
    ("spark2_5", GELU_LLAMA),
    ("spark2_5", "llama"),
    (GELU_LLAMA, "llama"),
)
THROUGHPUT_DIMS = {"small": SMALL_SPARK_DIMS, "4b-layers": FOUR_B_LAYER_DIMS}
ONE_MEBI_POSITIONS = 1_048_576
EIGHT_KIBI_POSITIONS = 8_192
MEMORY_MAX_MODEL_LEN = 4096
# The byte tokens of the tiny tokenizer: ordinary text, no special tokens.
PROMPT_TOKEN_RANGE = (17, 273)


@dataclass(frozen=True)
class Scenario:
    name: str
    layer_types: list[str]
    sliding_window: int
    batch: int
    prompt_len: int
    output_len: int
    max_model_len: int

    @classmethod
    def for_mode(cls, quick: bool, dims: str) -> list[Scenario]:
        layers = THROUGHPUT_DIMS[dims]["num_hidden_layers"]
        hybrid = [
            "full_attention" if (i + 1) % 4 == 0 else "sliding_attention" for i in range(layers)
        ]
        if dims == "4b-layers":
            return cls._at_4b_layer_dims(hybrid, quick)
        sliding_heavy = ["sliding_attention"] * (layers - 1) + ["full_attention"]
        return [
            cls(
                "decode, 4B layer mix (3 sliding : 1 full), window 512",
                hybrid,
                512,
                batch=32,
                prompt_len=64,
                output_len=64 if quick else 128,
                max_model_len=512,
            ),
            cls(
                "long prompts, sliding-heavy (7 sliding : 1 full), window 128",
                sliding_heavy,
                128,
                batch=32,
                # Four windows long: most keys fall outside the sliding layers' window.
                prompt_len=512,
                output_len=32,
                max_model_len=2048,
            ),
        ]

    @classmethod
    def _at_4b_layer_dims(cls, hybrid: list[str], quick: bool) -> list[Scenario]:
        """Decode one request and a batch, and prefill past the 4B's 512-token window."""
        decode = {"prompt_len": 64, "output_len": 16 if quick else 64, "max_model_len": 1024}
        return [
            cls("decode, batch 1, 4B layers (3 sliding : 1 full)", hybrid, 512, batch=1, **decode),
            cls("decode, batch 16, 4B layers", hybrid, 512, batch=16, **decode),
            cls(
                "prefill, 4 prompts of 1024 tokens (1 output token), 4B layers",
                hybrid,
                512,
                batch=4,
                prompt_len=1024,
                output_len=1,
                max_model_len=2048,
            ),
        ]


def _prompts(batch: int, length: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(*PROMPT_TOKEN_RANGE) for _ in range(length)] for _ in range(batch)]


def _build_models(workdir: Path, scenario: Scenario, dims: dict[str, int]) -> dict[str, Path]:
    from spark2_5_dev.checkpoints import (
        build_llama_checkpoint,
        build_spark2_5_checkpoint,
    )

    shared = {**dims, "layer_types": scenario.layer_types}
    # Untied like the Llama builder writes it; tying changes memory, not work.
    paths = {
        "spark2_5": build_spark2_5_checkpoint(
            workdir / "spark2_5",
            seed=0,
            sliding_window=scenario.sliding_window,
            tie_word_embeddings=False,
            **shared,
        )
    }
    paths["llama"] = build_llama_checkpoint(
        workdir / "llama", seed=0, sliding_window=scenario.sliding_window, **shared
    )
    return paths


def run_throughput(
    scenario: Scenario,
    dims: dict[str, int],
    rounds: int,
    runs: int,
    engine_settings: dict[str, Any],
) -> dict[str, Any]:
    """Rotated rounds of one fresh engine per model; ``engine_settings``: dtype,
    threads, enforce_eager."""
    print(f"\n== throughput: {scenario.name}", flush=True)
    names = ("spark2_5", GELU_LLAMA, "llama")
    # Per model and round: the median over one engine process's runs of output
    # tokens per wall second and per CPU second of that process (robust to
    # other jobs time-slicing the same cores).
    rates: dict[str, dict[str, list[float]]] = {
        clock: {name: [] for name in names} for clock in ("wall", "cpu", "init_s")
    }
    # One extra run per model, in round 1, under torch.profiler: where the time goes.
    op_profiles: dict[str, dict[str, Any]] = {}
    request = {
        "prompts": _prompts(scenario.batch, scenario.prompt_len, seed=1),
        "output_len": scenario.output_len,
    }
    with tempfile.TemporaryDirectory(prefix="bench-model-") as tmp:
        specs = _engine_specs(_build_models(Path(tmp), scenario, dims), scenario, engine_settings)
        for index in range(rounds):
            # Rotate who goes first so no model always follows the same one.
            order = names[index % len(names) :] + names[: index % len(names)]
            for name in order:
                sample = _sample(specs[name], request, runs, profile=index == 0)
                for key in rates:
                    rates[key][name].append(sample[key])
                if index == 0:
                    op_profiles[name] = sample["profile"]
                print(
                    f"  round {index + 1}: {name:26s} {sample['wall']:8.3g} output tok/s "
                    f"({sample['cpu']:8.3g} per CPU second)",
                    flush=True,
                )
    return {
        "scenario": asdict(scenario),
        "output_tokens_per_run": scenario.batch * scenario.output_len,
        "runs_per_engine": runs,
        "output_tok_s": {
            clock: {name: spread(values) for name, values in rates[clock].items()}
            for clock in ("wall", "cpu")
        },
        "ratios": {
            f"{over} / {under}": {
                clock: _ratio(rates[clock][over], rates[clock][under]) for clock in ("wall", "cpu")
            }
            for over, under in RATIOS
        },
        "engine_init_s": {name: spread(values) for name, values in rates["init_s"].items()},
        "op_self_cpu_ms": op_profiles,
    }


def _engine_specs(
    paths: dict[str, Path], scenario: Scenario, settings: dict[str, Any]
) -> dict[str, EngineSpec]:
    shared = {"max_model_len": scenario.max_model_len, **settings}
    return {
        "spark2_5": EngineSpec(str(paths["spark2_5"]), **shared),
        GELU_LLAMA: EngineSpec(str(paths["llama"]), **shared, exact_gelu_mlp=True),
        "llama": EngineSpec(str(paths["llama"]), **shared),
    }


def _sample(spec: EngineSpec, request: dict[str, Any], runs: int, profile: bool) -> dict[str, Any]:
    """One engine process: the medians of its timed runs, after a warm-up run."""
    with Engine(spec) as engine:
        engine.ask("generate", {"prompts": request["prompts"][:4], "output_len": 4})
        results = [engine.ask("generate", request) for _ in range(runs)]
        ops = _top_ops(engine.ask("profile", request)) if profile else None
    return {
        "wall": statistics.median(r["output_tokens"] / r["elapsed_s"] for r in results),
        "cpu": statistics.median(r["output_tokens"] / r["cpu_s"] for r in results),
        "init_s": engine.init_s,
        "profile": ops,
    }


def _top_ops(events: dict[str, dict[str, float]], share: float = 0.005) -> dict[str, Any]:
    """The profiled run's total operator self CPU time and the operators above ``share`` of it."""
    total = sum(event["self_cpu_ms"] for event in events.values())
    top = {
        name: event
        for name, event in sorted(events.items(), key=lambda item: -item[1]["self_cpu_ms"])
        if event["self_cpu_ms"] >= share * total
    }
    return {"total": total, "ops": top}


def _ratio(over: list[float], under: list[float]) -> dict[str, Any]:
    """Of the medians, and the median of the same-round ratios."""
    same_round = [o / u for o, u in zip(over, under, strict=True)]
    return {
        "of_medians": spread(over)["median"] / spread(under)["median"],
        "same_round": spread(same_round),
    }


def run_memory(repeats: int, dtype: str, threads: int) -> dict[str, Any]:
    print("\n== memory: max_position_embeddings 1M vs 8K at the same max_model_len", flush=True)
    variants = {
        "carrier, max_position_embeddings 8192": (EIGHT_KIBI_POSITIONS, None),
        "carrier, max_position_embeddings 1048576": (ONE_MEBI_POSITIONS, None),
        "seed behaviour (RoPE cache over max_position_embeddings), 1048576": (
            ONE_MEBI_POSITIONS,
            ONE_MEBI_POSITIONS,
        ),
    }
    from spark2_5_dev.checkpoints import build_spark2_5_checkpoint

    samples: dict[str, list[dict[str, Any]]] = {name: [] for name in variants}
    with tempfile.TemporaryDirectory(prefix="bench-memory-") as tmp:
        paths = {
            positions: build_spark2_5_checkpoint(
                Path(tmp) / f"mpe-{positions}",
                seed=0,
                max_position_embeddings=positions,
                **MEMORY_DIMS,
            )
            for positions in (EIGHT_KIBI_POSITIONS, ONE_MEBI_POSITIONS)
        }
        for index in range(repeats):
            names = list(variants) if index % 2 == 0 else list(reversed(variants))
            for name in names:
                positions, rope_positions = variants[name]
                spec = EngineSpec(
                    str(paths[positions]),
                    MEMORY_MAX_MODEL_LEN,
                    dtype,
                    threads,
                    rope_positions=rope_positions,
                )
                with Engine(spec) as engine:
                    engine.ask("generate", {"prompts": _prompts(4, 32, seed=2), "output_len": 8})
                    figures = engine.ask("memory")
                samples[name].append(figures)
                print(
                    f"  {name}: peak RSS {figures['peak_rss_mib']:.0f} MiB, "
                    f"RoPE cache {figures['rope_cache_mib']:.1f} MiB, "
                    f"KV {figures['kv_cache_tokens']} tokens",
                    flush=True,
                )
    summary = {
        name: {key: spread([s[key] for s in runs]) for key in runs[0]}
        for name, runs in samples.items()
    }
    baseline = summary["carrier, max_position_embeddings 8192"]
    for figures in summary.values():
        figures["peak_rss_delta_mib"] = (
            figures["peak_rss_mib"]["median"] - baseline["peak_rss_mib"]["median"]
        )
        figures["rss_delta_mib"] = figures["rss_mib"]["median"] - baseline["rss_mib"]["median"]
    return {
        "dims": MEMORY_DIMS,
        "max_model_len": MEMORY_MAX_MODEL_LEN,
        "variants": summary,
    }


def _parse_args() -> argparse.Namespace:
    parser = base_parser(__doc__.split("\n\n")[0])
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    parser.add_argument(
        "--rounds",
        type=int,
        help="rounds per scenario, each starting one fresh engine per model",
    )
    parser.add_argument(
        "--runs", type=int, help="timed runs per engine process (its median is one sample)"
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="OpenMP threads per engine (default 1: on a shared 2-core machine a 2-thread "
        "team waits at every op for a descheduled thread, which swamps the comparison)",
    )
    parser.add_argument(
        "--only", choices=("throughput", "memory"), help="run one part (default: both)"
    )
    parser.add_argument(
        "--compiled",
        action="store_true",
        help="throughput in vLLM's default execution mode (torch.compile) instead of eager",
    )
    parser.add_argument(
        "--scenario",
        metavar="TEXT",
        help="throughput: only the scenarios whose name contains TEXT (e.g. prefill)",
    )
    parser.add_argument(
        "--dims",
        choices=tuple(THROUGHPUT_DIMS),
        default="small",
        help="throughput models: small (seconds per run) or four of the 4B's own layers",
    )
    args = parser.parse_args()
    args.rounds = args.rounds or (3 if args.quick else 8)
    args.runs = args.runs or (1 if args.quick else 2)
    args.memory_repeats = 1 if args.quick else 3
    return args


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    dims = THROUGHPUT_DIMS[args.dims]
    return {
        "dtype": args.dtype,
        "omp_threads_per_engine": args.threads,
        "rounds": args.rounds,
        "runs_per_engine": args.runs,
        "memory_repeats": args.memory_repeats,
        "throughput_dims": dims,
        "vocab_size": dims.get("vocab_size", "320 (the tiny tokenizer's checkpoints, both models)"),
        "baselines": "in-tree LlamaForCausalLM, identical dims, layer_types and window, "
        "no output gate, one RoPE: stock (SiLU MLP) and with exact GELU in its MLP",
        "engine": "offline LLM.generate, in-process engine, VLLM_CPU_KVCACHE_SPACE=1; "
        + (
            "throughput in vLLM's default mode (torch.compile), memory eager"
            if args.compiled
            else "enforce_eager"
        ),
    }


def main() -> int:
    args = _parse_args()
    record = Record("model", _settings(args))
    results = record.data["results"]
    if args.only in (None, "throughput"):
        engine_settings = {
            "dtype": args.dtype,
            "threads": args.threads,
            "enforce_eager": not args.compiled,
        }
        results["throughput"] = [
            run_throughput(
                scenario, THROUGHPUT_DIMS[args.dims], args.rounds, args.runs, engine_settings
            )
            for scenario in Scenario.for_mode(args.quick, args.dims)
            if args.scenario is None or args.scenario in scenario.name
        ]
    if args.only in (None, "memory"):
        results["memory"] = run_memory(args.memory_repeats, args.dtype, args.threads)
    print_report(results)
    record.finish(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
