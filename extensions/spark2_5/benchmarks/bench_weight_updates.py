"""In-place weight update time per GB: the Spark2_5 carrier against in-tree Llama.

Two random float32 checkpoints per model (A and B, same dimensions: the
project's small Spark-like dims, untied head; Llama gets the same hidden size,
layers, heads, KV heads, head_dim, intermediate size and vocab). Each model is
served by an offline ``vllm.LLM`` in a fresh process (the engine in that
process, so tensors can be handed over in memory; ``--processes`` of them per
model, the two models alternating), which pushes B, A, B, ... through each
update path and times each push, by wall clock and by the process's CPU time:

* ``reload_weights`` from a path (``collective_rpc``; reads the safetensors);
* ``reload_weights`` from an in-memory iterator;
* the weight-transfer lifecycle with one ``load_weights`` call per tensor
  (``spark2_5_dev.weight_updates.InMemoryWeightTransfer``: the NCCL engine's
  worker side without the network).

Figures are seconds per GB of checkpoint (float32 bytes), medians over every
push of a path, and the Spark2_5 / Llama ratio of the medians.
After each path's last push (B's weights) the engine generates greedily once:
the run records whether all paths left the same output, i.e. really loaded.

    python extensions/spark2_5/benchmarks/bench_weight_updates.py \
        [--quick] [--rounds N] [--processes N] [--out PATH.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import IN_PROCESS_ENGINE_ENV, SMALL_SPARK_DIMS, Record, base_parser, spread, table

MODELS = ("spark2_5", "llama")
PATHS = ("reload from path", "reload from iterator", "transfer per tensor")


def build_checkpoints(model: str, root: Path) -> dict[str, Path]:
    from spark2_5_dev.checkpoints import build_llama_checkpoint, build_spark2_5_checkpoint

    dims = dict(SMALL_SPARK_DIMS)
    if model == "spark2_5":
        return {
            label: build_spark2_5_checkpoint(
                root / label, seed=seed, tie_word_embeddings=False, **dims
            )
            for label, seed in (("a", 1), ("b", 2))
        }
    return {
        label: build_llama_checkpoint(root / label, seed=seed, **dims)
        for label, seed in (("a", 1), ("b", 2))
    }


def _timed(call: Any) -> tuple[float, float]:
    """Wall-clock and CPU seconds (this process: the engine runs in it) of ``call()``."""
    wall, cpu = time.perf_counter(), time.process_time()
    call()
    return time.perf_counter() - wall, time.process_time() - cpu


def measure(model: str, rounds: int) -> dict[str, Any]:
    """In this process: serve ``model``'s A, then time ``rounds`` pushes per path."""
    from vllm import LLM, SamplingParams

    from spark2_5_dev.reference import checkpoint_tensors
    from spark2_5_dev.weight_updates import IN_MEMORY_BACKEND, push, register_in_memory_transfer

    register_in_memory_transfer()
    with tempfile.TemporaryDirectory() as folder:
        paths = build_checkpoints(model, Path(folder))
        tensors = {label: checkpoint_tensors(path) for label, path in paths.items()}
        gigabytes = sum(t.numel() * t.element_size() for t in tensors["a"].values()) / 1e9
        llm = LLM(
            model=str(paths["a"]),
            dtype="float32",
            max_model_len=256,
            enforce_eager=True,
            weight_transfer_config={"backend": IN_MEMORY_BACKEND},
        )
        pushes = {
            "reload from path": lambda label: llm.collective_rpc(
                "reload_weights", kwargs={"weights_path": str(paths[label])}
            ),
            "reload from iterator": lambda label: llm.collective_rpc(
                "reload_weights", kwargs={"weights_iterator": list(tensors[label].items())}
            ),
            "transfer per tensor": lambda label: push(llm, tensors[label], per_tensor=True),
        }
        greedy = SamplingParams(temperature=0.0, max_tokens=16, detokenize=False)
        seconds, served = {}, {}
        for path, push_path in pushes.items():
            # B, A, B, ...: every push changes the weights; the last one leaves B.
            labels = ["ab"[(i + 1) % 2] for i in range(rounds)]
            seconds[path] = [_timed(lambda p=push_path, x=x: p(x)) for x in labels]  # (wall, cpu)
            served[path] = (labels[-1], _greedy(llm, greedy))
    # Each path must leave the engine generating what the others do on the same weights.
    consistent = all(served[path] == served[PATHS[0]] for path in PATHS)
    return {"gigabytes": gigabytes, "seconds": seconds, "outputs_agree": consistent}


def _greedy(llm: Any, params: Any) -> list[int]:
    output = llm.generate([{"prompt_token_ids": list(range(3, 35))}], params, use_tqdm=False)
    return list(output[0].outputs[0].token_ids)


def run_child(model: str, rounds: int) -> dict[str, Any]:
    """One fresh engine process for ``model``: its gigabytes and timed pushes."""
    command = [sys.executable, __file__, "--child", model, "--rounds", str(rounds)]
    env = {**os.environ, **IN_PROCESS_ENGINE_ENV}
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{model} run failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument(
        "--rounds", type=int, default=None, help="pushes per path in each engine process"
    )
    parser.add_argument("--processes", type=int, default=3, help="fresh engine processes per model")
    parser.add_argument("--child", choices=MODELS, help=argparse.SUPPRESS)  # one model's run
    args = parser.parse_args()
    rounds = args.rounds or (2 if args.quick else 4)
    if args.child:
        print(json.dumps(measure(args.child, rounds)))
        return
    settings = {"rounds": rounds, "processes": args.processes, "dims": SMALL_SPARK_DIMS}
    record = Record("weight_updates", settings)
    # Fresh processes in alternating order, so that a busy spell hits both models.
    runs: dict[str, list[dict[str, Any]]] = {model: [] for model in MODELS}
    for index in range(args.processes):
        for model in MODELS[:: 1 if index % 2 == 0 else -1]:
            runs[model].append(run_child(model, rounds))
    rows = []
    for path in PATHS:
        result: dict[str, Any] = {}
        for clock, column in (("wall", 0), ("cpu", 1)):
            per_gb = {
                model: spread(
                    [
                        timing[column] / run["gigabytes"]
                        for run in model_runs
                        for timing in run["seconds"][path]
                    ]
                )
                for model, model_runs in runs.items()
            }
            ratio = per_gb["spark2_5"]["median"] / per_gb["llama"]["median"]
            result[clock] = {**per_gb, "ratio_spark2_5_to_llama": ratio}
            rows.append(
                (path, clock, per_gb["spark2_5"]["median"], per_gb["llama"]["median"], ratio)
            )
        record.data["results"][path] = result
    record.data["results"]["gigabytes"] = {m: runs[m][0]["gigabytes"] for m in MODELS}
    record.data["results"]["outputs_agree"] = {
        m: all(run["outputs_agree"] for run in runs[m]) for m in MODELS
    }
    print(table(("update path", "clock", "Spark2_5 s/GB", "Llama s/GB", "ratio"), rows))
    agree = record.data["results"]["outputs_agree"]
    print(f"every path leaves the same greedy output (per model): {agree}")
    record.finish(args.out)


if __name__ == "__main__":
    main()
