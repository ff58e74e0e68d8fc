"""LoRA adapters served by vLLM against the reference run on merged weights.

:func:`run` builds a tiny random Spark2_5 checkpoint (the released layout: tied
head, fused ``q_k_v_proj``) and seeded PEFT adapters for it, serves the base
model and every adapter in one batch from one offline ``vllm.LLM(enable_lora=
True)`` in float32, and compares each adapter's greedy tokens and log-probs with
the plain-PyTorch reference run on the checkpoint with that adapter merged into
its weights (:func:`spark2_5_dev.lora.merge_adapter`). Last, it
asks for an adapter in the split ``q_proj/k_proj/v_proj`` layout and records
vLLM's error. Run it in a fresh process with the carrier enabled and the
in-process engine (``python -m spark2_5_dev.lora_parity``).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from spark2_5_dev import lora, parity
from spark2_5_dev.engines import in_process_llm

CHECKPOINT_SEED = 8
RANK = 8
# Adapter name -> (seed, what it targets besides every linear module).
ADAPTERS = {
    "all-linear": (11, ()),
    "all-linear-and-embedding": (12, ("embedding",)),
}
SPLIT_QKV_TARGETS = ("q_proj", "k_proj", "v_proj")


def _split_qkv_adapter(config: dict[str, Any], path: Path) -> Path:
    """An adapter on separate q_proj/k_proj/v_proj, as PEFT writes it for a
    re-exported checkpoint with split attention projections."""
    import torch

    shapes = lora.linear_shapes(config)
    head_dim = config["head_dim"]
    sizes = {
        "q_proj": config["num_attention_heads"] * head_dim,
        "k_proj": config["num_key_value_heads"] * head_dim,
        "v_proj": config["num_key_value_heads"] * head_dim,
    }
    generator = torch.Generator().manual_seed(13)
    tensors = {}
    for layer in range(config["num_hidden_layers"]):
        for target in SPLIT_QKV_TARGETS:
            name = f"{lora.PEFT_PREFIX}model.layers.{layer}.self_attn.{target}"
            hidden = shapes["q_k_v_proj"][1]
            tensors[f"{name}.lora_A.weight"] = torch.randn(RANK, hidden, generator=generator)
            tensors[f"{name}.lora_B.weight"] = torch.randn(sizes[target], RANK, generator=generator)
    return lora.write_adapter(path, tensors, rank=RANK, alpha=16)


def _generate(llm: Any, batch: list[list[int]], request: Any) -> list[dict[str, list]]:
    from vllm import SamplingParams

    params = SamplingParams(
        temperature=0.0,
        max_tokens=parity.NEW_TOKENS,
        ignore_eos=True,
        logprobs=1,
        detokenize=False,
    )
    outputs = llm.generate(
        [{"prompt_token_ids": p} for p in batch], params, lora_request=request, use_tqdm=False
    )
    results = []
    for output in outputs:
        completion = output.outputs[0]
        tokens = list(completion.token_ids)
        logprobs = [step[t].logprob for t, step in zip(tokens, completion.logprobs, strict=True)]
        results.append({"tokens": tokens, "logprobs": logprobs})
    return results


def _generate_together(
    llm: Any, batch: list[list[int]], requests: list[Any]
) -> list[list[dict[str, list]]]:
    """Every prompt without an adapter and with each of ``requests``, in one batch;
    the results per adapter (``None`` first)."""
    per_prompt = [None, *requests]
    served = _generate(
        llm, batch * len(per_prompt), [request for request in per_prompt for _ in batch]
    )
    return [served[i * len(batch) : (i + 1) * len(batch)] for i in range(len(per_prompt))]


def _compare_adapter(
    merged: Path, adapter: Path, batch: list[list[int]], served: list[dict], base: list[dict]
) -> dict[str, Any]:
    """``served`` (with ``adapter``) against the reference on the ``merged`` checkpoint,
    and how many prompts the adapter changed from the ``base`` model's tokens."""
    from spark2_5_dev.reference import Spark2_5Reference

    compared = parity._compare_fp32(Spark2_5Reference.from_pretrained(merged), batch, served)
    compared["prompts_changed_by_adapter"] = sum(
        out["tokens"] != ref["tokens"] for out, ref in zip(served, base, strict=True)
    )
    config = json.loads((adapter / "adapter_config.json").read_text())
    compared["targets"] = config["target_modules"]
    return compared


def _error_of(llm: Any, batch: list[list[int]], request: Any) -> str | None:
    """vLLM's error for generating with ``request``, ``None`` if it generates."""
    try:
        _generate(llm, batch, request)
    except Exception as error:  # whatever vLLM raises is what is recorded
        return f"{type(error).__name__}: {error}"
    return None


def run(workdir: str | Path) -> dict[str, Any]:
    """Build, serve and compare (see the module docstring); return what was measured."""
    for name, value in parity.ENGINE_ENV.items():
        os.environ.setdefault(name, value)
    import torch
    import vllm
    from vllm.lora.request import LoRARequest

    from spark2_5_dev.checkpoints import build_spark2_5_checkpoint, read_config
    from spark2_5_dev.reference import Spark2_5Reference

    torch.set_num_threads(1)
    workdir = Path(workdir)
    checkpoint = build_spark2_5_checkpoint(workdir / "base", seed=CHECKPOINT_SEED)
    config = read_config(checkpoint)
    adapters = {
        name: lora.random_adapter(
            config, workdir / name, seed=seed, rank=RANK, embedding="embedding" in extra
        )
        for name, (seed, extra) in ADAPTERS.items()
    }
    batch = parity.prompts(CHECKPOINT_SEED, config["vocab_size"])
    reference = Spark2_5Reference.from_pretrained(checkpoint)
    # One LoRA slot more than adapters: vLLM's CPU LoRA ops give requests without
    # an adapter the adapter in the last slot once every slot is taken.
    llm = in_process_llm(
        model=str(checkpoint),
        dtype="float32",
        max_model_len=parity.MAX_MODEL_LEN,
        enforce_eager=True,
        seed=0,
        enable_lora=True,
        max_loras=len(adapters) + 1,
        max_lora_rank=RANK,
    )
    requests = [
        LoRARequest(name, index + 1, str(path))
        for index, (name, path) in enumerate(adapters.items())
    ]
    base_served, *adapter_served = _generate_together(llm, batch, requests)
    results: dict[str, Any] = {"base": parity._compare_fp32(reference, batch, base_served)}
    for (name, path), out in zip(adapters.items(), adapter_served, strict=True):
        merged = lora.merge_adapter(checkpoint, path, workdir / f"{name}-merged")
        results[name] = _compare_adapter(merged, path, batch, out, base_served)
    # The same batch with one adapter more, which takes the last slot.
    first_name, first_path = next(iter(adapters.items()))
    extra = LoRARequest(f"{first_name}-again", len(requests) + 1, str(first_path))
    base_full, *_ = _generate_together(llm, batch, [*requests, extra])
    results["base-with-every-lora-slot-taken"] = parity._compare_fp32(reference, batch, base_full)
    split = _split_qkv_adapter(config, workdir / "split-qkv")
    split_error = _error_of(llm, batch[:1], LoRARequest("split-qkv", len(requests) + 2, str(split)))
    return {
        "vllm": vllm.__version__,
        "torch": torch.__version__,
        "prompt_lengths": [len(p) for p in batch],
        "new_tokens": parity.NEW_TOKENS,
        "fp32_logprob_tolerance": parity.FP32_LOGPROB_TOLERANCE,
        "results": results,
        "split_qkv_error": split_error,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, required=True, help="where checkpoints go")
    parser.add_argument("--out", type=Path, required=True, help="JSON file for the results")
    args = parser.parse_args(argv)
    result = run(args.workdir)
    args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
