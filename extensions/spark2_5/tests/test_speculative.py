"""Speculative decoding with EAGLE and EAGLE-3 draft heads on real vLLM (CPU): the
greedy tokens are exactly those of plain generation, and a head asking for a layer
Spark2_5 does not have is refused by name (``spark2_5_dev.speculative``)."""

from __future__ import annotations

import pytest

from spark2_5_dev import speculative
from spark2_5_dev.drivers import run_driver

# vLLM 0.23's CPU rejection sampler calls its own kernel with an argument it does not
# take: speculative decoding fails there in vLLM's sampler, for EAGLE-1 too, which asks
# nothing of the model.
VLLM_023_SAMPLER_BUG = "unexpected keyword argument 'USE_FP64_GUMBEL'"

pytestmark = pytest.mark.slow  # four engines in one driver process


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory) -> dict:
    workdir = tmp_path_factory.mktemp("speculative")
    try:
        return run_driver("spark2_5_dev.speculative", [], workdir, timeout=900)
    except AssertionError as failed:
        if VLLM_023_SAMPLER_BUG in str(failed):
            pytest.xfail(f"vLLM's CPU rejection sampler: TypeError ... {VLLM_023_SAMPLER_BUG}")
        raise


@pytest.mark.parametrize("method", ["eagle", "eagle3"])
def test_greedy_tokens_with_a_draft_head_are_those_without(result, method):
    plain = result["plain"]
    assert [len(tokens) for tokens in plain] == [speculative.NEW_TOKENS] * len(plain)
    assert result[method] == plain


def test_an_eagle3_head_asking_for_a_missing_layer_is_refused_by_name(result):
    refusal = result["refusal_out_of_range"]
    assert "layers [1, 2, 9], but it has layers 0 to 3" in refusal, refusal
    assert "eagle_aux_hidden_state_layer_ids" in refusal
