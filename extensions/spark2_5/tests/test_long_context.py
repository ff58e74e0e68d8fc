"""Long-context parity: prompts of 2K, 8K and 16K tokens on a tiny Spark2_5 with the
released 4B's RoPE (full layers theta 5M on a quarter of each head, sliding layers
theta 10K) and 512-token window, served by real vLLM (CPU, float32) against the
reference; the RoPE cache at ``max_model_len`` 32K; vLLM's RoPE against the
reference's at every position.

One subprocess serves the prompts (``spark2_5_dev.hybrid``,
``long``); the slow tests assert on the JSON it writes.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from spark2_5_dev import hybrid
from spark2_5_dev.drivers import run_driver
from spark2_5_dev.spark_x25_4b import SPARK_X25_4B_CONFIG

BENCHMARKS_DOC = Path(__file__).resolve().parents[1] / "docs" / "benchmarks.md"


@pytest.fixture(scope="module")
def long_run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    workdir = tmp_path_factory.mktemp("long-context")
    result = run_driver("spark2_5_dev.hybrid", ["long"], workdir, timeout=2400)
    result["config"] = json.loads((workdir / result["checkpoint"] / "config.json").read_text())
    return result


@pytest.mark.slow
@pytest.mark.parametrize("length", hybrid.LONG_PROMPT_LENGTHS)
def test_long_prompt_continues_like_the_reference(long_run, length, record_property):
    request = next(r for r in long_run["requests"] if len(r["prompt"]) == length)
    compared = request["reference"]
    record_property(f"max_abs_logprob_diff_{length}", compared["max_abs_logprob_diff"])
    assert len(request["tokens"]) == hybrid.NEW_TOKENS
    assert compared["tokens_match"], (
        f"{length}-token prompt: the reference's greedy choice differs at new token "
        f"{compared['first_mismatch']} (its closest tie: {compared['min_greedy_margin']:.1e})"
    )
    assert compared["max_abs_logprob_diff"] <= hybrid.FP32_LOGPROB_TOLERANCE


@pytest.mark.slow
def test_the_long_prompts_run_the_4b_rope_and_window_through_chunks(long_run):
    config, engine = long_run["config"], long_run["engine"]
    assert config["rope_parameters"] == SPARK_X25_4B_CONFIG["rope_parameters"]
    assert config["sliding_window"] == SPARK_X25_4B_CONFIG["sliding_window"]
    assert config["max_position_embeddings"] == SPARK_X25_4B_CONFIG["max_position_embeddings"]
    assert sorted(len(r["prompt"]) for r in long_run["requests"]) == list(
        hybrid.LONG_PROMPT_LENGTHS
    )
    assert min(hybrid.LONG_PROMPT_LENGTHS) > 2 * config["sliding_window"]
    # Prefilled in chunks of at most max_num_batched_tokens, each chunk's window
    # reaching back into the previous one.
    assert engine["max_num_batched_tokens"] < max(hybrid.LONG_PROMPT_LENGTHS)
    windows = {g["sliding_window"] for g in engine["kv_cache_groups"]}
    assert windows == {config["sliding_window"], None}
    rows = {cache["rows"] for cache in long_run["rope_caches"]}
    assert rows == {long_run["max_model_len"]}


@pytest.mark.slow
@pytest.mark.parametrize("mistake", hybrid.PORTING_MISTAKES)
def test_the_comparison_rejects_a_port_that_goes_wrong_at_long_positions(long_run, mistake):
    """A reference with the full layers' theta at 1M or 10K, or without the window,
    scored on vLLM's continuation of the 2K prompt, fails the parity check."""
    shortest = long_run["requests"][0]
    assert len(shortest["prompt"]) == min(hybrid.LONG_PROMPT_LENGTHS)
    wrong = shortest["porting_mistakes"][mistake]
    assert not wrong["tokens_match"] or (
        wrong["max_abs_logprob_diff"] > 100 * hybrid.FP32_LOGPROB_TOLERANCE
    )


def _documented_rope_cache() -> tuple[int, float]:
    """docs/benchmarks.md's memory section: its ``--max-model-len`` and the carrier's
    RoPE cache in MiB at the 4B's 1M ``max_position_embeddings``."""
    text = BENCHMARKS_DOC.read_text(encoding="utf-8")
    section = text[text.index("## Memory") :]
    max_model_len = int(re.search(r"same\s+`--max-model-len` (\d+)", section).group(1))
    row = re.search(r"^\| carrier, `max_position_embeddings` 1048576 \|(.*)$", section, re.M)
    rope_mib = float(row.group(1).split("|")[2].strip().removesuffix(" MiB"))
    return max_model_len, rope_mib


@pytest.mark.slow
def test_rope_cache_at_32k_stays_within_the_documented_memory_figure(long_run, record_property):
    """The 4B's attention shape (head_dim 256; rotary dims 256 and 64) in bf16 at
    max_model_len 32K, measured on the model vLLM built."""
    caches = long_run["rope_4b_attention_bf16"]["caches"]
    max_model_len = long_run["max_model_len"]
    assert {c["rows"] for c in caches} == {max_model_len}
    assert sorted(c["rotary_dim"] for c in caches) == [64, 256]
    assert {c["dtype"] for c in caches} == {"bfloat16"}
    measured = sum(c["bytes"] for c in caches)
    record_property("rope_cache_bytes_at_32k", measured)
    assert measured == max_model_len * (256 + 64) * 2
    # Per position at most what docs/benchmarks.md measured at its max_model_len.
    documented_len, documented_mib = _documented_rope_cache()
    assert measured / max_model_len <= documented_mib * 2**20 / documented_len


def test_vllm_rope_rotates_like_the_reference_at_every_position_to_32k(record_property):
    """Both build the angles as float32(position) * float32(1 / theta^(2i/d)), so they
    share the rounding of those angles, which grows with the position (recorded
    against float64 for scale) and cancels out of the parity comparison."""
    import torch
    from vllm.config import VllmConfig, set_current_vllm_config

    from spark2_5_dev.reference import apply_partial_rope
    from vllm_spark2_5_plugin import compat

    head_dim, length = SPARK_X25_4B_CONFIG["head_dim"], 32768
    positions = torch.arange(length)
    generator = torch.Generator().manual_seed(0)
    query, key = torch.randn(2, length, head_dim, generator=generator)
    for layer_type, rope in SPARK_X25_4B_CONFIG["rope_parameters"].items():
        theta, fraction = rope["rope_theta"], rope["partial_rotary_factor"]
        with set_current_vllm_config(VllmConfig()):
            vllm_rope = compat.get_rope(
                head_dim, max_position=length, rope_theta=theta, partial_rotary_factor=fraction
            )
        rotated, _ = vllm_rope(positions, query.clone(), key.clone())
        rotary_dim = int(head_dim * fraction)
        expected = apply_partial_rope(query[None, :, None], positions, theta, rotary_dim)
        assert float((rotated - expected[0, :, 0]).abs().max()) <= 1e-6, layer_type

        exponents = torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim
        exact = positions.double()[:, None] / theta**exponents
        cos = vllm_rope.cos_sin_cache[:, : rotary_dim // 2].double()
        record_property(
            f"{layer_type}_cos_off_float64_by_16k",
            float((cos[:16384] - exact[:16384].cos()).abs().max()),
        )


def test_reference_attention_in_query_blocks_is_attention_over_the_whole_prompt(monkeypatch):
    import torch

    from spark2_5_dev import reference
    from spark2_5_dev.checkpoints import random_spark2_5, spark2_5_config_dict

    model = random_spark2_5(spark2_5_config_dict(sliding_window=8), seed=1).eval()
    prompt = torch.randint(3, 320, (300,), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        monkeypatch.setattr(reference, "QUERY_BLOCK", 64)  # five blocks, keys trimmed
        blocked = model(prompt)
        monkeypatch.setattr(reference, "QUERY_BLOCK", 4096)  # one block, every key
        whole = model(prompt)
    torch.testing.assert_close(blocked, whole, rtol=0, atol=1e-5)
    assert blocked.argmax(-1).tolist() == whole.argmax(-1).tolist()
