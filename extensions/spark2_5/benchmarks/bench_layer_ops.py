"""What a Spark2_5 decoder layer computes beyond an in-tree Llama layer, op by op, at
the Spark-X2.5-4B's layer dimensions, on real vLLM (CPU, eager).

One Spark2_5 layer of the 4B's dimensions (hidden 2560, 16 heads of 256, 4 KV
heads, intermediate 10240) is loaded by an offline ``LLM`` engine in this process
(bfloat16, one OpenMP thread). Inside the engine (``apply_model``), for a batch of
``M`` token rows, each op runs through the model's own modules and methods:

* the layer's projections, which an in-tree Llama layer has too: ``q_k_v_proj``,
  ``out_proj``, ``gate_up_proj``, ``down_proj``;
* the carrier's additions: ``g_proj`` (one gate per head), the gate itself
  (``Spark2_5Attention.gate_heads``: ``g_proj`` plus the fp32 gate math), and the
  finite keys/values guard on the keys and values (vLLM's CPU build only).

A sample is the process CPU time per call over a run of calls; each round runs
every op once in rotating order, and the median over rounds is reported with its
spread. The share is an addition's time over the four projections' time: an upper
bound of its share of the layer, which also runs attention, norms and the MLP's
activation. It tells whether an addition is worth fusing away (``g_proj`` into
the QKV GEMM) before the end-to-end ratio of ``bench_model.py --dims 4b-layers``.

    python extensions/spark2_5/benchmarks/bench_layer_ops.py [--quick] [--out PATH.json]
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

from common import (
    FOUR_B_LAYER_DIMS,
    Record,
    base_parser,
    spread,
    table,
    use_in_process_engine,
)
from model_engine import offline_llm

PROJECTIONS = ("q_k_v_proj", "out_proj", "gate_up_proj", "down_proj")
ADDITIONS = ("g_proj", "gate_heads (g_proj + gate math)", "finite keys/values guard")
# Decode of one request and of 16; a 1,024-token prompt; the prefill of bench_model.py.
TOKEN_ROWS = (1, 16, 1024, 4096)
# Calls per sample: enough process CPU time per sample to dwarf the clock's tick.
CALL_BUDGET_ROWS = 4096


def _op_calls(model: Any, rows: int) -> dict[str, Any]:
    """Zero-argument callables running each op of layer 0 on ``rows`` token rows."""
    import torch

    from vllm_spark2_5_plugin.spark2_5_ops import finite

    layer = model.model.layers[0]
    attn, mlp = layer.self_attn, layer.mlp
    dtype = next(p.dtype for p in model.parameters() if p.is_floating_point())
    hidden = torch.randn(rows, model.config.hidden_size, dtype=dtype)
    heads_out = torch.randn(rows, attn.q_size, dtype=dtype)
    keys = torch.randn(rows, attn.kv_size, dtype=dtype)
    activated = torch.randn(rows, model.config.intermediate_size, dtype=dtype)
    return {
        "q_k_v_proj": lambda: attn.q_k_v_proj(hidden),
        "out_proj": lambda: attn.out_proj(heads_out),
        "gate_up_proj": lambda: mlp.gate_up_proj(hidden),
        "down_proj": lambda: mlp.down_proj(activated),
        "g_proj": lambda: attn.g_proj(hidden),
        "gate_heads (g_proj + gate math)": lambda: attn.gate_heads(heads_out, hidden),
        "finite keys/values guard": lambda: (finite(keys), finite(keys)),
    }


def _measure(model: Any, rows_list: list[int], rounds: int) -> dict[str, Any]:
    """Per token-row count and op: microseconds per call, one sample per round."""
    results: dict[str, Any] = {}
    for rows in rows_list:
        calls = _op_calls(model, rows)
        repeats = max(3, CALL_BUDGET_ROWS // rows)
        names = list(calls)
        samples: dict[str, list[float]] = {name: [] for name in names}
        for index in range(rounds):
            order = names[index % len(names) :] + names[: index % len(names)]
            for name in order:
                calls[name]()  # warm: oneDNN picks its kernel for this shape
                started = time.process_time()
                for _ in range(repeats):
                    calls[name]()
                samples[name].append((time.process_time() - started) / repeats * 1e6)
        results[str(rows)] = {name: spread(values) for name, values in samples.items()}
    return results


def run(rounds: int, rows_list: list[int]) -> dict[str, Any]:
    use_in_process_engine(threads=1)
    from spark2_5_dev.checkpoints import build_spark2_5_checkpoint

    with tempfile.TemporaryDirectory(prefix="bench-layer-ops-") as tmp:
        dims = {**FOUR_B_LAYER_DIMS, "num_hidden_layers": 1}
        path = build_spark2_5_checkpoint(
            Path(tmp) / "spark2_5", seed=0, layer_types=["sliding_attention"], **dims
        )
        llm = offline_llm(str(path), max(rows_list) + 16, "bfloat16", enforce_eager=True)
        (measured,) = llm.apply_model(lambda model: _measure(model, rows_list, rounds))
    return measured


def print_report(results: dict[str, Any]) -> None:
    rows = []
    for token_rows, ops in results.items():
        projections = sum(ops[name]["median"] for name in PROJECTIONS)
        for name, figures in ops.items():
            share = (
                f"{figures['median'] / projections:.2%}" if name in ADDITIONS else "(projection)"
            )
            rows.append(
                (
                    token_rows,
                    name,
                    f"{figures['median']:.1f} ({figures['min']:.1f}-{figures['max']:.1f})",
                    share,
                )
            )
    print("\nProcess CPU µs per call, median of rounds (min-max); share of the projections:")
    print(table(("token rows", "op", "µs per call", "share"), rows))


def main() -> int:
    parser = base_parser(__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, help="samples per op (default 9, quick 3)")
    args = parser.parse_args()
    rounds = args.rounds or (3 if args.quick else 9)
    rows_list = list(TOKEN_ROWS[:2] if args.quick else TOKEN_ROWS)
    record = Record(
        "layer-ops",
        {
            "dims": {**FOUR_B_LAYER_DIMS, "num_hidden_layers": 1},
            "dtype": "bfloat16",
            "omp_threads": 1,
            "rounds": rounds,
            "token_rows": rows_list,
            "engine": "offline LLM, in-process engine, enforce_eager; ops run in apply_model",
        },
    )
    record.data["results"] = run(rounds, rows_list)
    print_report(record.data["results"])
    record.finish(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
