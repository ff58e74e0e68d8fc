"""Serving benchmark: ``vllm serve`` with the carrier, measured by ``vllm bench serve``.

Serves a Spark2_5 checkpoint with the carrier enabled, runs vLLM's own serving
benchmark against it (random prompts of a fixed length, fixed output length
with ``ignore_eos``, N requests at a given concurrency) and renders the same
table as the seed plugin's README.

On CPU (default) it serves a small random Spark2_5 checkpoint it builds, or
``--model PATH``. With ``--gpu-4b-shape`` (needs a CUDA build of vLLM and a GPU)
it serves the real Spark-X2.5-4B *shape* (36 layers, hidden 2560, 16 heads,
4 KV heads, head_dim 256, intermediate 10240, vocab 131072, window 512, the 4B's
layer_types and rope_parameters, bf16) with random weights
(``--load-format dummy``) at 500 concurrent requests of ~1525 input and ~127
output tokens, the seed README's mix, so its table can be compared on the same
kind of hardware.

    python extensions/spark2_5/benchmarks/bench_serving.py [--quick] [--out PATH.json]
    python extensions/spark2_5/benchmarks/bench_serving.py --gpu-4b-shape --out PATH.json
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from common import SMALL_SPARK_DIMS, Record, base_parser, table

from carrier_harness.server import VllmServer, vllm_executable
from spark2_5_dev.checkpoints import build_spark2_5_checkpoint, write_tokenizer
from spark2_5_dev.spark_x25_4b import SPARK_X25_4B_CONFIG

# The seed README's table (500 concurrent requests; hardware unstated).
SEED_README = {
    "completed": 500,
    "failed": 0,
    "duration": 4.70,
    "total_input_tokens": 762_489,
    "total_output_tokens": 63_478,
    "request_throughput": 106.42,
    "output_throughput": 13_510.08,
    "max_output_tokens_per_s": 16_452.00,
    "total_token_throughput": 175_791.36,
    "max_concurrent_requests": 500,
    "mean_ttft_ms": 2122.04,
    "median_ttft_ms": 2111.73,
    "p99_ttft_ms": 4169.35,
    "mean_tpot_ms": 11.58,
    "median_tpot_ms": 13.39,
    "p99_tpot_ms": 14.13,
    "mean_itl_ms": 12.34,
    "median_itl_ms": 11.13,
    "p99_itl_ms": 32.92,
}
SEED_TOKEN_MIX = {"input_len": 1525, "output_len": 127}
SUMMARY_ROWS = (
    ("Successful requests", "completed", "{:,.0f}"),
    ("Failed requests", "failed", "{:,.0f}"),
    ("Benchmark duration", "duration", "{:,.2f} s"),
    ("Total input tokens", "total_input_tokens", "{:,.0f}"),
    ("Total generated tokens", "total_output_tokens", "{:,.0f}"),
    ("Request throughput", "request_throughput", "{:,.2f} req/s"),
    ("Output token throughput", "output_throughput", "{:,.2f} tok/s"),
    ("Peak output token throughput", "max_output_tokens_per_s", "{:,.2f} tok/s"),
    ("Total token throughput", "total_token_throughput", "{:,.2f} tok/s"),
    ("Peak concurrent requests", "max_concurrent_requests", "{:,.0f}"),
)
LATENCIES = (("TTFT", "ttft"), ("TPOT", "tpot"), ("ITL", "itl"))


def write_4b_shape(path: Path) -> Path:
    """``config.json`` and tokenizer of the 4B shape; weights come from ``--load-format dummy``."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(SPARK_X25_4B_CONFIG, indent=2) + "\n")
    write_tokenizer(path)
    return path


def bench_serve(server: VllmServer, settings: dict[str, Any], result_dir: Path) -> dict[str, Any]:
    """Run ``vllm bench serve`` against ``server``; return its saved result."""
    command = [
        vllm_executable(),
        "bench",
        "serve",
        "--backend",
        "openai",
        "--base-url",
        server.base_url,
        "--model",
        server.model,
        "--dataset-name",
        "random",
        "--random-input-len",
        str(settings["input_len"]),
        "--random-output-len",
        str(settings["output_len"]),
        "--num-prompts",
        str(settings["num_prompts"]),
        "--max-concurrency",
        str(settings["concurrency"]),
        "--ignore-eos",
        "--percentile-metrics",
        "ttft,tpot,itl,e2el",
        "--metric-percentiles",
        "50,99",
        "--seed",
        "0",
        "--disable-tqdm",
        "--save-result",
        "--result-dir",
        str(result_dir),
        "--result-filename",
        "result.json",
    ]
    print("$", " ".join(command[1:]), flush=True)
    subprocess.run(command, env=server.env, check=True, timeout=settings["timeout_s"])
    result = json.loads((result_dir / "result.json").read_text())
    scalars = {key: value for key, value in result.items() if not isinstance(value, list | dict)}
    # The served name is a temporary path: keep its last part only.
    for key in ("model_id", "tokenizer_id"):
        scalars[key] = Path(scalars[key]).name
    return scalars


def main() -> int:
    parser = base_parser(__doc__.split("\n\n")[0])
    parser.add_argument(
        "--gpu-4b-shape",
        action="store_true",
        help="serve the 4B shape with random weights at the seed's load (GPU only)",
    )
    parser.add_argument("--model", type=Path, help="serve this Spark2_5 checkpoint instead")
    parser.add_argument("--num-prompts", type=int)
    parser.add_argument("--concurrency", type=int)
    parser.add_argument("--input-len", type=int)
    parser.add_argument("--output-len", type=int)
    args = parser.parse_args()

    if args.gpu_4b_shape:
        defaults = {"num_prompts": 500, "concurrency": 500, **SEED_TOKEN_MIX, "timeout_s": 1800}
        # Later flags win: undo the CPU presets VllmServer puts first (eager mode,
        # 512-token context, CPU device); CUDA graphs and vLLM's GPU defaults stay on.
        serve_args = [
            "--no-enforce-eager",
            "--max-model-len",
            "4096",
            "--load-format",
            "dummy",
            "--dtype",
            "bfloat16",
        ]
        serve_env = {"VLLM_TARGET_DEVICE": "cuda"}
    else:
        quick = {"num_prompts": 32, "concurrency": 8, "input_len": 128, "output_len": 32}
        full = {"num_prompts": 64, "concurrency": 16, "input_len": 256, "output_len": 64}
        defaults = {**(quick if args.quick else full), "timeout_s": 900}
        serve_args = ["--max-model-len", "1024", "--dtype", "bfloat16"]
        serve_env = {}
    overrides = {
        "num_prompts": args.num_prompts,
        "concurrency": args.concurrency,
        "input_len": args.input_len,
        "output_len": args.output_len,
    }
    settings = {**defaults, **{k: v for k, v in overrides.items() if v is not None}}

    with tempfile.TemporaryDirectory(prefix="bench-serving-") as tmp:
        workdir = Path(tmp)
        if args.gpu_4b_shape:
            model, model_desc = write_4b_shape(workdir / "spark2_5-4b-shape"), SPARK_X25_4B_CONFIG
        elif args.model:
            model, model_desc = args.model, {"path": args.model.name}
        else:
            model_desc = {**SMALL_SPARK_DIMS, "sliding_window": 128}
            model = build_spark2_5_checkpoint(workdir / "spark2_5", seed=0, **model_desc)
        record = Record(
            "serving",
            {
                **settings,
                "mode": "gpu-4b-shape" if args.gpu_4b_shape else "cpu",
                "model": model_desc,
                "serve_args": serve_args,
                "dataset": "random, fixed lengths, ignore_eos",
            },
        )
        server = VllmServer(
            model,
            args=serve_args,
            env={"SPARK2_5_PLUGIN_ENABLE": "1", **serve_env},
            log_path=workdir / "serve.log",
            startup_timeout=1200 if args.gpu_4b_shape else 600,
        )
        with server:
            result = bench_serve(server, settings, workdir)
        if "enabled=1" not in server.log():
            raise RuntimeError("the server log lacks the carrier's enabled=1 load line")
    record.data["results"] = result
    if args.gpu_4b_shape:
        record.data["seed_readme"] = SEED_README
    print_report(result, SEED_README if args.gpu_4b_shape else None)
    record.finish(args.out)
    return 0


def print_report(result: dict[str, Any], seed: dict[str, Any] | None) -> None:
    headers = ["Metric", "Result"] + (["Seed README", "ratio"] if seed else [])

    def row(name: str, key: str, fmt: str) -> list[str]:
        cells = [name, fmt.format(result[key])]
        if seed:
            cells += [fmt.format(seed[key]), f"{result[key] / seed[key]:.2f}" if seed[key] else ""]
        return cells

    print()
    print(table(headers, [row(*spec) for spec in SUMMARY_ROWS]))
    print()
    latency_headers = ["Metric", "Mean", "Median", "P99"] + (["Seed mean"] if seed else [])
    rows = []
    for label, key in LATENCIES:
        cells = [label] + [
            f"{result[f'{stat}_{key}_ms']:,.2f} ms" for stat in ("mean", "median", "p99")
        ]
        if seed:
            cells.append(f"{seed[f'mean_{key}_ms']:,.2f} ms")
        rows.append(cells)
    print(table(latency_headers, rows))


if __name__ == "__main__":
    sys.exit(main())
