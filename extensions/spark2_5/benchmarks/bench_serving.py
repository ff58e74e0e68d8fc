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
kind of hardware; then, in the same run and with the same flags (CUDA graphs
on), an in-tree ``LlamaForCausalLM`` of the same shape, and reports
Spark2_5 / in-tree for every figure.

    python extensions/spark2_5/benchmarks/bench_serving.py [--quick] [--out PATH.json]
    python extensions/spark2_5/benchmarks/bench_serving.py --gpu-4b-shape --out PATH.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from common import SMALL_SPARK_DIMS, Record, base_parser, table

from carrier_harness.server import VllmServer, vllm_executable
from spark2_5_dev.checkpoints import build_spark2_5_checkpoint, read_config, write_tokenizer
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
GPU_MAX_MODEL_LEN = 4096
SPARK = "spark2_5"
IN_TREE = "in_tree_llama"
# What an in-tree Llama takes from the 4B's config.json to have its shape.
LLAMA_SHAPE_KEYS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "rms_norm_eps",
    "sliding_window",
    "layer_types",
    "tie_word_embeddings",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
)
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


def write_llama_4b_shape(path: Path) -> Path:
    """``config.json`` and tokenizer of an in-tree ``LlamaForCausalLM`` with the 4B's
    shape: its dimensions, vocabulary, tied head, ``layer_types`` and 512-token
    window; Llama's SiLU MLP, one RoPE (the 4B full layers' theta) on whole heads,
    and no output gate. Llama sizes its RoPE table by ``max_position_embeddings``,
    so that is the served context here, as the carrier sizes its own."""
    from transformers import LlamaConfig

    shape = {key: SPARK_X25_4B_CONFIG[key] for key in LLAMA_SHAPE_KEYS}
    config = LlamaConfig(
        architectures=["LlamaForCausalLM"],
        hidden_act="silu",
        rope_theta=SPARK_X25_4B_CONFIG["rope_parameters"]["full_attention"]["rope_theta"],
        max_position_embeddings=GPU_MAX_MODEL_LEN,
        **shape,
    )
    path.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(str(path))
    write_tokenizer(path)
    return path


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    if args.gpu_4b_shape:
        defaults = {"num_prompts": 500, "concurrency": 500, **SEED_TOKEN_MIX, "timeout_s": 600}
    else:
        quick = {"num_prompts": 32, "concurrency": 8, "input_len": 128, "output_len": 32}
        full = {"num_prompts": 64, "concurrency": 16, "input_len": 256, "output_len": 64}
        defaults = {**(quick if args.quick else full), "timeout_s": 900}
    overrides = {
        "num_prompts": args.num_prompts,
        "concurrency": args.concurrency,
        "input_len": args.input_len,
        "output_len": args.output_len,
    }
    return {**defaults, **{k: v for k, v in overrides.items() if v is not None}}


def _models(args: argparse.Namespace, workdir: Path) -> list[tuple[str, Path, dict[str, Any]]]:
    """(name, checkpoint, description) of each model to serve, Spark2_5 first."""
    if args.gpu_4b_shape:
        llama = write_llama_4b_shape(workdir / "llama-4b-shape")
        return [
            (SPARK, write_4b_shape(workdir / "spark2_5-4b-shape"), SPARK_X25_4B_CONFIG),
            (IN_TREE, llama, read_config(llama)),
        ]
    if args.model:
        return [(SPARK, args.model, {"path": args.model.name})]
    model_desc = {**SMALL_SPARK_DIMS, "sliding_window": 128}
    return [
        (SPARK, build_spark2_5_checkpoint(workdir / "spark2_5", seed=0, **model_desc), model_desc)
    ]


def serve_and_bench(
    name: str,
    model: Path,
    serve_args: list[str],
    serve_env: dict[str, str],
    settings: dict[str, Any],
    workdir: Path,
) -> dict[str, Any]:
    """``vllm serve`` one model (the carrier enabled for Spark2_5 only) and measure it."""
    carrier = {"SPARK2_5_PLUGIN_ENABLE": "1"} if name == SPARK else {}
    workdir.mkdir()
    server = VllmServer(
        model,
        args=serve_args,
        env={**carrier, **serve_env},
        log_path=workdir / "serve.log",
        startup_timeout=600,
    )
    with server:
        result = bench_serve(server, settings, workdir)
    if carrier and "enabled=1" not in server.log():
        raise RuntimeError("the server log lacks the carrier's enabled=1 load line")
    return result


def main() -> int:
    parser = base_parser(__doc__.split("\n\n")[0])
    parser.add_argument(
        "--gpu-4b-shape",
        action="store_true",
        help="serve the 4B shape with random weights at the seed's load, then an in-tree "
        "model of the same shape (GPU only)",
    )
    parser.add_argument("--model", type=Path, help="serve this Spark2_5 checkpoint instead")
    parser.add_argument("--num-prompts", type=int)
    parser.add_argument("--concurrency", type=int)
    parser.add_argument("--input-len", type=int)
    parser.add_argument("--output-len", type=int)
    args = parser.parse_args()
    settings = _settings(args)
    if args.gpu_4b_shape:
        # Later flags win: undo the CPU presets VllmServer puts first (eager mode,
        # 512-token context, CPU device); CUDA graphs and vLLM's GPU defaults stay on.
        serve_args = ["--no-enforce-eager", "--max-model-len", str(GPU_MAX_MODEL_LEN)]
        serve_args += ["--load-format", "dummy", "--dtype", "bfloat16"]
        serve_env = {"VLLM_TARGET_DEVICE": "cuda"}
    else:
        serve_args, serve_env = ["--max-model-len", "1024", "--dtype", "bfloat16"], {}

    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-serving-") as tmp:
        workdir = Path(tmp)
        models = _models(args, workdir)
        record = Record(
            "serving",
            {
                **settings,
                "mode": "gpu-4b-shape" if args.gpu_4b_shape else "cpu",
                "model": models[0][2],
                **({"baseline": {IN_TREE: models[1][2]}} if len(models) > 1 else {}),
                "serve_args": serve_args,
                "dataset": "random, fixed lengths, ignore_eos",
            },
        )
        for name, model, _ in models:
            results[name] = serve_and_bench(
                name, model, serve_args, serve_env, settings, workdir / f"{name}-bench"
            )
    if args.gpu_4b_shape:
        record.data["results"] = results
        record.data["spark2_5_over_in_tree"] = ratios(results[SPARK], results[IN_TREE])
        record.data["seed_readme"] = SEED_README
        print_report(results[SPARK], SEED_README, baseline=results[IN_TREE])
    else:
        record.data["results"] = results[SPARK]
        print_report(results[SPARK], None)
    record.finish(args.out)
    return 0


def ratios(result: dict[str, Any], baseline: dict[str, Any]) -> dict[str, float]:
    """``result / baseline`` for every summary metric and mean latency."""
    keys = [key for _, key, _ in SUMMARY_ROWS] + [f"mean_{key}_ms" for _, key in LATENCIES]
    return {key: result[key] / baseline[key] for key in keys if baseline[key]}


def print_report(
    result: dict[str, Any], seed: dict[str, Any] | None, baseline: dict[str, Any] | None = None
) -> None:
    headers = ["Metric", "Result"]
    headers += ["In-tree, same shape", "Result / in-tree"] if baseline else []
    headers += ["Seed README", "ratio"] if seed else []

    def row(name: str, key: str, fmt: str) -> list[str]:
        cells = [name, fmt.format(result[key])]
        for other in (baseline, seed):
            if other:
                ratio = f"{result[key] / other[key]:.2f}" if other[key] else ""
                cells += [fmt.format(other[key]), ratio]
        return cells

    print()
    print(table(headers, [row(*spec) for spec in SUMMARY_ROWS]))
    print()
    latency_headers = ["Metric", "Mean", "Median", "P99"]
    latency_headers += ["In-tree mean"] if baseline else []
    latency_headers += ["Seed mean"] if seed else []
    rows = []
    for label, key in LATENCIES:
        cells = [label] + [
            f"{result[f'{stat}_{key}_ms']:,.2f} ms" for stat in ("mean", "median", "p99")
        ]
        cells += [f"{other[f'mean_{key}_ms']:,.2f} ms" for other in (baseline, seed) if other]
        rows.append(cells)
    print(table(latency_headers, rows))


if __name__ == "__main__":
    sys.exit(main())
