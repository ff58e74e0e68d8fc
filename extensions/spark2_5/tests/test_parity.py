"""Spark2_5ForCausalLM on real vLLM (CPU) against the plain-PyTorch reference.

The whole matrix runs in one subprocess (one in-process engine after another,
see ``spark2_5_dev.parity``); each case below asserts on its
part of the JSON that run writes.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from carrier_harness.server import VllmServer
from spark2_5_dev import parity
from spark2_5_dev.carrier import ENABLE_ENV
from spark2_5_dev.checkpoints import build_spark2_5_checkpoint
from spark2_5_dev.drivers import assert_matches_reference, run_driver

FP32_CASES = [case.name for case in parity.CASES if case.dtype == "float32"]
BF16_CASES = [case.name for case in parity.CASES if case.dtype == "bfloat16"]


def run_parity(workdir: Path, *args: str, timeout: float) -> object:
    name = "parallel" if args else "parity"
    return run_driver("spark2_5_dev.parity", args, workdir, timeout, name=name)


@pytest.fixture(scope="session")
def matrix(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    workdir = tmp_path_factory.mktemp("parity")
    return workdir, run_parity(workdir, timeout=1200)


@pytest.mark.contract
@pytest.mark.kernels
@pytest.mark.parametrize("name", FP32_CASES)
def test_float32_greedy_tokens_and_logprobs_match_the_reference(matrix, name):
    case = matrix[1]["cases"][name]
    assert len(case["prompts"]) == len(parity.PROMPT_LENGTHS)
    assert_matches_reference(case)


@pytest.mark.kernels
@pytest.mark.parametrize("name", BF16_CASES)
def test_bfloat16_stays_within_the_stated_tolerance(matrix, name):
    case = matrix[1]["cases"][name]
    assert case["max_abs_logprob_diff"] <= parity.BF16_LOGPROB_TOLERANCE, case
    assert case["argmax_agreement"] >= parity.BF16_MIN_ARGMAX_AGREEMENT, case


def test_worst_float32_difference_is_recorded(matrix, record_property):
    worst = matrix[1]["worst_fp32_logprob_diff"]
    record_property("worst_fp32_logprob_diff", worst)
    print(f"worst float32 log-prob difference vs the reference: {worst:.3e}")
    assert 0 <= worst <= parity.FP32_LOGPROB_TOLERANCE


def test_the_matrix_covers_what_the_issue_asks(matrix):
    """Read back from the checkpoints each case actually served."""
    workdir, result = matrix
    configs, layouts = {}, {}
    for name, case in result["cases"].items():
        path = workdir / name
        configs[name] = json.loads((path / "config.json").read_text())
        layouts[name] = {
            "sharded": (path / "model.safetensors.index.json").exists(),
            "qkv": case["case"]["qkv"],
        }
    fp32 = [configs[n] for n in FP32_CASES]
    assert {c["tie_word_embeddings"] for c in fp32} == {True, False}
    gates = {c["gate_attn_act_mode"] if c["headwise_attn_output_gate"] else None for c in fp32}
    assert gates == {"sigmoid", "silu", None}
    assert any(c["num_attention_heads"] * c["head_dim"] != c["hidden_size"] for c in fp32)
    ratios = {c["num_attention_heads"] // c["num_key_value_heads"] for c in fp32}
    assert 1 in ratios and any(r > 1 for r in ratios)
    assert any(c["rope_parameters"]["full_attention"]["partial_rotary_factor"] < 1 for c in fp32)
    assert {layouts[n]["qkv"] for n in FP32_CASES} == {"fused", "split"}
    assert any(layouts[n]["sharded"] for n in FP32_CASES)
    for name in FP32_CASES:
        case = result["cases"][name]
        assert len(set(case["prompt_lengths"])) == len(case["prompt_lengths"]) > 1
        assert max(case["prompt_lengths"]) > configs[name]["sliding_window"]
        assert case["window_cuts"], f"{name}: the sliding window never changes the output"


@pytest.mark.parametrize("name", [case.name for case in parity.CASES])
def test_rope_cache_has_max_model_len_rows_not_max_position_embeddings(matrix, name):
    case = matrix[1]["cases"][name]
    assert case["max_position_embeddings"] == 1_048_576
    assert case["rope_cache_rows"] == [parity.MAX_MODEL_LEN]


@pytest.mark.slow
def test_parallel_and_compiled_runs_match_the_single_process_eager_tokens(matrix):
    """Tensor and pipeline parallel workers, and one compiled process (tp=1), give the
    greedy tokens that matched the reference in eager mode."""
    workdir, result = matrix
    parallel = run_parity(workdir, "--parallel", timeout=900)
    for case_name, tp, pp in parity.PARALLEL_RUNS:
        single = [p["vllm_tokens"] for p in result["cases"][case_name]["prompts"]]
        assert parallel[parity.parallel_run_name(case_name, tp, pp)] == single


@pytest.mark.contract
@pytest.mark.serve
def test_vllm_serve_completes_like_the_reference_without_remote_code(tmp_path):
    """The released layout, whose config.json names remote code in ``auto_map``,
    served with the carrier enabled and no ``--trust-remote-code``."""
    from spark2_5_dev.reference import Spark2_5Reference

    checkpoint = build_spark2_5_checkpoint(tmp_path / "checkpoint", seed=5)
    assert "auto_map" in json.loads((checkpoint / "config.json").read_text())
    server = VllmServer(
        checkpoint,
        args=["--dtype", "float32"],
        env={ENABLE_ENV: "1"},
        log_path=tmp_path / "serve.log",
    )
    assert "--trust-remote-code" not in server.command
    with server:
        client = server.openai_client()
        completion = client.completions.create(
            model=str(checkpoint),
            prompt="Spark2_5 on vLLM:",
            max_tokens=parity.NEW_TOKENS,
            temperature=0.0,
            extra_body={"return_token_ids": True, "ignore_eos": True},
        )
    choice = completion.choices[0]
    prompt_ids = completion.choices[0].prompt_token_ids
    assert choice.finish_reason == "length"
    expected, _ = Spark2_5Reference.from_pretrained(checkpoint).generate(
        prompt_ids, parity.NEW_TOKENS
    )
    assert choice.token_ids == expected
    assert "Spark2_5ForCausalLM" in server.log()
