"""vLLM's hybrid KV-cache manager with Spark2_5's sliding and full layers: prefix
caching on and off, whole and chunked prefill, a multi-turn chat served from the
cache, each request against the reference.

One subprocess runs the four engines (``spark2_5_dev.hybrid``,
``cache``); the tests assert on the JSON it writes.
"""

from __future__ import annotations

import itertools
import json

import pytest
from packaging.version import Version

from spark2_5_dev import hybrid
from spark2_5_dev.drivers import common_prefix, run_driver

ENGINES = list(hybrid.CACHE_ENGINES)
CACHING = [n for n, s in hybrid.CACHE_ENGINES.items() if s["enable_prefix_caching"]]
NOT_CACHING = [n for n in ENGINES if n not in CACHING]
CHUNKED = [
    n
    for n, s in hybrid.CACHE_ENGINES.items()
    if s["max_num_batched_tokens"] < max(hybrid.CACHE_PROMPT_LENGTHS)
]

# The first vLLM release whose prefix-cache hit counter agrees with the requests'
# cached tokens under chunked prefill (0.28.0; 0.27.1 and older count fewer).
COUNTS_CHUNKED_HITS = Version("0.28")

pytestmark = [pytest.mark.slow, pytest.mark.kernels]


@pytest.fixture(scope="module")
def matrix(tmp_path_factory: pytest.TempPathFactory) -> dict:
    workdir = tmp_path_factory.mktemp("hybrid-cache")
    result = run_driver("spark2_5_dev.hybrid", ["cache"], workdir, timeout=1800)
    result["config"] = json.loads((workdir / result["checkpoint"] / "config.json").read_text())
    return result


def _requests(matrix: dict, engine: str) -> dict[str, dict]:
    return {r["name"]: r for r in matrix["engines"][engine]["requests"]}


@pytest.mark.parametrize("name", ENGINES)
def test_sliding_and_full_layers_get_their_own_kv_cache_groups(matrix, name):
    engine = matrix["engines"][name]["engine"]
    config = matrix["config"]
    expected = {
        f"model.layers.{i}.self_attn.attn": (
            ("SlidingWindowSpec", hybrid.CACHE_WINDOW)
            if layer_type == "sliding_attention"
            else ("FullAttentionSpec", None)
        )
        for i, layer_type in enumerate(config["layer_types"])
    }
    assert {"sliding_attention", "full_attention"} <= set(config["layer_types"])
    seen = {}
    for group in engine["kv_cache_groups"]:
        assert group["block_size"] == hybrid.CACHE_BLOCK_SIZE
        seen.update(dict.fromkeys(group["layers"], (group["spec"], group["sliding_window"])))
    assert seen == expected
    caching = hybrid.CACHE_ENGINES[name]["enable_prefix_caching"]
    assert engine["enable_prefix_caching"] is caching
    assert engine["coordinator"] == (
        "HybridKVCacheCoordinator" if caching else "KVCacheCoordinatorNoPrefixCache"
    )


@pytest.mark.parametrize("name", ENGINES)
def test_every_request_matches_the_reference(matrix, name, record_property):
    requests = matrix["engines"][name]["requests"]
    assert len(requests) == 2 * len(hybrid.CACHE_PROMPT_LENGTHS) + len(hybrid.USER_TURNS)
    for request in requests:
        compared = request["reference"]
        assert len(request["tokens"]) == hybrid.NEW_TOKENS
        assert compared["tokens_match"], (
            f"{name}/{request['name']}: the reference's greedy choice differs at new "
            f"token {compared['first_mismatch']} (its closest tie: "
            f"{compared['min_greedy_margin']:.1e})"
        )
        assert compared["max_abs_logprob_diff"] <= hybrid.FP32_LOGPROB_TOLERANCE, request["name"]
    worst = max(r["reference"]["max_abs_logprob_diff"] for r in requests)
    record_property("worst_logprob_diff_vs_reference", worst)


@pytest.mark.parametrize("name", [n for n in ENGINES if n != hybrid.BASELINE_ENGINE])
def test_caching_and_chunking_leave_tokens_and_logprobs_as_without(matrix, name):
    baseline = _requests(matrix, hybrid.BASELINE_ENGINE)
    requests = _requests(matrix, name)
    assert requests.keys() == baseline.keys()
    for request_name, request in requests.items():
        assert request["prompt"] == baseline[request_name]["prompt"]
        assert request["tokens"] == baseline[request_name]["tokens"], request_name
        diffs = [
            abs(a - b)
            for a, b in zip(request["logprobs"], baseline[request_name]["logprobs"], strict=True)
        ]
        assert max(diffs) <= hybrid.FP32_LOGPROB_TOLERANCE, request_name


@pytest.mark.parametrize("name", CHUNKED)
def test_chunked_engines_prefill_prompts_longer_than_the_window_in_several_chunks(matrix, name):
    engine = matrix["engines"][name]["engine"]
    budget = engine["max_num_batched_tokens"]
    assert engine["enable_chunked_prefill"]
    assert budget < hybrid.CACHE_WINDOW, "a window should span chunks"
    long_prompts = [
        len(r["prompt"])
        for r in matrix["engines"][name]["requests"]
        if len(r["prompt"]) > hybrid.CACHE_WINDOW
    ]
    # A prompt longer than the step budget cannot be prefilled in one step.
    assert len(long_prompts) >= 4 and min(long_prompts) > 3 * budget


@pytest.mark.parametrize("name", CACHING)
def test_a_repeated_prompt_is_served_from_the_cache(matrix, name):
    requests = _requests(matrix, name)
    for length in hybrid.CACHE_PROMPT_LENGTHS:
        first, again = requests[f"prompt-{length}"], requests[f"again-{length}"]
        assert first["cached_tokens"] == 0
        # Whole blocks, and never the last prompt token (its logits must be computed).
        block = hybrid.CACHE_BLOCK_SIZE
        assert again["cached_tokens"] == (length - 1) // block * block
        assert again["tokens"] == first["tokens"]


@pytest.mark.parametrize("name", CACHING)
def test_each_chat_turn_reuses_more_than_a_window_of_the_last(matrix, name):
    requests = _requests(matrix, name)
    turns = [requests[f"turn-{n}"] for n in range(1, len(hybrid.USER_TURNS) + 1)]
    assert turns[0]["cached_tokens"] == 0
    for previous, turn in itertools.pairwise(turns):
        # The last turn's prompt and reply are in the cache, as far as the chat
        # template renders the reply back to the same tokens.
        shared = common_prefix(previous["prompt"] + previous["tokens"], turn["prompt"])
        assert hybrid.CACHE_WINDOW < shared < len(turn["prompt"])
        block = hybrid.CACHE_BLOCK_SIZE
        assert turn["cached_tokens"] == shared // block * block > hybrid.CACHE_WINDOW


@pytest.mark.parametrize("name", ENGINES)
def test_vllm_prefix_cache_counters_agree_with_the_requests(matrix, name):
    engine = matrix["engines"][name]
    cached = sum(r["cached_tokens"] for r in engine["requests"])
    hits = engine["prefix_cache"].get("hits", 0)
    if name in CHUNKED and name in CACHING and Version(matrix["vllm"]) < COUNTS_CHUNKED_HITS:
        # vLLM 0.23 to 0.27 count fewer hits than the requests report under chunked
        # prefill (480 for 1088 here); the requests' own figures are checked above.
        assert 0 < hits < cached
        pytest.xfail(f"vLLM {matrix['vllm']} counts {hits} prefix-cache hits for {cached}")
    assert hits == cached
    if name in NOT_CACHING:
        assert cached == 0
    else:
        assert cached > 0
