"""Spark2_5 model cost on real vLLM (CPU): throughput against in-tree Llama, and memory.

Throughput: offline ``LLM.generate`` over a batch of random-token prompts with a
fixed output length (``ignore_eos``), the Spark2_5 carrier on a random
checkpoint against in-tree ``LlamaForCausalLM`` holding that checkpoint's own
tensors (same dims, vocab, layer_types and sliding window, same dtype and
engine settings), so both compute on the same numbers. Llama has no head-wise
output gate and one RoPE for all layers, and its MLP is SiLU where Spark2_5's
is exact GELU, so the baseline's MLP runs vLLM's exact-GELU ``GeluAndMul`` (a
benchmark-only patch of the in-tree ``LlamaMLP``): against it the gate is the
only extra work. (Gemma v1 has an exact-GELU MLP in-tree but no sliding
window, so its KV cache is one group where both hybrid models have two.)

A round starts one fresh engine process per model, side by side, keeps them all
alive and interleaves their timed runs: the machine's slow spells then fall on
every model alike, and fresh processes each round average out how one process's
memory happens to be laid out. A round's ratio compares its engines' fastest
runs, in output tokens per second of wall clock and of the engine process's CPU
time; the report gives the geometric mean over rounds with its 95% interval,
whose half-width is the resolution achieved. ``bench_additions.py`` prices the
gate within one engine, where process layout cancels, to a finer resolution.

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
import contextlib
import random
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from common import (
    FOUR_B_LAYER_DIMS,
    SMALL_SPARK_DIMS,
    Record,
    allocator,
    base_parser,
    positive_int,
    ratio_interval,
    spread,
    warn_without_tcmalloc,
)
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
# A second engine of the carrier's own checkpoint: an A/A control.
CONTROL = "spark2_5 again"
# A trained model's weight scale (the 4B's initializer_range): activations stay O(1).
WEIGHT_STD = 0.02
# The headline (same work but the gate), against stock Llama, the activation alone,
# and the control: 1.00 by construction, so its interval is what the set-up resolves.
RATIOS = (
    ("spark2_5", GELU_LLAMA),
    ("spark2_5", CONTROL),
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
                "prefill, 2 prompts of 1024 tokens (1 output token), 4B layers",
                hybrid,
                512,
                batch=2,
                prompt_len=1024,
                output_len=1,
                max_model_len=2048,
            ),
        ]


def random_prompts(batch: int, length: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(*PROMPT_TOKEN_RANGE) for _ in range(length)] for _ in range(batch)]


def build_spark2_5(workdir: Path, scenario: Scenario, dims: dict[str, int]) -> Path:
    """A Spark2_5 checkpoint of ``scenario``'s layers at a trained model's weight scale."""
    from spark2_5_dev.checkpoints import build_spark2_5_checkpoint

    # Untied like the Llama twin; tying changes memory, not work.
    return build_spark2_5_checkpoint(
        workdir / "spark2_5",
        seed=0,
        std=WEIGHT_STD,
        sliding_window=scenario.sliding_window,
        tie_word_embeddings=False,
        layer_types=scenario.layer_types,
        **dims,
    )


def build_models(workdir: Path, scenario: Scenario, dims: dict[str, int]) -> dict[str, Path]:
    """The Spark2_5 checkpoint and the Llama holding its tensors: both models then
    compute on the same weights."""
    from spark2_5_dev.checkpoints import build_llama_twin

    spark2_5 = build_spark2_5(workdir, scenario, dims)
    return {"spark2_5": spark2_5, "llama": build_llama_twin(spark2_5, workdir / "llama")}


def run_throughput(
    scenario: Scenario,
    dims: dict[str, int],
    rounds: RoundPlan,
    engine_settings: dict[str, Any],
) -> dict[str, Any]:
    """Rounds of one fresh engine per model, all alive at once, their runs interleaved;
    ``engine_settings``: dtype, threads, enforce_eager."""
    print(f"\n== throughput: {scenario.name}", flush=True)
    # Per model and round: output tokens per wall second and per CPU second of
    # that engine's process (robust to other jobs time-slicing the same cores),
    # of its fastest run, and per CPU second of each of its runs.
    rates: dict[str, dict[str, list[Any]]] = {
        key: {name: [] for name in rounds.models} for key in ("wall", "cpu", "runs_cpu", "init_s")
    }
    # One extra run per model, in round 1, under torch.profiler: where the time goes.
    op_profiles: dict[str, dict[str, Any]] = {}
    request = {
        "prompts": random_prompts(scenario.batch, scenario.prompt_len, seed=1),
        "output_len": scenario.output_len,
    }
    with tempfile.TemporaryDirectory(prefix="bench-model-") as tmp:
        specs = _engine_specs(build_models(Path(tmp), scenario, dims), scenario, engine_settings)
        models = {name: specs[name] for name in rounds.models}
        for index in range(rounds.count):
            samples = _round(models, request, rounds.runs, index, profile=index == 0)
            for name, sample in samples.items():
                for key in rates:
                    rates[key][name].append(sample[key])
                if index == 0:
                    op_profiles[name] = sample["profile"]
            print(
                f"  round {index + 1}, output tok per CPU second of the fastest run (all runs): "
                + ", ".join(
                    f"{name} {samples[name]['cpu']:.4g} "
                    f"({' '.join(f'{rate:.4g}' for rate in samples[name]['runs_cpu'])})"
                    for name in rounds.models
                ),
                flush=True,
            )
    return {
        "scenario": asdict(scenario),
        "output_tokens_per_run": scenario.batch * scenario.output_len,
        "runs_per_engine": rounds.runs,
        "output_tok_s": {
            clock: {name: spread(values) for name, values in rates[clock].items()}
            for clock in ("wall", "cpu")
        },
        "ratios": {
            f"{over} / {under}": {
                clock: ratio_interval(
                    [o / u for o, u in zip(rates[clock][over], rates[clock][under], strict=True)]
                )
                for clock in ("wall", "cpu")
            }
            for over, under in RATIOS
            if over in rounds.models and under in rounds.models
        },
        "runs_output_tok_per_cpu_s": rates["runs_cpu"],
        "engine_init_s": {name: spread(values) for name, values in rates["init_s"].items()},
        "op_self_cpu_ms": op_profiles,
    }


@dataclass(frozen=True)
class RoundPlan:
    models: tuple[str, ...]
    count: int
    # Timed runs per engine per round, interleaved across the engines.
    runs: int


def _engine_specs(
    paths: dict[str, Path], scenario: Scenario, settings: dict[str, Any]
) -> dict[str, EngineSpec]:
    shared = {"max_model_len": scenario.max_model_len, **settings}
    return {
        "spark2_5": EngineSpec(str(paths["spark2_5"]), **shared),
        CONTROL: EngineSpec(str(paths["spark2_5"]), **shared),
        GELU_LLAMA: EngineSpec(str(paths["llama"]), **shared, exact_gelu_mlp=True),
        "llama": EngineSpec(str(paths["llama"]), **shared),
    }


def rotated(names: list[str], shift: int) -> list[str]:
    shift %= len(names)
    return names[shift:] + names[:shift]


def _round(
    specs: dict[str, EngineSpec],
    request: dict[str, Any],
    runs: int,
    index: int,
    profile: bool = False,
) -> dict[str, dict[str, Any]]:
    """One fresh engine process per model, started side by side and all alive at once,
    their timed runs interleaved in rotating order: a slow spell of the machine (memory
    bandwidth taken by a neighbour, a slower clock) falls on every model alike, which
    running one engine after the other does not give. Which engine is spawned first
    rotates by round too: of one checkpoint's two engines, the first spawned decoded
    faster. An engine's figure for the round is its fastest run: what the machine does
    to a run only slows it, while what differs between processes of one model (how its
    memory is laid out) stays in every run of that process, so fresh processes each
    round still sample it."""
    names = list(specs)
    with contextlib.ExitStack() as stack:
        engines = {name: stack.enter_context(Engine(specs[name])) for name in rotated(names, index)}
        for engine in engines.values():
            engine.ask("generate", {"prompts": request["prompts"][:4], "output_len": 4})
        results: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
        for cycle in range(index, index + runs):
            for name in rotated(names, cycle):
                results[name].append(engines[name].ask("generate", request))
        ops = {
            name: _top_ops(engines[name].ask("profile", request)) if profile else None
            for name in names
        }
    return {
        name: {
            **_fastest_run(results[name]),
            "init_s": engines[name].init_s,
            "profile": ops[name],
        }
        for name in names
    }


def _fastest_run(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Output tokens per wall and per CPU second of the fastest of an engine's runs,
    and per CPU second of each run."""
    cpu_rates = [r["output_tokens"] / r["cpu_s"] for r in results]
    return {
        "wall": max(r["output_tokens"] / r["elapsed_s"] for r in results),
        "cpu": max(cpu_rates),
        "runs_cpu": cpu_rates,
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
                    engine.ask(
                        "generate", {"prompts": random_prompts(4, 32, seed=2), "output_len": 8}
                    )
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
        type=positive_int,
        help="rounds per scenario, each starting one fresh engine per model (default 8, "
        "3 with --quick); the printed resolution says whether they were enough",
    )
    parser.add_argument(
        "--runs",
        type=positive_int,
        help="timed runs per engine per round, interleaved across the models; the "
        "fastest counts (default 3)",
    )
    parser.add_argument(
        "--stock-llama",
        action="store_true",
        help="throughput: also the stock (SiLU) Llama, to price the activation alone",
    )
    parser.add_argument(
        "--control",
        action="store_true",
        help="throughput: also a second engine of the carrier's checkpoint; its ratio to "
        "the first is 1.00 by construction, so what it shows is the set-up's own noise "
        "and bias",
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
    args.runs = args.runs or (1 if args.quick else 3)
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
        "weights": f"random N(0, {WEIGHT_STD}), norm weights U(0.8, 1.2); the Llama "
        "holds the Spark2_5 checkpoint's own tensors (no g_proj)",
        "baselines": "in-tree LlamaForCausalLM, identical dims, layer_types and window, "
        "no output gate, one RoPE, exact GELU in its MLP"
        + (", and stock (SiLU MLP)" if args.stock_llama else "")
        + ("; control: a second engine of the carrier's checkpoint" if args.control else ""),
        "rounds_design": "each round: one fresh engine process per model, started side "
        "by side, all alive, their timed runs interleaved in rotating order; an engine's "
        "round figure is its fastest run; ratios are geometric means of same-round "
        "ratios with a 95% t interval",
        "allocator": allocator(),
        "engine": "offline LLM.generate, in-process engine, VLLM_CPU_KVCACHE_SPACE=1; "
        + (
            "throughput in vLLM's default mode (torch.compile), memory eager"
            if args.compiled
            else "enforce_eager"
        ),
    }


def chosen_scenarios(quick: bool, dims: str, text: str | None) -> list[Scenario]:
    """The ``dims`` scenarios whose name holds ``text`` (all without it)."""
    scenarios = Scenario.for_mode(quick, dims)
    chosen = [s for s in scenarios if text is None or text in s.name]
    if not chosen:
        names = "; ".join(repr(s.name) for s in scenarios)
        raise SystemExit(
            f"--scenario {text!r} names none of the --dims {dims} scenarios: "
            f"{names}. Give part of one of those names."
        )
    return chosen


def main() -> int:
    args = _parse_args()
    warn_without_tcmalloc()
    record = Record("model", _settings(args))
    results = record.data["results"]
    if args.only in (None, "throughput"):
        engine_settings = {
            "dtype": args.dtype,
            "threads": args.threads,
            "enforce_eager": not args.compiled,
        }
        models = (
            ("spark2_5", GELU_LLAMA)
            + (("llama",) if args.stock_llama else ())
            + ((CONTROL,) if args.control else ())
        )
        rounds = RoundPlan(models, args.rounds, args.runs)
        results["throughput"] = [
            run_throughput(scenario, THROUGHPUT_DIMS[args.dims], rounds, engine_settings)
            for scenario in chosen_scenarios(args.quick, args.dims, args.scenario)
        ]
    if args.only in (None, "memory"):
        results["memory"] = run_memory(args.memory_repeats, args.dtype, args.threads)
    print_report(results)
    record.finish(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
