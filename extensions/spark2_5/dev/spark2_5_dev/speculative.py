"""Speculative decoding on Spark2_5 with EAGLE and EAGLE-3 draft heads and draft models.

A random tiny Spark2_5 checkpoint and, for it, a random one-layer Llama-style
EAGLE head and EAGLE-3 head (the layouts vLLM loads for Llama targets; the
EAGLE-3 head reads three of Spark2_5's layers, sliding and full). Then a smaller
Spark2_5 as the draft model of a Spark2_5 of full-attention layers, its draft
tokens taken with ``get_top_tokens`` where vLLM has that option. Greedy
generation with each must give exactly the tokens of generation without
speculation: the target model verifies every drafted token. One in-process
engine at a time, float32. Each part's failure is recorded on its own (``errors``)
and the parts after it still run: the tests judge each one.
"""

from __future__ import annotations

import gc
import json
import traceback
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from spark2_5_dev import host_features
from spark2_5_dev.checkpoints import (
    TINY_VOCAB_SIZE,
    build_spark2_5_checkpoint,
    read_config,
    write_tokenizer,
)
from spark2_5_dev.drivers import driver_main
from spark2_5_dev.engines import in_process_llm
from spark2_5_dev.parity import prompts

SEED = 5
PROMPT_LENGTHS = (4, 15, 33)
NEW_TOKENS = 24
MAX_MODEL_LEN = 256
SPECULATIVE_TOKENS = 3
PROMPTS = prompts(SEED, TINY_VOCAB_SIZE, PROMPT_LENGTHS)
# Layers 1 and 2 are sliding-window, 3 is full attention (spark2_5_config_dict).
EAGLE3_LAYERS = (1, 2, 3)
HEAD_HEADS, HEAD_KV_HEADS, HEAD_DIM = 4, 2, 32


def _head_tensors(hidden: int, intermediate: int, eagle3: bool) -> dict[str, Any]:
    """A one-layer draft head's tensors, named as vLLM's Llama EAGLE loaders read them."""
    import torch

    generator = torch.Generator().manual_seed(SEED)
    attention_in = 2 * hidden if eagle3 else hidden
    shapes = {
        "layers.0.self_attn.q_proj.weight": (HEAD_HEADS * HEAD_DIM, attention_in),
        "layers.0.self_attn.k_proj.weight": (HEAD_KV_HEADS * HEAD_DIM, attention_in),
        "layers.0.self_attn.v_proj.weight": (HEAD_KV_HEADS * HEAD_DIM, attention_in),
        "layers.0.self_attn.o_proj.weight": (hidden, HEAD_HEADS * HEAD_DIM),
        "layers.0.mlp.gate_proj.weight": (intermediate, hidden),
        "layers.0.mlp.up_proj.weight": (intermediate, hidden),
        "layers.0.mlp.down_proj.weight": (hidden, intermediate),
        "fc.weight": (hidden, (len(EAGLE3_LAYERS) if eagle3 else 2) * hidden),
    }
    tensors = {
        name: 0.1 * torch.randn(shape, generator=generator) for name, shape in shapes.items()
    }
    norms = ["layers.0.post_attention_layernorm.weight"]
    if eagle3:
        norms += ["layers.0.input_layernorm.weight", "layers.0.hidden_norm.weight", "norm.weight"]
    tensors.update({name: torch.ones(hidden) for name in norms})
    return tensors


def build_head(
    target: Path, path: Path, eagle3: bool, layers: tuple[int, ...] = EAGLE3_LAYERS
) -> Path:
    """An EAGLE (``eagle3=False``) or EAGLE-3 head for ``target``; it shares the
    target's embedding and LM head, as heads without their own do."""
    from safetensors.torch import save_file

    target_config = read_config(target)
    hidden = target_config["hidden_size"]
    config: dict[str, Any] = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": 2 * hidden,
        "num_hidden_layers": 1,
        "num_attention_heads": HEAD_HEADS,
        "num_key_value_heads": HEAD_KV_HEADS,
        "head_dim": HEAD_DIM,
        "hidden_act": "silu",
        "vocab_size": target_config["vocab_size"],
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
    }
    if eagle3:
        config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": list(layers)}
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    save_file(_head_tensors(hidden, 2 * hidden, eagle3), str(path / "model.safetensors"))
    write_tokenizer(path)
    return path


def rope_rows(model: Any) -> int:
    """How many positions the target's RoPE cos/sin cache covers."""
    return model.model.layers[0].self_attn.rotary_emb.cos_sin_cache.shape[0]


def _generate(
    target: Path, batch: list[list[int]], speculative: dict | None, record: dict | None = None
) -> list[list[int]]:
    """Greedy tokens for ``batch``; with ``record``, the target's RoPE rows in it."""
    from vllm import SamplingParams

    llm = in_process_llm(
        str(target),
        dtype="float32",
        max_model_len=MAX_MODEL_LEN,
        enforce_eager=True,
        speculative_config=speculative,
    )
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    try:
        if record is not None:
            record["rope_rows"] = llm.apply_model(rope_rows)[0]
        outputs = llm.generate([{"prompt_token_ids": p} for p in batch], params, use_tqdm=False)
        return [list(output.outputs[0].token_ids) for output in outputs]
    finally:
        del llm
        gc.collect()


def run(workdir: Path) -> dict[str, Any]:
    batch = PROMPTS
    target = build_spark2_5_checkpoint(workdir / "target", seed=SEED)
    heads = {
        "eagle": build_head(target, workdir / "eagle-head", eagle3=False),
        "eagle3": build_head(target, workdir / "eagle3-head", eagle3=True),
    }
    result: dict[str, Any] = {"errors": {}}
    # The RoPE rows the target holds, read in the runs the tests compare them for.
    record: dict[str, dict] = {"plain": {}, "eagle3": {}}
    _attempt(result, "plain", partial(_generate, target, batch, None, record["plain"]))
    for method, head in heads.items():
        speculative = _speculative(method, head)
        generate = partial(_generate, target, batch, speculative, record.get(method))
        _attempt(result, method, generate)
    result["rope_rows"] = {part: rows.get("rope_rows") for part, rows in record.items()}
    # A head that asks for a layer the target does not have.
    wrong = build_head(target, workdir / "wrong-layers-head", eagle3=True, layers=(1, 2, 9))
    result["refusal_out_of_range"] = _refusal(
        lambda: _generate(target, batch[:1], _speculative("eagle3", wrong))
    )
    _draft_models(result, workdir, batch, target)
    return result


def _draft_models(
    result: dict[str, Any], workdir: Path, batch: list[list[int]], hybrid: Path
) -> None:
    full = ["full_attention"] * 4
    target = build_spark2_5_checkpoint(workdir / "full-target", seed=SEED, layer_types=full)
    draft = build_spark2_5_checkpoint(
        workdir / "draft-model", seed=SEED + 1, num_hidden_layers=2, layer_types=full[:2]
    )
    speculative = _speculative("draft_model", draft)
    if host_features.takes_draft_tokens_by_local_argmax():
        speculative["use_local_argmax_reduction"] = True
    _attempt(result, "full_attention_plain", partial(_generate, target, batch, None))
    _attempt(result, "draft_model", partial(_generate, target, batch, speculative))
    result["refusal_draft_model_over_sliding"] = _refusal(
        lambda: _generate(hybrid, batch[:1], speculative)
    )


def _attempt(result: dict[str, Any], part: str, generate: Callable[[], Any]) -> None:
    """``result[part] = generate()``; when it raises, the error goes to
    ``result["errors"][part]`` (its traceback to the log) and the run goes on."""
    try:
        result[part] = generate()
    except Exception as error:  # the engine's own error, judged by the tests
        traceback.print_exc()
        result["errors"][part] = _as_read(error)


def _refusal(generate: Callable[[], Any]) -> str:
    """The error a run that must be refused raises, as a user reads it; "" if none."""
    try:
        generate()
    except Exception as error:
        return _as_read(error)
    return ""


def _as_read(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


def _speculative(method: str, head: Path) -> dict[str, Any]:
    return {"method": method, "model": str(head), "num_speculative_tokens": SPECULATIVE_TOKENS}


if __name__ == "__main__":
    driver_main(
        __spec__.name,
        __doc__.splitlines()[0],
        run,
        lambda result: {
            **{m: result.get(m) == result.get("plain") for m in ("eagle", "eagle3")},
            "draft_model": result.get("draft_model") == result.get("full_attention_plain"),
            "errors": sorted(result["errors"]),
        },
    )
