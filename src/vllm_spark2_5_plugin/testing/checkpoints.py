"""Tiny checkpoints written from a seed, for tests, the demo and benchmarks.

Every checkpoint here shares one byte-level tokenizer whose special tokens carry
Spark2_5's real names (turn markers, thinking and tool-call tags), so a text
written in the model's format tokenizes the way the real tokenizer does it: each
tag is one special token.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

BOS = "<｜start▁of▁sentence｜>"
EOS = "<｜end▁of▁sentence｜>"
PAD = "<｜pad▁token｜>"
SPECIAL_TOKENS = (
    BOS,
    EOS,
    PAD,
    "<think>",
    "</think>",
    "<|System|>",
    "<|User|>",
    "<|Bot|>",
    "<|Tool|>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<arg_key>",
    "</arg_key>",
    "<arg_value>",
    "</arg_value>",
)
# Room above the 256 byte tokens and the specials, rounded for tidy shapes.
TINY_VOCAB_SIZE = 320


def chat_template() -> str:
    """The Spark2_5-style chat template shipped with the tiny checkpoints."""
    return (
        resources.files("vllm_spark2_5_plugin.testing")
        .joinpath("chat_template.jinja")
        .read_text(encoding="utf-8")
    )


def write_tokenizer(path: str | Path) -> None:
    """Write a byte-level tokenizer (specials first, then the 256 bytes) to ``path``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS)}
    for char in sorted(pre_tokenizers.ByteLevel.alphabet()):
        vocab[char] = len(vocab)
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(list(SPECIAL_TOKENS))
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        additional_special_tokens=list(SPECIAL_TOKENS[3:]),
    )
    tokenizer.chat_template = chat_template()
    tokenizer.save_pretrained(str(path))


def _save_state_dict(path: Path, tensors: dict[str, Any]) -> None:
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path / "model.safetensors"))


def build_llama_checkpoint(
    path: str | Path,
    seed: int = 0,
    hidden_size: int = 64,
    num_hidden_layers: int = 2,
    num_attention_heads: int = 2,
    num_key_value_heads: int = 1,
    intermediate_size: int = 128,
    **config_overrides: Any,
) -> Path:
    """A random in-tree ``LlamaForCausalLM`` (head_dim >= 32 for CPU attention)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    config = LlamaConfig(
        vocab_size=TINY_VOCAB_SIZE,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads,
        max_position_embeddings=2048,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=2,
        tie_word_embeddings=False,
        torch_dtype="float32",
        **config_overrides,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0.0, 0.2)
    config.save_pretrained(str(path))
    _save_state_dict(path, model.state_dict())
    write_tokenizer(path)
    return path


def read_config(path: str | Path) -> dict[str, Any]:
    return json.loads((Path(path) / "config.json").read_text())
