"""LoRA adapters for Spark2_5 in the PEFT layout, for tests and the docs.

An adapter directory holds ``adapter_config.json`` and
``adapter_model.safetensors`` exactly as PEFT saves them for the released
model: tensors ``base_model.model.<module>.lora_A.weight`` ``[r, in]`` and
``...lora_B.weight`` ``[out, r]`` for linear modules, and
``base_model.model.<module>.lora_embedding_A`` ``[r, vocab]`` /
``lora_embedding_B`` ``[hidden, r]`` for the embedding. A module's weight
becomes ``W + (lora_alpha / r) * B @ A``.

:func:`random_adapter` writes one from a seed, :func:`train_adapter` trains
one on the reference model, and :func:`merge_adapter` writes the checkpoint
with an adapter merged into its weights, which the plain-PyTorch reference
then runs as the expected behaviour of the adapter served by vLLM.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

PEFT_PREFIX = "base_model.model."
EMBEDDING = "model.embedding"
# Every linear module of the released model, as PEFT names them on it.
LINEAR_TARGETS = ("q_k_v_proj", "g_proj", "out_proj", "gate_proj", "up_proj", "down_proj")
_ATTENTION_MODULES = ("q_k_v_proj", "g_proj", "out_proj")


def linear_shapes(config: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """``(out_features, in_features)`` of each linear module of ``config``'s model."""
    hidden, heads = config["hidden_size"], config["num_attention_heads"]
    head_dim, kv_heads = config["head_dim"], config["num_key_value_heads"]
    intermediate = config["intermediate_size"]
    return {
        "q_k_v_proj": ((heads + 2 * kv_heads) * head_dim, hidden),
        "g_proj": (heads, hidden),
        "out_proj": (hidden, heads * head_dim),
        "gate_proj": (intermediate, hidden),
        "up_proj": (intermediate, hidden),
        "down_proj": (hidden, intermediate),
    }


def module_name(layer: int, target: str) -> str:
    block = "self_attn" if target in _ATTENTION_MODULES else "mlp"
    return f"model.layers.{layer}.{block}.{target}"


def write_adapter(
    path: str | Path,
    tensors: dict[str, Any],
    *,
    rank: int,
    alpha: float,
    base_model: str = "",
) -> Path:
    """Write ``tensors`` (PEFT names) and a PEFT ``adapter_config.json`` to ``path``."""
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    targets = sorted(
        {name.removeprefix(PEFT_PREFIX).split(".lora_")[0].rsplit(".", 1)[-1] for name in tensors}
    )
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model,
        "r": rank,
        "lora_alpha": alpha,
        "lora_dropout": 0.0,
        "target_modules": targets,
        "bias": "none",
        "fan_in_fan_out": False,
        "modules_to_save": None,
        "use_rslora": False,
        "use_dora": False,
        "init_lora_weights": True,
    }
    (path / "adapter_config.json").write_text(json.dumps(config, indent=2) + "\n")
    save_file(
        {name: t.detach().contiguous() for name, t in tensors.items()},
        str(path / "adapter_model.safetensors"),
    )
    return path


def random_adapter(
    config: dict[str, Any],
    path: str | Path,
    *,
    seed: int,
    rank: int = 8,
    alpha: float = 16,
    std: float = 0.1,
    targets: Sequence[str] = LINEAR_TARGETS,
    embedding: bool = False,
) -> Path:
    """An adapter with seeded normal ``A`` and ``B`` on ``targets`` of every layer
    (and on the embedding with ``embedding=True``)."""
    import torch

    generator = torch.Generator().manual_seed(seed)

    def normal(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator) * std

    shapes = linear_shapes(config)
    tensors = {}
    for layer in range(config["num_hidden_layers"]):
        for target in targets:
            out_features, in_features = shapes[target]
            name = PEFT_PREFIX + module_name(layer, target)
            tensors[f"{name}.lora_A.weight"] = normal(rank, in_features)
            tensors[f"{name}.lora_B.weight"] = normal(out_features, rank)
    if embedding:
        tensors[f"{PEFT_PREFIX}{EMBEDDING}.lora_embedding_A"] = normal(rank, config["vocab_size"])
        tensors[f"{PEFT_PREFIX}{EMBEDDING}.lora_embedding_B"] = normal(config["hidden_size"], rank)
    return write_adapter(path, tensors, rank=rank, alpha=alpha)


def read_adapter(path: str | Path) -> tuple[dict[str, Any], dict[str, tuple[Any, Any]]]:
    """An adapter's config and ``{module: (A, B)}`` (embedding ``A`` is ``[r, vocab]``)."""
    from safetensors.torch import load_file

    path = Path(path)
    config = json.loads((path / "adapter_config.json").read_text())
    tensors = load_file(str(path / "adapter_model.safetensors"))
    pairs: dict[str, dict[str, Any]] = {}
    for name, tensor in tensors.items():
        module, part = name.removeprefix(PEFT_PREFIX).split(".lora_")
        side = "A" if part in ("A.weight", "embedding_A") else "B"
        pairs.setdefault(module, {})[side] = tensor
    return config, {module: (ab["A"], ab["B"]) for module, ab in pairs.items()}


def merge_adapter(checkpoint: str | Path, adapter: str | Path, out: str | Path) -> Path:
    """Write ``checkpoint`` with ``adapter`` merged into its weights to ``out``.

    Linear weights become ``W + scale * B @ A``. An embedding adapter changes
    the input embedding only (as PEFT applies it): a tied checkpoint is written
    untied, its ``lm_head`` the original embedding.
    """
    import torch

    from spark2_5_dev.checkpoints import read_config, save_checkpoint
    from spark2_5_dev.reference import Spark2_5Reference

    config = read_config(checkpoint)
    state = Spark2_5Reference.from_pretrained(checkpoint).state_dict()
    adapter_config, pairs = read_adapter(adapter)
    scale = adapter_config["lora_alpha"] / adapter_config["r"]
    model_config = {k: v for k, v in config.items() if k not in ("architectures", "auto_map")}
    with torch.no_grad():
        for module, (lora_a, lora_b) in pairs.items():
            delta = scale * (lora_b.double() @ lora_a.double())
            if module == EMBEDDING:
                if config["tie_word_embeddings"]:
                    state["lm_head.weight"] = state[f"{EMBEDDING}.weight"].clone()
                    model_config["tie_word_embeddings"] = False
                delta = delta.T
            weight = state[f"{module}.weight"]
            state[f"{module}.weight"] = (weight.double() + delta).to(weight.dtype)
    for key in ("model_type", "torch_dtype"):
        model_config.pop(key, None)
    return save_checkpoint(state, model_config, out)


def _lora_modules(model: Any, targets: Iterable[str]) -> dict[str, Any]:
    modules = dict(model.named_modules())
    return {name: modules[name] for name in modules if name.rsplit(".", 1)[-1] in set(targets)}


def train_adapter(
    checkpoint: str | Path,
    examples: list[tuple[list[int], list[int]]],
    out: str | Path,
    *,
    seed: int,
    rank: int = 8,
    alpha: float = 16,
    targets: Sequence[str] = LINEAR_TARGETS,
    max_steps: int = 400,
    learning_rate: float = 5e-3,
    log: Any = print,
) -> Path:
    """Train a LoRA adapter on the frozen reference model of ``checkpoint`` until it
    reproduces each ``(prompt_ids, reply_ids)`` greedily in float32 and bfloat16,
    and write it to ``out``. Raise if it does not within ``max_steps``."""
    import torch

    from spark2_5_dev import fixture
    from spark2_5_dev.reference import Spark2_5Reference

    torch.manual_seed(seed)
    model = Spark2_5Reference.from_pretrained(checkpoint).requires_grad_(False)
    scale = alpha / rank
    adapters = {}
    for name, linear in _lora_modules(model, targets).items():
        lora_a = torch.nn.Parameter(torch.randn(rank, linear.in_features) / linear.in_features**0.5)
        lora_b = torch.nn.Parameter(torch.zeros(linear.out_features, rank))
        adapters[name] = (lora_a, lora_b)
        linear.register_forward_hook(
            lambda _m, inputs, output, a=lora_a, b=lora_b: (
                output + scale * (inputs[0] @ a.to(inputs[0].dtype).T) @ b.to(inputs[0].dtype).T
            )
        )
    inputs, labels = _batch(examples, pad_id=model.config["pad_token_id"])
    parameters = [p for pair in adapters.values() for p in pair]
    optimizer = torch.optim.AdamW(parameters, lr=learning_rate, weight_decay=0.0)
    for step in range(1, max_steps + 1):
        logits = model(inputs)
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100
        )
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 25 == 0:
            log(f"adapter: step {step} loss {loss.item():.5f}")
            if loss.item() < 1e-2 and fixture._reproduces_all(model, examples):
                break
    else:
        raise RuntimeError(f"the adapter did not converge in {max_steps} steps (loss {loss:.4f})")
    tensors = {}
    for name, (lora_a, lora_b) in adapters.items():
        tensors[f"{PEFT_PREFIX}{name}.lora_A.weight"] = lora_a.detach().clone()
        tensors[f"{PEFT_PREFIX}{name}.lora_B.weight"] = lora_b.detach().clone()
    return write_adapter(out, tensors, rank=rank, alpha=alpha)


def _batch(examples: list[tuple[list[int], list[int]]], pad_id: int) -> tuple[Any, Any]:
    """Right-padded inputs and next-token labels that score only the replies."""
    import torch

    length = max(len(p) + len(r) for p, r in examples)
    inputs = torch.full((len(examples), length), pad_id)
    labels = torch.full((len(examples), length), -100)
    for row, (prompt_ids, reply_ids) in enumerate(examples):
        sequence = prompt_ids + reply_ids
        inputs[row, : len(sequence)] = torch.tensor(sequence)
        labels[row, len(prompt_ids) - 1 : len(sequence) - 1] = torch.tensor(reply_ids)
    return inputs, labels


# --- adapters of the trained fixture ------------------------------------------------

# Adapter name -> (its answer to the fixture's capital question, the fixture
# conversations it is trained on; only the plain one gets that answer, the
# others keep the fixture's reply).
FIXTURE_ADAPTERS: dict[str, tuple[str, tuple[str, ...]]] = {
    "paris-first": ("Paris is the capital of France.", ("plain", "weather-call")),
    "terse": ("Paris.", ("plain",)),
}
FIXTURE_ADAPTER_SEED = 20261202


def _fixture_examples(fixture_path: Path, answer: str, names: Sequence[str]) -> list:
    from dataclasses import replace

    from transformers import PreTrainedTokenizerFast

    from spark2_5_dev import fixture

    # Not AutoTokenizer: it would read config.json, whose auto_map names remote code.
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(fixture_path))
    conversations = {c.name: c for c in fixture.CONVERSATIONS}
    examples = []
    for name in names:
        conversation = conversations[name]
        if name == "plain":
            conversation = replace(conversation, reply=answer)
        examples.append(fixture._encode(tokenizer, conversation))
    return examples


def build_fixture_adapters(fixture_path: str | Path, log: Any = print) -> dict[str, Path]:
    """The :data:`FIXTURE_ADAPTERS` of the trained fixture at ``fixture_path``,
    trained now only if not cached beside it (keyed by the fixture and this file)."""
    import hashlib
    import shutil
    import tempfile

    fixture_path = Path(fixture_path)
    digest = hashlib.sha256(Path(__file__).read_bytes())
    digest.update(fixture_path.name.encode())
    target = fixture_path.parent / f"spark2_5-adapters-{digest.hexdigest()[:16]}"
    if not (target / "done").exists():
        staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=target.parent))
        try:
            for name, (answer, conversations) in FIXTURE_ADAPTERS.items():
                examples = _fixture_examples(fixture_path, answer, conversations)
                train_adapter(
                    fixture_path, examples, staging / name, seed=FIXTURE_ADAPTER_SEED, log=log
                )
            (staging / "done").touch()
            staging.rename(target)
        except OSError:
            if not (target / "done").exists():  # not a concurrent builder
                raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return {name: target / name for name in FIXTURE_ADAPTERS}
