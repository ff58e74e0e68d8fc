"""Token-for-token parity of ``Spark2_5ForCausalLM`` on real vLLM with the reference.

:func:`run_matrix` builds one tiny random checkpoint per :data:`CASES` entry,
serves each with an offline ``vllm.LLM`` (greedy, ``ignore_eos``, log-probs of
the sampled tokens), runs the plain-PyTorch reference on the same prompts and
returns what it measured. All engines run one after another in the calling
process, so call it in a fresh process (``python -m
spark2_5_dev.parity``) with the carrier enabled and the
in-process engine (:data:`ENGINE_ENV`).

:func:`run_parallel` serves some of those checkpoints again with tensor or
pipeline parallelism (worker processes; ``--parallel``) and returns the greedy
tokens, to compare with the single-process ones.
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from spark2_5_dev.engines import in_process_llm

# Real vLLM in this process, on the CPU machines the project runs on.
ENGINE_ENV = {
    "SPARK2_5_PLUGIN_ENABLE": "1",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_TARGET_DEVICE": "cpu",
    "VLLM_NO_USAGE_STATS": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
}
MAX_MODEL_LEN = 256
NEW_TOKENS = 32
# Shorter than, a little longer than, and several times the sliding window.
PROMPT_LENGTHS = (5, 19, 57)
FP32_LOGPROB_TOLERANCE = 1e-3
# bfloat16 serving is scored against the float32 reference, teacher-forced on
# vLLM's own tokens. bf16 keeps 8 mantissa bits: on these random tiny models the
# reference itself, run in bf16 (recorded next to vLLM's numbers as
# "reference_bf16"), measured up to 0.25-0.42 log-prob off float32 and another
# argmax on up to 1 step in 10. vLLM must stay within that band.
BF16_LOGPROB_TOLERANCE = 0.5
BF16_MIN_ARGMAX_AGREEMENT = 0.85


@dataclass(frozen=True)
class ParityCase:
    """One checkpoint of the matrix: config overrides and its safetensors layout."""

    name: str
    overrides: dict[str, Any] = field(default_factory=dict)
    qkv: str = "fused"
    shards: int = 1
    seed: int = 0
    dtype: str = "float32"


_HALF_ROTARY = {
    "full_attention": {"rope_theta": 1_000_000, "partial_rotary_factor": 0.5},
    "sliding_attention": {"rope_theta": 10_000, "partial_rotary_factor": 1.0},
}

CASES = (
    # The released layout: tied, sigmoid gate, GQA 2, 4 x 32 != 64, rotary 8 of 32
    # dims on the full layer, window 8, fused q_k_v_proj.
    ParityCase("tied-sigmoid-gqa2-fused", seed=8),
    # Re-exported layout: untied head, silu gate, one KV head per query head.
    ParityCase(
        "untied-silu-mha-split",
        {"tie_word_embeddings": False, "gate_attn_act_mode": "silu", "num_key_value_heads": 4},
        qkv="split",
        seed=2,
    ),
    # No gate, four query heads per KV head, head_dim 64, sharded with an index.
    ParityCase(
        "nogate-gqa4-sharded",
        {"headwise_attn_output_gate": False, "num_key_value_heads": 1, "head_dim": 64},
        shards=3,
        seed=3,
    ),
    # Six layers (two full), rotary half of each full-layer head, window 16.
    ParityCase(
        "untied-sigmoid-6layers-window16",
        {
            "tie_word_embeddings": False,
            "num_hidden_layers": 6,
            "sliding_window": 16,
            "rope_parameters": _HALF_ROTARY,
        },
        seed=4,
    ),
    # The first checkpoint served in bfloat16.
    ParityCase("tied-sigmoid-gqa2-fused-bf16", seed=8, dtype="bfloat16"),
)


def prompts(
    seed: int, vocab_size: int, lengths: tuple[int, ...] = PROMPT_LENGTHS
) -> list[list[int]]:
    """A batch of token-id prompts of ``lengths`` (:data:`PROMPT_LENGTHS` unless given),
    drawn from ``seed``, without special tokens."""
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab_size) for _ in range(n)] for n in lengths]


def _serve(llm_kwargs: dict[str, Any], batch: list[list[int]]) -> list[dict[str, list]]:
    from vllm import SamplingParams

    llm = in_process_llm(**llm_kwargs)
    params = SamplingParams(
        temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True, logprobs=1, detokenize=False
    )
    outputs = llm.generate([{"prompt_token_ids": p} for p in batch], params, use_tqdm=False)
    rope_rows = llm.apply_model(
        lambda model: sorted(
            {layer.self_attn.rotary_emb.cos_sin_cache.shape[0] for layer in model.model.layers}
        )
    )[0]
    del llm
    gc.collect()
    return [{"rope_cache_rows": rope_rows}, *map(completion_record, outputs)]


def completion_record(output: Any) -> dict[str, list]:
    """The sampled tokens of a ``RequestOutput`` and the log-probability of each."""
    completion = output.outputs[0]
    tokens = list(completion.token_ids)
    logprobs = [step[t].logprob for t, step in zip(tokens, completion.logprobs, strict=True)]
    return {"tokens": tokens, "logprobs": logprobs}


def _compare_fp32(reference: Any, batch: list[list[int]], served: list[dict]) -> dict[str, Any]:
    """Free-running greedy: identical tokens, log-probs within the fp32 tolerance."""
    per_prompt = []
    for prompt, out in zip(batch, served, strict=True):
        ref_tokens, ref_logprobs = reference.generate(prompt, NEW_TOKENS)
        top2 = reference.score(prompt, ref_tokens).topk(2, dim=-1).values
        same = out["tokens"] == ref_tokens
        # Past a divergence the two continue from different prefixes.
        compared = _common_prefix(out["tokens"], ref_tokens)
        diffs = [abs(a - b) for a, b in zip(out["logprobs"], ref_logprobs, strict=True)]
        per_prompt.append(
            {
                "prompt_len": len(prompt),
                "tokens_match": same,
                "first_mismatch": None if same else compared,
                "new_tokens": len(out["tokens"]),
                "max_abs_logprob_diff": max(diffs[: max(compared, 1)]),
                # How close the reference's greedy choices come to a tie: a
                # divergence at a margin near fp32 noise is a tie, not a bug.
                "min_greedy_margin": float((top2[:, 0] - top2[:, 1]).min()),
                "vllm_tokens": out["tokens"],
                "reference_tokens": ref_tokens,
            }
        )
    return {
        "tokens_match": all(p["tokens_match"] for p in per_prompt),
        "max_abs_logprob_diff": max(p["max_abs_logprob_diff"] for p in per_prompt),
        "prompts": per_prompt,
    }


def _teacher_forced(reference: Any, prompt: list[int], tokens: list[int], logprobs: list[float]):
    """Max |log-prob difference| and argmax agreement of a continuation under ``reference``."""
    steps = reference.score(prompt, tokens)
    diffs = [
        abs(float(steps[i, t]) - lp) for i, (t, lp) in enumerate(zip(tokens, logprobs, strict=True))
    ]
    agreement = sum(int(steps[i].argmax()) == t for i, t in enumerate(tokens)) / len(tokens)
    return max(diffs), agreement


def _compare_teacher_forced(
    reference: Any, batch: list[list[int]], served: list[dict]
) -> dict[str, Any]:
    """Score vLLM's bf16 continuation with the float32 reference, step by step; the
    reference's own bf16 continuation is scored the same way for scale."""
    import torch

    reference_bf16 = copy.deepcopy(reference).to(torch.bfloat16)
    per_prompt = []
    for prompt, out in zip(batch, served, strict=True):
        diff, agreement = _teacher_forced(reference, prompt, out["tokens"], out["logprobs"])
        ref_tokens, ref_logprobs = reference_bf16.generate(prompt, NEW_TOKENS)
        ref_diff, ref_agreement = _teacher_forced(reference, prompt, ref_tokens, ref_logprobs)
        per_prompt.append(
            {
                "prompt_len": len(prompt),
                "new_tokens": len(out["tokens"]),
                "argmax_agreement": agreement,
                "max_abs_logprob_diff": diff,
                "free_running_prefix_match": _common_prefix(
                    out["tokens"], reference.generate(prompt, NEW_TOKENS)[0]
                ),
                "reference_bf16": {
                    "argmax_agreement": ref_agreement,
                    "max_abs_logprob_diff": ref_diff,
                },
            }
        )
    return {
        "argmax_agreement": min(p["argmax_agreement"] for p in per_prompt),
        "max_abs_logprob_diff": max(p["max_abs_logprob_diff"] for p in per_prompt),
        "reference_bf16": {
            "argmax_agreement": min(p["reference_bf16"]["argmax_agreement"] for p in per_prompt),
            "max_abs_logprob_diff": max(
                p["reference_bf16"]["max_abs_logprob_diff"] for p in per_prompt
            ),
        },
        "prompts": per_prompt,
    }


def _common_prefix(a: list[int], b: list[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share."""
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), len(a))


def _window_cuts(reference_cls: Any, path: Path, batch: list[list[int]]) -> bool:
    """Whether the sliding window changes the reference's output on these prompts
    (else the parity says nothing about windowing)."""
    windowed = reference_cls.from_pretrained(path)
    unwindowed = reference_cls.from_pretrained(path)
    for layer in unwindowed.model.layers:
        layer.self_attn.window = None
    prompt = max(batch, key=len)
    return windowed.generate(prompt, NEW_TOKENS) != unwindowed.generate(prompt, NEW_TOKENS)


def run_case(case: ParityCase, workdir: Path) -> dict[str, Any]:
    """Build ``case``'s checkpoint under ``workdir``, serve it, compare with the reference."""
    from spark2_5_dev.checkpoints import build_spark2_5_checkpoint
    from spark2_5_dev.reference import Spark2_5Reference

    path = build_spark2_5_checkpoint(
        workdir / case.name, seed=case.seed, qkv=case.qkv, shards=case.shards, **case.overrides
    )
    config = json.loads((path / "config.json").read_text())
    batch = prompts(case.seed, config["vocab_size"])
    rope, *served = _serve(
        {
            "model": str(path),
            "dtype": case.dtype,
            "max_model_len": MAX_MODEL_LEN,
            "enforce_eager": True,
            "seed": 0,
        },
        batch,
    )
    reference = Spark2_5Reference.from_pretrained(path)
    compare = _compare_fp32 if case.dtype == "float32" else _compare_teacher_forced
    return {
        "case": asdict(case),
        "prompt_lengths": [len(p) for p in batch],
        "max_position_embeddings": config["max_position_embeddings"],
        "max_model_len": MAX_MODEL_LEN,
        "rope_cache_rows": rope["rope_cache_rows"],
        "window_cuts": _window_cuts(Spark2_5Reference, path, batch),
        **compare(reference, batch, served),
    }


def run_matrix(workdir: str | Path, cases: tuple[ParityCase, ...] = CASES) -> dict[str, Any]:
    """Run every case (see module docstring for the process it needs) and summarise.

    The returned dict records, per case, whether the tokens match and the worst
    log-prob difference, and overall the worst float32 difference seen.
    """
    for name, value in ENGINE_ENV.items():
        os.environ.setdefault(name, value)
    import torch
    import vllm

    # The tiny reference is fastest on one thread, and 2-core CI machines are shared.
    torch.set_num_threads(1)
    workdir = Path(workdir)
    results = {case.name: run_case(case, workdir) for case in cases}
    fp32 = [r for r in results.values() if r["case"]["dtype"] == "float32"]
    return {
        "vllm": vllm.__version__,
        "torch": torch.__version__,
        "new_tokens": NEW_TOKENS,
        "fp32_logprob_tolerance": FP32_LOGPROB_TOLERANCE,
        "bf16_logprob_tolerance": BF16_LOGPROB_TOLERANCE,
        "bf16_min_argmax_agreement": BF16_MIN_ARGMAX_AGREEMENT,
        "worst_fp32_logprob_diff": max((r["max_abs_logprob_diff"] for r in fp32), default=None),
        "cases": results,
    }


# (matrix case whose checkpoint is served, tensor parallel size, pipeline parallel size):
# KV heads partitioned (2 KV heads, TP 2), replicated (1 KV head, TP 2), two pipeline
# stages with a tied head (the last stage holds the embedding too), and one process
# compiled (torch.compile, as vLLM serves without enforce_eager).
PARALLEL_RUNS = (
    ("tied-sigmoid-gqa2-fused", 2, 1),
    ("nogate-gqa4-sharded", 2, 1),
    ("tied-sigmoid-gqa2-fused", 1, 2),
    ("tied-sigmoid-gqa2-fused", 1, 1),
)


def parallel_run_name(case_name: str, tp: int, pp: int) -> str:
    return f"{case_name}@tp{tp}pp{pp}"


def _threads_bind(world_size: int) -> str:
    """One CPU set per worker (``VLLM_CPU_OMP_THREADS_BIND``): vLLM's automatic
    binding wants one NUMA node per worker, and these machines have one node."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < world_size:
        raise RuntimeError(f"{world_size} workers need {world_size} CPUs; {len(cpus)} allowed")
    share = len(cpus) // world_size
    return "|".join(
        ",".join(map(str, cpus[i * share : (i + 1) * share])) for i in range(world_size)
    )


def run_parallel(workdir: str | Path, runs: tuple[tuple[str, int, int], ...] = PARALLEL_RUNS):
    """Greedy tokens of matrix checkpoints (already built in ``workdir`` by
    :func:`run_matrix`) served with tensor or pipeline parallel worker processes,
    for the same prompts as the matrix; keyed by :func:`parallel_run_name`.

    Runs without tensor parallelism are compiled: with ``enforce_eager`` the CPU
    model runner never allocates the buffer for the hidden states a later pipeline
    stage receives, for any model, and compiling warms that buffer up.
    """
    for name, value in ENGINE_ENV.items():
        if name != "VLLM_ENABLE_V1_MULTIPROCESSING":
            os.environ.setdefault(name, value)
    from vllm import LLM, SamplingParams

    params = SamplingParams(
        temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True, detokenize=False
    )
    results = {}
    for case_name, tp, pp in runs:
        case = next(c for c in CASES if c.name == case_name)
        path = Path(workdir) / case_name
        config = json.loads((path / "config.json").read_text())
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = _threads_bind(tp * pp)
        llm = LLM(
            str(path),
            dtype="float32",
            max_model_len=MAX_MODEL_LEN,
            enforce_eager=tp > 1,
            seed=0,
            tensor_parallel_size=tp,
            pipeline_parallel_size=pp,
            distributed_executor_backend="mp",
        )
        batch = prompts(case.seed, config["vocab_size"])
        outputs = llm.generate([{"prompt_token_ids": p} for p in batch], params, use_tqdm=False)
        results[parallel_run_name(case_name, tp, pp)] = [
            list(output.outputs[0].token_ids) for output in outputs
        ]
        del llm
        gc.collect()
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog=f"python -m {__spec__.name}", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--workdir", type=Path, required=True, help="where checkpoints go")
    parser.add_argument("--out", type=Path, required=True, help="JSON file for the results")
    parser.add_argument(
        "--parallel",
        action="store_true",
        help="instead of the matrix, serve its checkpoints (already in --workdir) with "
        "the tensor/pipeline parallel sizes of PARALLEL_RUNS and write the greedy tokens",
    )
    args = parser.parse_args(argv)
    if args.parallel:
        result: Any = run_parallel(args.workdir)
    else:
        result = run_matrix(args.workdir)
        print(f"worst float32 log-prob difference: {result['worst_fp32_logprob_diff']:.3e}")
    args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
