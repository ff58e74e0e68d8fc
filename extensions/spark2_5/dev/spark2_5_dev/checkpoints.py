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
        resources.files("spark2_5_dev").joinpath("chat_template.jinja").read_text(encoding="utf-8")
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
    vocab_size: int = TINY_VOCAB_SIZE,
    **config_overrides: Any,
) -> Path:
    """A random in-tree ``LlamaForCausalLM`` (head_dim >= 32 for CPU attention)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    config = LlamaConfig(
        # Without it vLLM resolves the pooling LlamaModel, not the causal LM.
        architectures=["LlamaForCausalLM"],
        vocab_size=vocab_size,
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


# --- Spark2_5 ---------------------------------------------------------------------

SPARK2_5_ARCHITECTURE = "Spark2_5ForCausalLM"
# The released checkpoint points at its remote code; serving must never need it.
SPARK2_5_AUTO_MAP = {
    "AutoConfig": "configuration_spark.Spark2_5Config",
    "AutoModelForCausalLM": "modeling_spark.Spark2_5ForCausalLM",
}


def spark2_5_config_dict(**overrides: Any) -> dict[str, Any]:
    """A tiny Spark2_5 ``config.json`` with the 4B's keys and structure.

    Decoupled ``head_dim`` (4 x 32 != 64), GQA 2, three sliding layers then a full
    one, a window of 8 so short prompts already cut it, partial RoPE on the full
    layers, and the 4B's 1M ``max_position_embeddings``. ``overrides`` replace keys.
    """
    config: dict[str, Any] = {
        "vocab_size": TINY_VOCAB_SIZE,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "hidden_act": "gelu",
        "max_position_embeddings": 1_048_576,
        "initializer_range": 0.02,
        "rms_norm_eps": 1e-6,
        "use_cache": True,
        "layer_types": ["sliding_attention"] * 3 + ["full_attention"],
        "sliding_window": 8,
        "rope_parameters": {
            "full_attention": {
                "rope_type": "default",
                "rope_theta": 5_000_000,
                "partial_rotary_factor": 0.25,
            },
            "sliding_attention": {
                "rope_type": "default",
                "rope_theta": 10_000,
                "partial_rotary_factor": 1.0,
            },
        },
        "headwise_attn_output_gate": True,
        "gate_attn_act_mode": "sigmoid",
        "attention_bias": False,
        "mlp_bias": False,
        "attention_dropout": 0.0,
        "tie_word_embeddings": True,
        "bos_token_id": 0,
        "eos_token_id": 1,
        "pad_token_id": 2,
    }
    config.update(overrides)
    if "num_hidden_layers" in overrides and "layer_types" not in overrides:
        n = config["num_hidden_layers"]
        config["layer_types"] = [
            "full_attention" if (i + 1) % 4 == 0 else "sliding_attention" for i in range(n)
        ]
    return config


def _split_qkv(tensors: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
    """Re-export layout: each fused ``q_k_v_proj`` as separate ``q_proj/k_proj/v_proj``."""
    head_dim = config["head_dim"]
    sizes = [
        config["num_attention_heads"] * head_dim,
        config["num_key_value_heads"] * head_dim,
        config["num_key_value_heads"] * head_dim,
    ]
    split = {}
    for name, tensor in tensors.items():
        if ".q_k_v_proj." in name:
            for part, piece in zip("qkv", tensor.split(sizes, dim=0), strict=True):
                split[name.replace(".q_k_v_proj.", f".{part}_proj.")] = piece
        else:
            split[name] = tensor
    return split


def save_checkpoint(
    model_or_state_dict: Any,
    config: dict[str, Any],
    path: str | Path,
    *,
    qkv: str = "fused",
    shards: int = 1,
) -> Path:
    """Write a Spark2_5 checkpoint in the released Hugging Face layout.

    ``config.json`` (``architectures``, ``model_type``, ``auto_map`` added to
    ``config``), safetensors named as in the 4B (fused ``q_k_v_proj``, or
    separate ``q/k/v_proj`` with ``qkv="split"``; no ``lm_head.weight`` when
    tied), ``shards`` files with ``model.safetensors.index.json`` when > 1, and
    the tiny tokenizer. ``model_or_state_dict`` is a module (e.g. the reference)
    or its ``state_dict()``.
    """
    from safetensors.torch import save_file

    if qkv not in ("fused", "split"):
        raise ValueError(f"qkv={qkv!r}: use 'fused' (the released layout) or 'split'")
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    state = (
        model_or_state_dict.state_dict()
        if hasattr(model_or_state_dict, "state_dict")
        else dict(model_or_state_dict)
    )
    tensors = {name: t.detach().cpu().contiguous() for name, t in state.items()}
    if config["tie_word_embeddings"]:
        tensors.pop("lm_head.weight", None)
    if qkv == "split":
        tensors = _split_qkv(tensors, config)
    dtype = str(next(iter(tensors.values())).dtype).removeprefix("torch.")

    full_config = {
        "architectures": [SPARK2_5_ARCHITECTURE],
        "model_type": "spark2_5",
        "auto_map": SPARK2_5_AUTO_MAP,
        **config,
        "torch_dtype": dtype,
    }
    (path / "config.json").write_text(json.dumps(full_config, indent=2) + "\n")

    names = sorted(tensors)
    if shards <= 1:
        save_file({n: tensors[n] for n in names}, str(path / "model.safetensors"))
    else:
        weight_map = {}
        for index in range(shards):
            file = f"model-{index + 1:05d}-of-{shards:05d}.safetensors"
            group = names[index::shards]
            save_file({n: tensors[n] for n in group}, str(path / file))
            weight_map.update(dict.fromkeys(group, file))
        total_size = sum(t.numel() * t.element_size() for t in tensors.values())
        index_json = {"metadata": {"total_size": total_size}, "weight_map": weight_map}
        (path / "model.safetensors.index.json").write_text(json.dumps(index_json, indent=2))
    write_tokenizer(path)
    return path


def random_spark2_5(
    config: dict[str, Any], seed: int = 0, std: float = 0.25, device: str = "cpu"
) -> Any:
    """The reference model with seeded random weights (norm weights around 1), made
    on ``device`` (a GPU draws the 4B's in seconds; its draws differ from the CPU's)."""
    import torch

    from spark2_5_dev.reference import Spark2_5Reference

    generator = torch.Generator(device).manual_seed(seed)
    with torch.device(device):
        model = Spark2_5Reference(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.uniform_(0.8, 1.2, generator=generator)
            else:
                param.normal_(0.0, std, generator=generator)
    return model


def build_spark2_5_checkpoint(
    path: str | Path,
    seed: int = 0,
    qkv: str = "fused",
    shards: int = 1,
    std: float = 0.25,
    **config_overrides: Any,
) -> Path:
    """A random tiny Spark2_5 checkpoint (see :func:`spark2_5_config_dict`); ``std``
    of its weights other than the norms'."""
    config = spark2_5_config_dict(**config_overrides)
    model = random_spark2_5(config, seed, std=std)
    return save_checkpoint(model, config, path, qkv=qkv, shards=shards)


# Spark2_5's tensor names that in-tree Llama spells differently.
_LLAMA_NAMES = {".embedding.": ".embed_tokens.", ".out_proj.": ".o_proj."}


def build_llama_twin(spark2_5_path: str | Path, path: str | Path) -> Path:
    """The in-tree ``LlamaForCausalLM`` holding a Spark2_5 checkpoint's own tensors.

    Same embedding, norms, q/k/v, output and MLP weights and head, same dims,
    ``layer_types`` and window; what Llama has no place for is left out (the
    ``g_proj`` output gate, the per-layer-type RoPE: Llama takes the sliding
    layers'). A benchmark then times both models on the same numbers.
    """
    from transformers import LlamaConfig

    from spark2_5_dev.reference import checkpoint_tensors

    spark = read_config(spark2_5_path)
    tensors = _split_qkv(checkpoint_tensors(Path(spark2_5_path)), spark)
    for name in list(tensors):
        renamed = name
        for spark_part, llama_part in _LLAMA_NAMES.items():
            renamed = renamed.replace(spark_part, llama_part)
        tensors[renamed] = tensors.pop(name)
    tensors = {name: t for name, t in tensors.items() if ".g_proj." not in name}
    if spark["tie_word_embeddings"]:
        tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"].clone()
    rope = spark["rope_parameters"]["sliding_attention"]
    config = {
        key: spark[key]
        for key in (
            *("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers"),
            *("num_attention_heads", "num_key_value_heads", "head_dim", "rms_norm_eps"),
            *("layer_types", "sliding_window", "bos_token_id", "eos_token_id", "pad_token_id"),
        )
    }
    llama = LlamaConfig(
        **config,
        architectures=["LlamaForCausalLM"],
        max_position_embeddings=2048,
        rope_theta=rope["rope_theta"],
        tie_word_embeddings=False,
        torch_dtype=str(next(iter(tensors.values())).dtype).removeprefix("torch."),
    )
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    llama.save_pretrained(str(path))
    _save_state_dict(path, tensors)
    write_tokenizer(path)
    return path
