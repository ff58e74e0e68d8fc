"""Spark2_5 as an embedding model, a reward model and a reranker, on real vLLM (CPU),
against the float64 reference: offline (``spark2_5_dev.pooling``, one subprocess) and
through ``vllm serve`` with the ``openai`` client and HTTP."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest

from spark2_5_dev import pooling
from spark2_5_dev.drivers import run_driver

pytestmark = pytest.mark.slow  # four engines in one driver process

SERVE_ARGS = ("--runner", "pooling", "--dtype", "float32")
RERANK_OVERRIDES = {
    "classifier_from_token": list(pooling.RERANK_TOKENS),
    "method": "from_2_way_softmax",
}


@pytest.fixture(scope="module")
def offline(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    workdir = tmp_path_factory.mktemp("pooling")
    return workdir, run_driver("spark2_5_dev.pooling", [], workdir, timeout=900)


@pytest.mark.parametrize("kind", ["embed", "reward", "rerank"])
def test_each_conversion_matches_the_float64_reference(offline, kind):
    result = offline[1]
    assert len(result["served"][kind]) == len(pooling.PROMPT_LENGTHS)
    assert result["worst_abs_diff"][kind] <= pooling.TOLERANCE, result["worst_abs_diff"]


def test_classify_without_a_classifier_head_is_refused_by_name(offline):
    refusal = offline[1]["refusal_without_score"]
    assert "lacks its classifier head 'score.weight'" in refusal, refusal
    assert "from_2_way_softmax" in refusal  # the fix


@pytest.mark.serve
def test_served_embeddings_and_reranker_scores_match_the_reference(offline, carrier_enabled_server):
    workdir, result = offline
    batch = pooling.PROMPTS
    embed = [*SERVE_ARGS, "--convert", "embed"]
    with carrier_enabled_server(workdir / "causal-lm", embed) as server:
        client = server.openai_client()
        model = client.models.list().data[0].id
        data = client.embeddings.create(model=model, input=batch).data
        served = [item.embedding for item in data]
    assert pooling.worst_abs_diff(served, result["expected"]["embed"]) <= pooling.TOLERANCE

    rerank = [*SERVE_ARGS, "--convert", "classify", "--hf-overrides", json.dumps(RERANK_OVERRIDES)]
    with carrier_enabled_server(workdir / "causal-lm", rerank) as server:
        body = json.dumps({"model": model, "input": batch}).encode()
        request = urllib.request.Request(
            f"{server.base_url}/classify", body, {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=120) as response:
            data = json.load(response)["data"]
    served = [item["probs"][0] for item in data]
    assert pooling.worst_abs_diff(served, result["expected"]["rerank"]) <= pooling.TOLERANCE
