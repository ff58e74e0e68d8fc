"""Spark2_5 against in-tree Llama in one process on one copy of the weights, at the
Spark-X2.5-4B's layer dimensions, on real vLLM (CPU), eager or compiled.

Why one copy: where an engine's weights land in memory sets its decode speed, and
keeps it for the engine's life. Engines in separate processes (``bench_model.py``)
or with their own copies in one process (``--own-weights``, the contrast) differ
by several percent that way, so comparing them needs dozens of rounds per percent.

So one process builds three engines of ``bench_model.py``'s 4B-layer scenarios:
Spark2_5, the exact-GELU Llama holding the same tensors, and Spark2_5 again (the
control). Each engine built after the first takes, for every projection and the
LM head, the weights of the first engine's projection of the same name as vLLM
set them up (packed, or the weights themselves where vLLM computes with torch),
after checking that the two hold equal values: the models then read the same
memory and differ only in their own work (Spark2_5's output gate, its separate
``g_proj``, the finite keys/values guard on CPU). All engines get the same
requests; they step in turn, the first to step rotating, and each step's
process CPU time is taken, so a drift of the machine falls on all of them alike.

A run's ratio is Llama's CPU seconds over Spark2_5's for the same tokens: Spark2_5's
speed relative to Llama. The report's figure is the geometric mean over processes
(one sample each: the geometric mean of its runs; which engine each builds first
rotates) with its 95% interval, whose half-width is the resolution achieved; the
runs pooled beside it miss what varies by process. The same for the control,
whose true ratio is 1.00. The control also decodes the very tokens Spark2_5
decodes, or the run stops.

    python extensions/spark2_5/benchmarks/bench_shared_weights.py [--quick] \
        [--compiled] [--own-weights] [--runs N] [--processes N] [--scenario TEXT] \
        [--out PATH.json]
"""

from __future__ import annotations

import itertools
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench_model import (
    CONTROL,
    GELU_LLAMA,
    Scenario,
    build_models,
    chosen_scenarios,
    random_prompts,
    rotated,
)
from common import (
    FOUR_B_LAYER_DIMS,
    Record,
    allocator,
    base_parser,
    positive_int,
    ratio_interval,
    table,
    two_or_more,
    use_in_process_engine,
    warn_without_tcmalloc,
)
from model_engine import (
    Engine,
    answer_commands,
    offline_llm,
    prompts_and_params,
    use_exact_gelu_in_llama_mlp,
)
from model_report import samples_cell

MODELS = ("spark2_5", GELU_LLAMA, CONTROL)
RATIOS = {f"spark2_5 / {GELU_LLAMA}": GELU_LLAMA, f"spark2_5 / {CONTROL}": CONTROL}
# Spark2_5's projection names as in-tree Llama names the same projection.
LLAMA_NAMES = {"q_k_v_proj": "qkv_proj", "out_proj": "o_proj"}


@dataclass(frozen=True)
class ProcessPlan:
    """The engines one process builds, in building order."""

    checkpoints: dict[str, str]
    order: tuple[str, ...]
    max_model_len: int
    enforce_eager: bool
    # False: each engine packs its own weights, wherever they land (the contrast).
    share_weights: bool = True


def share_projection_weights() -> dict[str, int]:
    """From now on in this process, a CPU projection set up for an engine computes
    from what the first projection of the same name and equal values computes from:
    its packed weights (oneDNN's or the AMX kernel's, the weight itself removed) or,
    where vLLM fell back to torch's linear (no oneDNN bf16 matmul below AVX-512), its
    weight. Returns the live count of projections that took another's."""
    from vllm.model_executor.layers import utils

    set_up = utils.dispatch_cpu_unquantized_gemm
    # By name: the first projection's weight as loaded (to check the later ones'
    # values against) and the projection, as set up.
    first: dict[str, tuple[Any, Any]] = {}
    shared = {"projections": 0}

    def set_up_once(layer: Any, remove_weight: bool) -> None:
        name = ".".join(LLAMA_NAMES.get(part, part) for part in layer.prefix.split("."))
        if name not in first:
            first[name] = (layer.weight, layer)
            set_up(layer, remove_weight)
            return
        weight, first_layer = first[name]
        if not (weight.shape == layer.weight.shape and weight.equal(layer.weight)):
            raise SystemExit(f"{layer.prefix}: the engines' weights differ; nothing to share")
        layer.cpu_linear = first_layer.cpu_linear
        # Empty where the packed weights replaced it, else the very tensor it reads.
        layer.weight = first_layer.weight
        shared["projections"] += 1

    utils.dispatch_cpu_unquantized_gemm = set_up_once
    return shared


def _pair_process(conn: Any, plan: ProcessPlan) -> None:
    """Build the plan's engines, then answer "run"s."""
    use_in_process_engine(threads=1)
    use_exact_gelu_in_llama_mlp()
    shared = share_projection_weights() if plan.share_weights else {"projections": 0}
    started = time.perf_counter()
    llms = {
        name: offline_llm(
            plan.checkpoints[name], plan.max_model_len, "bfloat16", plan.enforce_eager
        )
        for name in plan.order
    }
    conn.send({"init_s": time.perf_counter() - started, **shared})
    runs = itertools.count()
    answer_commands(conn, {"run": lambda request: _stepped_run(llms, request, next(runs))})


def _stepped_run(llms: dict[str, Any], request: dict[str, Any], run: int) -> dict[str, Any]:
    """One run of ``request`` on every engine, stepping them in turn; per engine its
    process CPU seconds in steps and the tokens it decoded."""
    prompts, params = prompts_and_params(request)
    engines = {name: llm.llm_engine for name, llm in llms.items()}
    for engine in engines.values():
        for index, prompt in enumerate(prompts):
            engine.add_request(f"{run}-{index}", prompt, params)
    cpu_s = dict.fromkeys(engines, 0.0)
    tokens: dict[str, dict[str, list[int]]] = {name: {} for name in engines}
    for step in itertools.count(run):
        busy = [n for n in rotated(list(engines), step) if engines[n].has_unfinished_requests()]
        if not busy:
            break
        for name in busy:
            started = time.process_time()
            outputs = engines[name].step()
            cpu_s[name] += time.process_time() - started
            for out in outputs:
                if out.finished:
                    tokens[name][out.request_id] = list(out.outputs[0].token_ids)
    return {"cpu_s": cpu_s, "tokens": tokens}


def run_scenario(
    scenario: Scenario, processes: int, runs: int, engines: dict[str, bool]
) -> dict[str, Any]:
    """``engines``: ``enforce_eager`` and ``share_weights`` of every process's engines."""
    print(f"\n== {scenario.name}", flush=True)
    request = {
        "prompts": random_prompts(scenario.batch, scenario.prompt_len, seed=1),
        "output_len": scenario.output_len,
    }
    per_process = []
    with tempfile.TemporaryDirectory(prefix="bench-shared-weights-") as tmp:
        paths = build_models(Path(tmp), scenario, FOUR_B_LAYER_DIMS)
        checkpoints = {"spark2_5": str(paths["spark2_5"]), CONTROL: str(paths["spark2_5"])}
        checkpoints[GELU_LLAMA] = str(paths["llama"])
        for index in range(processes):
            order = tuple(rotated(list(MODELS), index))
            plan = ProcessPlan(checkpoints, order, scenario.max_model_len, **engines)
            process_samples, projections = _process_ratios(plan, request, runs)
            ratios = {ratio: ratio_interval(values) for ratio, values in process_samples.items()}
            per_process.append({"built": order, "projections_shared": projections, **ratios})
            print(
                f"  process {index + 1} (built {', '.join(order)}; "
                f"{projections} projections shared): "
                + "; ".join(
                    f"{ratio} {samples_cell(value, 'runs')}" for ratio, value in ratios.items()
                ),
                flush=True,
            )
    return {
        "scenario": asdict(scenario),
        "processes": per_process,
        "runs_per_process": runs,
        "ratios": {
            ratio: ratio_interval([s for process in per_process for s in process[ratio]["samples"]])
            for ratio in RATIOS
        },
        # A process's geometric mean is one sample: what varies by process (where its
        # buffers land, the machine's state) widens this interval, not the pooled one.
        "by_process": {
            ratio: ratio_interval([process[ratio]["geomean"] for process in per_process])
            for ratio in RATIOS
        },
    }


def _process_ratios(
    plan: ProcessPlan, request: dict[str, Any], runs: int
) -> tuple[dict[str, list[float]], int]:
    """One process's per-run ratios (Spark2_5's speed over each other engine's) and
    how many projections its later engines took from the first."""
    samples: dict[str, list[float]] = {ratio: [] for ratio in RATIOS}
    with Engine(plan, target=_pair_process) as engine:
        engine.up()
        projections = engine.startup["projections"]
        engine.ask("run", {"prompts": request["prompts"][:4], "output_len": 4})
        for _ in range(runs):
            result = engine.ask("run", request)
            if result["tokens"][CONTROL] != result["tokens"]["spark2_5"]:
                raise SystemExit("the control decoded other tokens than Spark2_5 on one copy")
            for ratio, other in RATIOS.items():
                samples[ratio].append(result["cpu_s"][other] / result["cpu_s"]["spark2_5"])
    return samples, projections


def print_report(results: list[dict[str, Any]]) -> None:
    rows = [
        (
            item["scenario"]["name"],
            name,
            samples_cell(item["by_process"][name], "processes"),
            f"±{item['by_process'][name]['resolution']:.2%}",
            samples_cell(ratio, "runs"),
        )
        for item in results
        for name, ratio in item["ratios"].items()
    ]
    print("\nSpeed per CPU second, one copy of the weights, geometric mean [95%]:")
    headers = ("scenario", "ratio", "over processes", "resolution", "runs pooled")
    print(table(headers, rows))


def main() -> int:
    parser = base_parser(__doc__.split("\n\n")[0])
    parser.add_argument(
        "--compiled", action="store_true", help="vLLM's default torch.compile mode, not eager"
    )
    parser.add_argument("--runs", type=positive_int, help="runs per process (default 3, quick 2)")
    parser.add_argument(
        "--processes",
        type=two_or_more,
        help="processes per scenario, each one sample of the interval (default 6, quick 2)",
    )
    parser.add_argument(
        "--own-weights",
        action="store_true",
        help="each engine packs its own copy of the weights: what sharing one copy removes",
    )
    parser.add_argument("--scenario", metavar="TEXT", help="only the scenarios naming TEXT")
    args = parser.parse_args()
    warn_without_tcmalloc()
    runs = args.runs or (2 if args.quick else 3)
    processes = args.processes or (2 if args.quick else 6)
    scenarios = chosen_scenarios(args.quick, "4b-layers", args.scenario)
    engines = {"enforce_eager": not args.compiled, "share_weights": not args.own_weights}
    record = Record(
        "shared weights",
        {
            "dims": FOUR_B_LAYER_DIMS,
            "dtype": "bfloat16",
            "omp_threads": 1,
            **engines,
            "processes_per_scenario": processes,
            "runs_per_process": runs,
            "allocator": allocator(),
            "engine": "three in-process LLM engines stepped in turn, VLLM_CPU_KVCACHE_SPACE=1 "
            "each, prefix caching off",
        },
    )
    record.data["results"] = [run_scenario(s, processes, runs, engines) for s in scenarios]
    print_report(record.data["results"])
    record.finish(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
