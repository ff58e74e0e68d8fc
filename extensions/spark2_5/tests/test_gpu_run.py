"""The GPU run script (the carrier's benchmarks/gpu_run.py) and the in-tree baseline it serves:
what can be checked without a GPU. Its plan, its arguments, its record, and its
parity step at a tiny shape on CPU (the same code path the 4B takes on a GPU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from spark2_5_dev.parity import ENGINE_ENV, FP32_LOGPROB_TOLERANCE
from spark2_5_dev.spark_x25_4b import SPARK_X25_4B_CONFIG

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
GPU_RUN = BENCHMARKS / "gpu_run.py"


def gpu_run(*args: str, env: dict[str, str] | None = None, timeout: float = 120):
    return subprocess.run(
        [sys.executable, str(GPU_RUN), *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=timeout,
    )


def test_dry_run_prints_each_step_and_runs_nothing(tmp_path):
    workdir, out = tmp_path / "work", tmp_path / "record.json"
    done = gpu_run("--dry-run", "--workdir", str(workdir), "--out", str(out))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "at most 1680 s" in lines[0]
    steps = [line.split()[1] for line in lines[1:5]]
    assert steps == ["build", "parity-float32", "parity-bfloat16", "serving"]
    assert "--phase parity --dtype bfloat16" in lines[3]
    assert "python extensions/spark2_5/benchmarks/bench_serving.py --gpu-4b-shape --out" in lines[4]
    assert not workdir.exists() and not out.exists()


def test_steps_can_be_chosen_and_unknown_ones_are_named(tmp_path):
    done = gpu_run("--dry-run", "--steps", "parity-float32,serving")
    assert done.returncode == 0, done.stderr
    assert [line.split()[1] for line in done.stdout.splitlines()[1:3]] == [
        "parity-float32",
        "serving",
    ]
    done = gpu_run("--dry-run", "--steps", "build,parity-float16")
    assert done.returncode == 2
    assert "'parity-float16'" in done.stderr
    assert "choose from build, parity-float32, parity-bfloat16, serving" in done.stderr


def test_a_parity_phase_without_a_dtype_is_refused(tmp_path):
    done = gpu_run("--phase", "parity", "--workdir", str(tmp_path))
    assert done.returncode == 2
    assert "--phase parity needs --dtype, one of float32, bfloat16" in done.stderr


def test_the_record_puts_the_seed_figures_beside_the_run(benchmarks_on_path):
    from bench_serving import IN_TREE, SEED_README, SPARK, ratios
    from common import Record
    from gpu_run import HEADLINE, gpu_record

    # Stand-in figures: this checks the record's layout and arithmetic only.
    spark = dict(SEED_README)
    in_tree = {key: 2 * value for key, value in SEED_README.items()}
    steps = {"serving": {"status": "ok", "seconds": 1.0}}
    serving = {
        "results": {SPARK: spark, IN_TREE: in_tree},
        "spark2_5_over_in_tree": ratios(spark, in_tree),
    }
    outputs = {"serving": serving}
    data = gpu_record(Record("gpu-run", {}), steps, outputs)
    json.dumps(data)
    assert "gpus" in data["machine"]
    assert data["steps"] == steps
    assert data["results"]["parity"] == {"float32": None, "bfloat16": None}
    rows = {row["metric"]: row for row in data["results"]["seed_readme_side_by_side"]}
    assert set(rows) == {
        "request throughput (req/s)",
        "output throughput (tok/s)",
        "mean TPOT (ms)",
    }
    for label, key in HEADLINE:
        assert rows[label]["seed_readme"] == SEED_README[key]
        assert rows[label]["spark2_5_over_in_tree"] == 0.5
        assert rows[label]["spark2_5_over_seed_readme"] == 1.0


def test_the_serving_table_shows_the_in_tree_model_and_the_seed(benchmarks_on_path, capsys):
    from bench_serving import SEED_README, print_report

    in_tree = {key: 2 * value for key, value in SEED_README.items()}
    print_report(SEED_README, SEED_README, baseline=in_tree)
    rows = [
        [cell.strip() for cell in line.strip("|").split("|")]
        for line in capsys.readouterr().out.splitlines()
        if line.startswith("|")
    ]
    assert [
        "Request throughput",
        "106.42 req/s",
        "212.84 req/s",
        "0.50",
        "106.42 req/s",
        "1.00",
    ] in rows
    assert ["TPOT", "11.58 ms", "13.39 ms", "14.13 ms", "23.16 ms", "11.58 ms"] in rows


def test_the_in_tree_baseline_has_the_4b_shape(benchmarks_on_path, tmp_path):
    from bench_serving import GPU_MAX_MODEL_LEN, LLAMA_SHAPE_KEYS, write_llama_4b_shape
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(write_llama_4b_shape(tmp_path / "llama")))
    assert config.architectures == ["LlamaForCausalLM"]
    for key in LLAMA_SHAPE_KEYS:
        assert getattr(config, key) == SPARK_X25_4B_CONFIG[key], key
    assert config.max_position_embeddings == GPU_MAX_MODEL_LEN
    assert not list(tmp_path.glob("llama/*.safetensors")), "weights come from --load-format dummy"


def test_the_4b_build_is_the_released_shape(benchmarks_on_path):
    """Built on the meta device: the shape without the 16 GB of float32 weights."""
    import torch
    from gpu_run import _shape_config

    from spark2_5_dev.reference import Spark2_5Reference

    config = _shape_config("4b")
    with torch.device("meta"):
        model = Spark2_5Reference(config)
    expected = {k: v for k, v in SPARK_X25_4B_CONFIG.items() if k in config}
    assert config == expected and len(config) == len(SPARK_X25_4B_CONFIG) - 4
    assert model.lm_head is None  # tied, as released
    assert 4.0e9 < sum(p.numel() for p in model.parameters()) < 4.2e9


def test_without_a_large_enough_gpu_the_parity_steps_do_not_start(tmp_path):
    """Checked before any step: at the 4B shape the parity steps need about 40 GB."""
    done = gpu_run("--workdir", str(tmp_path / "work"), "--steps", "parity-float32")
    assert done.returncode == 2
    assert "no CUDA GPU is visible" in done.stderr
    assert not (tmp_path / "work").exists()


def test_the_needed_gpu_memory_is_what_the_docstring_states(benchmarks_on_path):
    from gpu_run import needed_gpu_bytes

    assert 39e9 < needed_gpu_bytes("4b") < 41e9  # "at least 40 GB" in gpu_run.py


@pytest.mark.slow
def test_the_parity_step_runs_on_cpu_at_a_tiny_shape(benchmarks_on_path, tmp_path):
    """Spark2_5 and the in-tree control, each eager and compiled, against their own
    references: the code path the 4B takes on a GPU."""
    from gpu_parity import MODELS, MODES, PRECISE_FLOAT32_ENV
    from gpu_run import PARITY_PROMPT_LENGTHS

    workdir, out = tmp_path / "work", tmp_path / "record.json"
    done = gpu_run(
        *("--shape", "tiny", "--steps", "build,parity-float32", "--budget-s", "1500"),
        *("--workdir", str(workdir), "--out", str(out)),
        env=ENGINE_ENV,
        timeout=1800,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    record = json.loads(out.read_text())
    assert {name: step["status"] for name, step in record["steps"].items()} == {
        "build": "ok",
        "parity-float32": "ok",
    }
    parity = record["results"]["parity"]["float32"]
    assert parity["device"] == "cpu"
    assert parity["precision_env"] == PRECISE_FLOAT32_ENV
    for model in MODELS:
        for mode in MODES:
            result = parity["results"][model][mode]
            assert result["attention_backend"] == "CPU_ATTN"
            assert [p["prompt_len"] for p in result["prompts"]] == list(PARITY_PROMPT_LENGTHS)
            assert result["tokens_match"], (model, mode)
            assert result["max_abs_logprob_diff"] <= FP32_LOGPROB_TOLERANCE, (model, mode)
    assert parity["compiled_equals_eager"] == dict.fromkeys(MODELS, True)
    assert parity["conclusive"] and parity["within_tolerance"]
    assert record["results"]["parity"]["bfloat16"] is None
    assert record["results"]["serving"] is None


def test_a_bfloat16_verdict_follows_the_controls_band(benchmarks_on_path):
    from gpu_parity import BF16_AGREEMENT_SLACK, BF16_BAND, BF16_FLOOR, verdict

    def result(diff: float, agreement: float) -> dict:
        modes = {"max_abs_logprob_diff": diff, "argmax_agreement": agreement}
        return {"eager": modes, "compiled": modes, "compiled_equals_eager": [True]}

    control = result(0.1, 0.9)
    limit = BF16_BAND * 0.1 + BF16_FLOOR
    inside = verdict("bfloat16", {"spark2_5": result(limit, 0.9), "control": control})
    assert inside["within_tolerance"]
    assert inside["band"]["min_argmax_agreement"] == 0.9 - BF16_AGREEMENT_SLACK
    outside = verdict("bfloat16", {"spark2_5": result(limit * 1.01, 0.9), "control": control})
    assert not outside["within_tolerance"]
    disagreeing = verdict("bfloat16", {"spark2_5": result(0.1, 0.8), "control": control})
    assert not disagreeing["within_tolerance"]
