"""Cost of the loader's NaN/Inf check against loading the same tensors from safetensors,
on the Spark-X2.5-4B's tensor shapes in bfloat16, on this machine's CPU.

Writes random bf16 tensors in the 4B's shapes (its embedding, final norm and
``--layers`` of its 36 decoder layers) to safetensors files in a temporary
folder, one file per layer, and allocates one destination tensor per tensor
(the model's parameter). Then, per round and per tensor:

* **load**: ``safe_open`` + ``get_tensor`` (vLLM's default, lazy iterator; the
  tensor is a view of the memory-mapped file) and the copy into the
  destination, which is when the bytes are actually read (what vLLM's
  ``weight_loader`` does);
* **load + check**: the same with the carrier's ``has_non_finite`` on the
  tensor before the copy, where the loader runs it;
* **check alone**: ``has_non_finite`` on the loaded destination (in memory).

Rounds alternate which of the two pipelines goes first, each in two page-cache
states: *warm* (the files in the page cache: the best case for loading, so the
worst case for the ratio) and *cold* (after ``fsync`` + ``posix_fadvise
(DONTNEED)`` on each file before each pass). The totals are scaled to the whole
4B: the embedding and norm once, the decoder layers times 36 / ``--layers``.

    python extensions/spark2_5/benchmarks/bench_checkpoint_checks.py \
        [--quick] [--layers N] [--out PATH.json]
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import torch
from common import Record, base_parser, spread, table
from safetensors import safe_open
from safetensors.torch import save_file

from spark2_5_dev.spark_x25_4b import SPARK_X25_4B_CONFIG
from vllm_spark2_5_plugin.spark2_5_checkpoint import has_non_finite

PIPELINES = ("load", "load + check")


def layer_shapes(config: dict) -> dict[str, tuple[int, ...]]:
    """One decoder layer's checkpoint tensors and their shapes."""
    hidden, head_dim = config["hidden_size"], config["head_dim"]
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    intermediate = config["intermediate_size"]
    return {
        "input_layernorm.weight": (hidden,),
        "self_attn.q_k_v_proj.weight": ((heads + 2 * kv_heads) * head_dim, hidden),
        "self_attn.g_proj.weight": (heads, hidden),
        "self_attn.out_proj.weight": (hidden, heads * head_dim),
        "post_attention_layernorm.weight": (hidden,),
        "mlp.gate_proj.weight": (intermediate, hidden),
        "mlp.up_proj.weight": (intermediate, hidden),
        "mlp.down_proj.weight": (hidden, intermediate),
    }


def file_groups(config: dict, layers: int) -> dict[str, dict[str, tuple[int, ...]]]:
    """The 4B's embedding + norm in one group, then one group per decoder layer."""
    hidden = config["hidden_size"]
    groups = {
        "outer": {
            "model.embedding.weight": (config["vocab_size"], hidden),
            "model.norm.weight": (hidden,),
        }
    }
    for layer in range(layers):
        groups[f"layer{layer}"] = {
            f"model.layers.{layer}.{name}": shape for name, shape in layer_shapes(config).items()
        }
    return groups


def write_files(folder: Path, groups: dict[str, dict[str, tuple[int, ...]]]) -> dict[str, Path]:
    generator = torch.Generator().manual_seed(0)
    files = {}
    for group, shapes in groups.items():
        files[group] = folder / f"{group}.safetensors"
        tensors = {
            name: torch.empty(shape, dtype=torch.bfloat16).normal_(0, 0.02, generator=generator)
            for name, shape in shapes.items()
        }
        save_file(tensors, str(files[group]))
    return files


def drop_from_page_cache(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def one_pass(
    files: dict[str, Path], destinations: dict[str, torch.Tensor], check: bool, cold: bool
) -> dict[str, dict[str, float]]:
    """Seconds per file group to load every tensor (with the check when ``check``) and,
    after the copy, to check the loaded tensor alone."""
    totals = {}
    for group, path in files.items():
        if cold:
            drop_from_page_cache(path)
        seconds = {"pipeline": 0.0, "check alone": 0.0}
        with safe_open(str(path), framework="pt") as file:
            for name in file.keys():  # noqa: SIM118 (safe_open has no __iter__)
                started = time.perf_counter()
                tensor = file.get_tensor(name)
                if check:
                    assert not has_non_finite(tensor)
                destinations[name].copy_(tensor)
                seconds["pipeline"] += time.perf_counter() - started
                del tensor
                started = time.perf_counter()
                assert not has_non_finite(destinations[name])
                seconds["check alone"] += time.perf_counter() - started
        totals[group] = seconds
    return totals


def scale_to_4b(totals: dict[str, dict[str, float]], what: str, layers: int, full: int) -> float:
    per_layer = sum(v[what] for group, v in totals.items() if group != "outer") / layers
    return totals["outer"][what] + per_layer * full


def measure(files, destinations, rounds: int, cold: bool, layers: int, full: int) -> dict:
    samples: dict[str, list[float]] = {name: [] for name in (*PIPELINES, "check alone")}
    for round_index in range(rounds):
        order = PIPELINES if round_index % 2 == 0 else PIPELINES[::-1]
        for pipeline in order:
            totals = one_pass(files, destinations, check=pipeline != "load", cold=cold)
            samples[pipeline].append(scale_to_4b(totals, "pipeline", layers, full))
            samples["check alone"].append(scale_to_4b(totals, "check alone", layers, full))
    return {name: spread(values) for name, values in samples.items()}


def main() -> int:
    parser = base_parser(__doc__.split("\n\n")[0])
    parser.add_argument(
        "--layers", type=int, default=2, help="decoder layers written and measured (of 36)"
    )
    parser.add_argument("--rounds", type=int, help="rounds per cache state (default 6, quick 2)")
    args = parser.parse_args()
    rounds = args.rounds or (2 if args.quick else 6)
    config = SPARK_X25_4B_CONFIG
    full = config["num_hidden_layers"]
    record = Record(
        "checkpoint_checks",
        {
            "shapes": "Spark-X2.5-4B (spark2_5_dev.spark_x25_4b), bfloat16, random normal(0, 0.02)",
            "decoder_layers_measured": args.layers,
            "scaled_to_layers": full,
            "rounds": rounds,
            "torch_threads": torch.get_num_threads(),
            "load": "safe_open + get_tensor (lazy, memory-mapped) + copy into a preallocated "
            "tensor, per tensor",
        },
    )
    results = record.data["results"]
    groups = file_groups(config, args.layers)
    destinations = {
        name: torch.empty(shape, dtype=torch.bfloat16)
        for shapes in groups.values()
        for name, shape in shapes.items()
    }
    with tempfile.TemporaryDirectory(prefix="spark2_5-bench-") as folder:
        files = write_files(Path(folder), groups)
        results["gib_measured"] = sum(p.stat().st_size for p in files.values()) / 2**30
        for cache in ("warm", "cold"):
            results[cache] = measure(
                files, destinations, rounds, cache == "cold", args.layers, full
            )
    rows = []
    for cache in ("warm", "cold"):
        figures = {name: results[cache][name]["median"] for name in results[cache]}
        added = figures["load + check"] - figures["load"]
        rows.append(
            (
                cache,
                figures["load"],
                figures["load + check"],
                added / figures["load"],
                figures["check alone"],
                figures["check alone"] / figures["load"],
            )
        )
        results[cache]["ratios"] = {
            "load_with_check_over_load": figures["load + check"] / figures["load"],
            "check_alone_over_load": figures["check alone"] / figures["load"],
        }
    print(
        f"Spark-X2.5-4B bf16, seconds for the whole model, scaled from the embedding + "
        f"{args.layers} of {full} layers ({results['gib_measured']:.2f} GiB), medians of "
        f"{rounds} rounds, {torch.get_num_threads()} torch threads\n"
    )
    headers = ("page cache", "load s", "load + check s", "added", "check alone s", "alone / load")
    print(table(headers, rows))
    record.finish(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
