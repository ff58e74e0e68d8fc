"""Prefix caching, chunked prefill and long prompts over Spark2_5's sliding and full
layers, on real vLLM, against the reference.

vLLM's hybrid KV-cache manager keeps the sliding layers' KV apart from the full
layers', frees the blocks that slide out of the window, and counts a prefix-cache
hit only where the cached blocks cover a whole window.

* :func:`run_cache_matrix` serves one tiny checkpoint (window 64, 32-token blocks)
  in four engines: prefix caching off and on, each prefilling whole prompts or
  40-token chunks. Each engine serves a batch of prompts, most longer than the
  window, then the same batch again (from the cache where it is on), then a
  three-turn chat whose turns share a prefix longer than the window.
* :func:`run_long_context` serves prompts of 2K, 8K and 16K tokens on a checkpoint
  with the released 4B's RoPE and window at tiny width, and measures the RoPE
  cache of the 4B's attention shape at ``max_model_len`` 32K.

Every continuation is checked against the reference teacher-forced: the
reference scores vLLM's tokens in one forward pass. Its greedy decoding gives the
same tokens if and only if its argmax at every step is vLLM's token (by induction
over the steps), so one pass does what step-by-step generation would do in 32
passes over a 16K prompt, and the log-probabilities are compared on the same
prefix at every step.

Engines run one after another in the calling process; run it in a fresh one::

    python -m spark2_5_dev.hybrid {cache,long} --workdir DIR --out FILE
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import os
from pathlib import Path
from typing import Any

from spark2_5_dev.engines import in_process_llm
from spark2_5_dev.parity import (
    ENGINE_ENV,
    FP32_LOGPROB_TOLERANCE,
    NEW_TOKENS,
    completion_record,
    prompts,
)

# --- prefix caching and chunked prefill -------------------------------------------

CACHE_WINDOW = 64
# vLLM caches whole blocks; a sliding-window hit needs ceil((64 - 1) / 32) = 2 of them.
CACHE_BLOCK_SIZE = 32
# Smaller than the window and no multiple of the block: chunk ends fall inside both.
CHUNK_TOKENS = 40
CACHE_MAX_MODEL_LEN = 1024
CACHE_PROMPT_LENGTHS = (50, 161, 300)
# name -> LLM settings; "whole-prompt" (caching off, one step per prompt) is the baseline.
CACHE_ENGINES = {
    "whole-prompt": {"enable_prefix_caching": False, "max_num_batched_tokens": 1024},
    "prefix-cache": {"enable_prefix_caching": True, "max_num_batched_tokens": 1024},
    "chunked": {"enable_prefix_caching": False, "max_num_batched_tokens": CHUNK_TOKENS},
    "prefix-cache+chunked": {
        "enable_prefix_caching": True,
        "max_num_batched_tokens": CHUNK_TOKENS,
    },
}
BASELINE_ENGINE = "whole-prompt"
# Byte-level tokenizer: one token per character, so the system prompt alone is
# longer than the window.
SYSTEM_PROMPT = (
    "You are Spark, a careful assistant for a small weather service. Answer in one "
    "or two sentences, name the city you talk about, and say when you do not know. "
    "Temperatures are in degrees Celsius, wind speeds in kilometres per hour."
)
USER_TURNS = (
    "What is the weather like in Paris this afternoon?",
    "And will it rain there tomorrow morning?",
    "Thanks. Compare that with Lyon, please.",
)
CACHE_CHECKPOINT_SEED = 11

# --- long context -------------------------------------------------------------------

LONG_PROMPT_LENGTHS = (2048, 8192, 16384)
LONG_MAX_MODEL_LEN = 32768
# Tiny width with the 4B's RoPE (full layers theta 5M on a quarter of each head,
# sliding layers theta 10K on all of it) and its 512-token window: spark2_5_config_dict
# already has the 4B's rope_parameters.
LONG_CONTEXT_OVERRIDES = {
    "sliding_window": 512,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 64,
}
LONG_CHECKPOINT_SEED = 21
# The 4B's attention shape (head_dim 256, so rotary dims 256 and 64), for the
# RoPE cache it costs per position; served in bf16 as the 4B is.
ROPE_SHAPE_OVERRIDES = {"num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 256}
# Ports that go wrong at long positions: the full layers with the common 1M theta
# or the sliding layers' theta, and the sliding layers without their window.
PORTING_MISTAKES = ("full-theta-1M", "full-theta-10K", "no-window")


def _set_engine_env() -> None:
    for name, value in ENGINE_ENV.items():
        os.environ.setdefault(name, value)


def compare_teacher_forced(steps: Any, tokens: list[int], logprobs: list[float]) -> dict[str, Any]:
    """vLLM's greedy continuation against the reference's log-probabilities ``steps``
    [len(tokens), vocab], scored on vLLM's own prefixes (``Spark2_5Reference.score``)."""
    greedy = steps.argmax(-1).tolist()
    mismatch = next(
        (i for i, (g, t) in enumerate(zip(greedy, tokens, strict=True)) if g != t), None
    )
    top2 = steps.topk(2, dim=-1).values
    diffs = [
        abs(float(steps[i, t]) - lp) for i, (t, lp) in enumerate(zip(tokens, logprobs, strict=True))
    ]
    return {
        "tokens_match": mismatch is None,
        "first_mismatch": mismatch,
        "max_abs_logprob_diff": max(diffs),
        # How close the reference comes to a tie: a mismatch at a margin near
        # float32 noise is a tie, not a bug.
        "min_greedy_margin": float((top2[:, 0] - top2[:, 1]).min()),
    }


def _params(**extra: Any) -> Any:
    """Greedy, :data:`NEW_TOKENS` tokens whatever the model samples, with log-probs."""
    from vllm import SamplingParams

    return SamplingParams(
        temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True, logprobs=1, **extra
    )


def _request_record(name: str, output: Any) -> dict[str, Any]:
    return {
        "name": name,
        "prompt": list(output.prompt_token_ids),
        "cached_tokens": output.num_cached_tokens or 0,
        **completion_record(output),
    }


def _generate(llm: Any, batch: list[list[int]], label: str) -> list[dict[str, Any]]:
    """Greedy continuations of token-id prompts, one record each, named by length."""
    outputs = llm.generate(
        [{"prompt_token_ids": p} for p in batch],
        _params(detokenize=False),
        use_tqdm=False,
    )
    return [_request_record(f"{label}-{len(o.prompt_token_ids)}", o) for o in outputs]


def _kv_cache_layout(llm: Any) -> dict[str, Any]:
    """What vLLM built for the KV cache: the coordinator and the layer groups."""
    scheduler = llm.llm_engine.engine_core.engine_core.scheduler
    groups = [
        {
            "spec": type(group.kv_cache_spec).__name__,
            "sliding_window": getattr(group.kv_cache_spec, "sliding_window", None),
            "block_size": group.kv_cache_spec.block_size,
            "layers": list(group.layer_names),
        }
        for group in scheduler.kv_cache_config.kv_cache_groups
    ]
    config = llm.llm_engine.vllm_config
    return {
        "coordinator": type(scheduler.kv_cache_manager.coordinator).__name__,
        "kv_cache_groups": groups,
        "enable_prefix_caching": config.cache_config.enable_prefix_caching,
        "enable_chunked_prefill": config.scheduler_config.enable_chunked_prefill,
        "max_num_batched_tokens": config.scheduler_config.max_num_batched_tokens,
    }


def _prefix_cache_counters(llm: Any) -> dict[str, int]:
    wanted = {"vllm:prefix_cache_queries": "queries", "vllm:prefix_cache_hits": "hits"}
    return {wanted[m.name]: int(m.value) for m in llm.get_metrics() if m.name in wanted}


def _converse(llm: Any) -> list[dict[str, Any]]:
    """A chat of :data:`USER_TURNS`, each turn sent with the whole conversation so far."""
    messages = [{"role": "system", "content": SYSTEM_PROMPT}]
    turns = []
    for number, user in enumerate(USER_TURNS, 1):
        messages.append({"role": "user", "content": user})
        output = llm.chat(messages, _params(), use_tqdm=False)[0]
        turns.append(_request_record(f"turn-{number}", output))
        messages.append({"role": "assistant", "content": output.outputs[0].text})
    return turns


def _serve_cache_engine(path: Path, settings: dict[str, Any], batch: list[list[int]]):
    llm = in_process_llm(
        model=str(path),
        dtype="float32",
        max_model_len=CACHE_MAX_MODEL_LEN,
        block_size=CACHE_BLOCK_SIZE,
        max_num_seqs=8,
        enforce_eager=True,
        seed=0,
        disable_log_stats=False,
        **settings,
    )
    requests = _generate(llm, batch, "prompt") + _generate(llm, batch, "again")
    requests += _converse(llm)
    result = {
        "engine": _kv_cache_layout(llm),
        "requests": requests,
        "prefix_cache": _prefix_cache_counters(llm),
    }
    del llm
    gc.collect()
    return result


def _score_against(reference: Any, requests: list[dict[str, Any]]) -> None:
    """Add each request's comparison with the reference (``"reference"``), scoring each
    distinct prompt and continuation once, whichever engines produced it."""
    steps_by_request: dict[tuple, Any] = {}
    for request in requests:
        key = (tuple(request["prompt"]), tuple(request["tokens"]))
        if key not in steps_by_request:
            steps_by_request[key] = reference.score(request["prompt"], request["tokens"])
        request["reference"] = compare_teacher_forced(
            steps_by_request[key], request["tokens"], request["logprobs"]
        )


def run_cache_matrix(workdir: str | Path) -> dict[str, Any]:
    """Serve the cache checkpoint in each of :data:`CACHE_ENGINES` and compare every
    request with the reference."""
    _set_engine_env()
    import torch
    import vllm

    from spark2_5_dev.checkpoints import build_spark2_5_checkpoint, read_config
    from spark2_5_dev.reference import Spark2_5Reference

    torch.set_num_threads(1)  # the tiny reference is fastest on one thread
    path = build_spark2_5_checkpoint(
        Path(workdir) / "cache", seed=CACHE_CHECKPOINT_SEED, sliding_window=CACHE_WINDOW
    )
    vocab_size = read_config(path)["vocab_size"]
    batch = prompts(CACHE_CHECKPOINT_SEED, vocab_size, CACHE_PROMPT_LENGTHS)
    engines = {
        name: _serve_cache_engine(path, settings, batch) for name, settings in CACHE_ENGINES.items()
    }
    reference = Spark2_5Reference.from_pretrained(path)
    _score_against(reference, [r for engine in engines.values() for r in engine["requests"]])
    return {
        "vllm": vllm.__version__,
        "torch": torch.__version__,
        "checkpoint": path.name,
        "sliding_window": CACHE_WINDOW,
        "block_size": CACHE_BLOCK_SIZE,
        "new_tokens": NEW_TOKENS,
        "fp32_logprob_tolerance": FP32_LOGPROB_TOLERANCE,
        "engines": engines,
    }


def _rope_caches(llm: Any) -> list[dict[str, Any]]:
    """The model's distinct cos/sin caches (layers of one type share theirs)."""

    def caches(model: Any) -> list[dict[str, Any]]:
        distinct = {}
        for layer in model.model.layers:
            cache = layer.self_attn.rotary_emb.cos_sin_cache
            distinct[cache.data_ptr()] = {
                "rows": cache.shape[0],
                "rotary_dim": cache.shape[1],
                "dtype": str(cache.dtype).removeprefix("torch."),
                "bytes": cache.numel() * cache.element_size(),
            }
        return sorted(distinct.values(), key=lambda c: c["rotary_dim"])

    return llm.apply_model(caches)[0]


def _serve_long(path: Path, dtype: str, batch: list[list[int]]) -> dict[str, Any]:
    """One engine at :data:`LONG_MAX_MODEL_LEN`: its KV-cache layout, its RoPE caches
    and the greedy continuations of ``batch``."""
    llm = in_process_llm(
        model=str(path), dtype=dtype, max_model_len=LONG_MAX_MODEL_LEN, enforce_eager=True, seed=0
    )
    served = {
        "engine": _kv_cache_layout(llm),
        "rope_caches": _rope_caches(llm),
        "requests": _generate(llm, batch, "prompt") if batch else [],
    }
    del llm
    gc.collect()
    return served


def _with_porting_mistake(reference: Any, mistake: str) -> Any:
    """A copy of ``reference`` with one of :data:`PORTING_MISTAKES`."""
    variant = copy.deepcopy(reference)
    for layer in variant.model.layers:
        attention = layer.self_attn
        full = attention.window is None
        if mistake == "full-theta-1M" and full:
            attention.rope_theta = 1_000_000
        elif mistake == "full-theta-10K" and full:
            attention.rope_theta = 10_000
        elif mistake == "no-window":
            attention.window = None
    return variant


def run_long_context(workdir: str | Path) -> dict[str, Any]:
    """Greedy continuations of :data:`LONG_PROMPT_LENGTHS` prompts against the
    reference (the shortest also against the reference with each of
    :data:`PORTING_MISTAKES`, which the comparison must reject), and the RoPE cache
    of the 4B's attention shape in bf16 at :data:`LONG_MAX_MODEL_LEN`."""
    _set_engine_env()
    import torch
    import vllm

    from spark2_5_dev.checkpoints import build_spark2_5_checkpoint, read_config
    from spark2_5_dev.reference import Spark2_5Reference

    torch.set_num_threads(1)
    workdir = Path(workdir)
    path = build_spark2_5_checkpoint(
        workdir / "long", seed=LONG_CHECKPOINT_SEED, **LONG_CONTEXT_OVERRIDES
    )
    vocab_size = read_config(path)["vocab_size"]
    batch = prompts(LONG_CHECKPOINT_SEED, vocab_size, LONG_PROMPT_LENGTHS)
    served = _serve_long(path, "float32", batch)

    reference = Spark2_5Reference.from_pretrained(path)
    _score_against(reference, served["requests"])
    shortest = served["requests"][0]
    shortest["porting_mistakes"] = {
        name: compare_teacher_forced(
            _with_porting_mistake(reference, name).score(shortest["prompt"], shortest["tokens"]),
            shortest["tokens"],
            shortest["logprobs"],
        )
        for name in PORTING_MISTAKES
    }

    rope_path = build_spark2_5_checkpoint(workdir / "rope-4b-attention", **ROPE_SHAPE_OVERRIDES)
    rope_4b = _serve_long(rope_path, "bfloat16", [])["rope_caches"]
    return {
        "vllm": vllm.__version__,
        "torch": torch.__version__,
        "checkpoint": path.name,
        "max_model_len": LONG_MAX_MODEL_LEN,
        "new_tokens": NEW_TOKENS,
        "fp32_logprob_tolerance": FP32_LOGPROB_TOLERANCE,
        **served,
        "rope_4b_attention_bf16": {"checkpoint": rope_path.name, "caches": rope_4b},
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("cache", "long"), help="which run (module docstring)")
    parser.add_argument("--workdir", type=Path, required=True, help="where checkpoints go")
    parser.add_argument("--out", type=Path, required=True, help="JSON file for the results")
    args = parser.parse_args(argv)
    run = run_cache_matrix if args.what == "cache" else run_long_context
    args.out.write_text(json.dumps(run(args.workdir), indent=2) + "\n")


if __name__ == "__main__":
    main()
