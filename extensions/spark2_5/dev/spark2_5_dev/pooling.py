"""Spark2_5 as a pooling model, each of vLLM's conversions against a float64 reference.

``--convert embed`` (the last token's final hidden state, normalised), ``--convert
classify`` of a reward checkpoint (``score.weight``, one label), the LLM-as-reranker
recipe (``classifier_from_token`` with ``from_2_way_softmax``: the probability
``sigmoid(logit[yes] - logit[no])`` of the causal LM), and ``--convert classify`` of a
checkpoint without ``score.weight`` (must be refused by name). One random tiny
checkpoint, served by vLLM's offline API in float32, one engine at a time.
"""

from __future__ import annotations

import gc
import json
from pathlib import Path
from typing import Any

from spark2_5_dev.checkpoints import (
    TINY_VOCAB_SIZE,
    random_spark2_5,
    save_checkpoint,
    spark2_5_config_dict,
)
from spark2_5_dev.drivers import driver_main
from spark2_5_dev.engines import in_process_llm
from spark2_5_dev.parity import prompts

SEED = 11
PROMPT_LENGTHS = (3, 12, 40)  # within, across and well past the sliding window
PROMPTS = prompts(SEED, TINY_VOCAB_SIZE, PROMPT_LENGTHS)
RERANK_TOKENS = ("<think>", "</think>")  # any two single tokens: (no, yes)
# float32 engine against the float64 reference, on scores in [0, 1] and unit vectors.
TOLERANCE = 1e-5


def build_checkpoints(workdir: Path) -> dict[str, Path]:
    """The causal LM, and the same with a one-label ``score`` head (a reward model)."""
    import torch

    config = spark2_5_config_dict()
    model = random_spark2_5(config, seed=SEED)
    lm = save_checkpoint(model, config, workdir / "causal-lm")
    head = torch.Generator().manual_seed(SEED + 1)
    # Small, so that the reward's sigmoid is not saturated.
    score = 0.1 * torch.randn(1, config["hidden_size"], generator=head)
    state = {**model.state_dict(), "score.weight": score}
    reward = save_checkpoint(state, {**config, "num_labels": 1}, workdir / "reward")
    return {"causal-lm": lm, "reward": reward}


def reference_scores(checkpoints: dict[str, Path], batch: list[list[int]]) -> dict[str, list]:
    """float64 last-token results: normalised hidden state, reward and reranker scores."""
    import torch

    from spark2_5_dev.reference import Spark2_5Reference, checkpoint_tensors

    reference = Spark2_5Reference.from_pretrained(checkpoints["causal-lm"], dtype=torch.float64)
    score = checkpoint_tensors(checkpoints["reward"])["score.weight"].double()
    no, yes = token_ids(checkpoints["causal-lm"], RERANK_TOKENS)
    embedding = reference.model.embedding.weight
    results: dict[str, list] = {"embed": [], "reward": [], "rerank": []}
    with torch.no_grad():
        for prompt in batch:
            hidden = reference.model(reference.as_input(prompt)[None])[0, -1].double()
            results["embed"].append(torch.nn.functional.normalize(hidden, dim=0).tolist())
            logits = hidden @ embedding.double().T
            results["rerank"].append(float(torch.sigmoid(logits[yes] - logits[no])))
            results["reward"].append(float(torch.sigmoid(hidden @ score[0])))
    return results


def token_ids(checkpoint: Path, tokens: tuple[str, ...]) -> list[int]:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(checkpoint).convert_tokens_to_ids(list(tokens))


def _served(checkpoint: Path, convert: str, batch: list[list[int]], **overrides: Any) -> list:
    llm = in_process_llm(
        str(checkpoint),
        runner="pooling",
        convert=convert,
        dtype="float32",
        max_model_len=256,
        enforce_eager=True,
        hf_overrides=overrides or None,
    )
    inputs = [{"prompt_token_ids": prompt} for prompt in batch]
    try:
        if convert == "embed":
            return [o.outputs.embedding for o in llm.embed(inputs, use_tqdm=False)]
        return [o.outputs.probs[0] for o in llm.classify(inputs, use_tqdm=False)]
    finally:
        del llm
        gc.collect()


def _refusal(checkpoint: Path, batch: list[list[int]]) -> str:
    """What loading a checkpoint without ``score.weight`` for ``classify`` raises."""
    try:
        _served(checkpoint, "classify", batch)
    except Exception as error:  # the engine's own error, as a user sees it
        return f"{type(error).__name__}: {error}"
    return ""


def worst_abs_diff(served: list, expected: list) -> float:
    import torch

    difference = torch.tensor(served, dtype=torch.float64) - torch.tensor(
        expected, dtype=torch.float64
    )
    return float(difference.abs().max())


def run(workdir: Path) -> dict[str, Any]:
    batch = PROMPTS
    checkpoints = build_checkpoints(workdir)
    expected = reference_scores(checkpoints, batch)
    rerank = {"classifier_from_token": list(RERANK_TOKENS), "method": "from_2_way_softmax"}
    served = {
        "embed": _served(checkpoints["causal-lm"], "embed", batch),
        "reward": _served(checkpoints["reward"], "classify", batch),
        "rerank": _served(checkpoints["causal-lm"], "classify", batch, **rerank),
    }
    return {
        "worst_abs_diff": {kind: worst_abs_diff(served[kind], expected[kind]) for kind in served},
        "served": served,
        "expected": expected,
        "refusal_without_score": _refusal(checkpoints["causal-lm"], batch),
    }


if __name__ == "__main__":
    driver_main(
        __spec__.name,
        __doc__.splitlines()[0],
        run,
        lambda result: json.dumps(result["worst_abs_diff"]),
    )
