"""A tiny Spark2_5 checkpoint trained to chat and to call tools.

Random weights never produce a tool call, so the end-to-end tests and the demo
use this model instead: the project's reference implementation
(:mod:`spark2_5_dev.reference`) is trained on CPU, from a fixed seed,
to give the answers in :data:`CONVERSATIONS` — plain answers, tool calls in
Spark2_5's compact format and a follow-up after a tool result — rendered
through the tiny tokenizer's Spark2_5-style chat template exactly as vLLM
renders them. Training stops when the reference reproduces every answer
greedily in float32 and bfloat16.

The result is cached under a hash of everything that shapes it (this file,
the reference, the checkpoint writer, the template), so it is built once per
machine: ``python -m spark2_5_dev.fixture`` prints its path.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spark2_5_dev.tools import TIME_TOOL, WEATHER_TOOL


def tool_call_text(name: str, arguments: dict[str, Any]) -> str:
    """A call in Spark2_5's compact format, as the official template renders it."""
    pairs = "".join(
        f"<arg_key>{key}</arg_key><arg_value>"
        f"{value if isinstance(value, str) else json.dumps(value)}</arg_value>"
        for key, value in arguments.items()
    )
    return f"<tool_call>{name}{pairs}</tool_call>"


@dataclass(frozen=True)
class Conversation:
    """A prompt (messages and tools) and the assistant reply the model learns."""

    name: str
    messages: list[dict[str, Any]]
    reply: str
    tools: list[dict[str, Any]] = field(default_factory=list)
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)


PARIS_QUESTION = "What is the weather in Paris for the next 3 days?"
PARIS_CALL = {"city": "Paris", "days": 3}
HEFEI_QUESTION = "合肥今天天气怎么样？"
HEFEI_CALL = {"city": "合肥", "days": 1}
TOKYO_QUESTION = "What time is it in Tokyo?"
TOKYO_CALL = {"timezone": "Asia/Tokyo"}
CAPITAL_QUESTION = "What is the capital of France?"
CAPITAL_ANSWER = "The capital of France is Paris."
PARIS_TOOL_RESULT = "Sunny, 22 C"
PARIS_FOLLOW_UP = "It will be sunny in Paris, around 22 C."
GREETING = "Hello there!"
GREETING_REASONING = "Greet."
GREETING_ANSWER = "Hello! How can I help you today?"
# An agent's turn: thinking, text, a call, and text written after the call.
FORECAST_REASONING = "The forecast needs a call."
BEFORE_CALL, AFTER_CALL = "Let me check. ", " Done."
THINKING_ON = {"enable_thinking": True}
THINKING_OFF = {"enable_thinking": False}


def _assistant_call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """An assistant tool-call message as an OpenAI client sends it."""
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_0",
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(arguments)},
            }
        ],
    }


CONVERSATIONS: tuple[Conversation, ...] = (
    Conversation("plain", [{"role": "user", "content": CAPITAL_QUESTION}], CAPITAL_ANSWER),
    Conversation(
        "plain-with-tools",
        [{"role": "user", "content": CAPITAL_QUESTION}],
        CAPITAL_ANSWER,
        [WEATHER_TOOL],
    ),
    Conversation(
        "weather-call",
        [{"role": "user", "content": PARIS_QUESTION}],
        tool_call_text("get_weather", PARIS_CALL),
        [WEATHER_TOOL],
    ),
    Conversation(
        "weather-call-unicode",
        [{"role": "user", "content": HEFEI_QUESTION}],
        tool_call_text("get_weather", HEFEI_CALL),
        [WEATHER_TOOL],
    ),
    Conversation(
        "time-call",
        [{"role": "user", "content": TOKYO_QUESTION}],
        tool_call_text("get_time", TOKYO_CALL),
        [WEATHER_TOOL, TIME_TOOL],
    ),
    # Asked about weather with only the clock declared, the model still calls
    # get_weather: the parser must not hand that call to the client.
    Conversation(
        "undeclared-call",
        [{"role": "user", "content": PARIS_QUESTION}],
        tool_call_text("get_weather", PARIS_CALL),
        [TIME_TOOL],
    ),
    Conversation(
        "follow-up",
        [
            {"role": "user", "content": PARIS_QUESTION},
            _assistant_call("get_weather", PARIS_CALL),
            {"role": "tool", "tool_call_id": "call_0", "content": PARIS_TOOL_RESULT},
        ],
        PARIS_FOLLOW_UP,
        [WEATHER_TOOL],
    ),
    # With thinking on, the template opens <think>; the model closes it, then answers.
    Conversation(
        "thinking",
        [{"role": "user", "content": GREETING}],
        f"{GREETING_REASONING}</think>{GREETING_ANSWER}",
        chat_template_kwargs=THINKING_ON,
    ),
    Conversation(
        "thinking-with-tools",
        [{"role": "user", "content": GREETING}],
        f"{GREETING_REASONING}</think>{GREETING_ANSWER}",
        [WEATHER_TOOL],
        chat_template_kwargs=THINKING_ON,
    ),
    Conversation(
        "thinking-call-with-text",
        [{"role": "user", "content": PARIS_QUESTION}],
        f"{FORECAST_REASONING}</think>{BEFORE_CALL}"
        f"{tool_call_text('get_weather', PARIS_CALL)}{AFTER_CALL}",
        [WEATHER_TOOL],
        chat_template_kwargs=THINKING_ON,
    ),
    Conversation(
        "not-thinking",
        [{"role": "user", "content": GREETING}],
        GREETING_ANSWER,
        chat_template_kwargs=THINKING_OFF,
    ),
)

# Small, but every layer type and feature of the real model is present.
FIXTURE_CONFIG_OVERRIDES: dict[str, Any] = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "sliding_window": 32,
    "max_position_embeddings": 4096,
}
# How the tests and the demo serve the fixture (its prompts need more than 512 tokens).
SERVE_ARGS = (
    "--max-model-len",
    "1024",
    "--enable-auto-tool-choice",
    "--tool-call-parser",
    "spark25",
)
SEED = 20261129
MAX_STEPS = 1500
LEARNING_RATE = 3e-3


def default_cache_dir() -> Path:
    root = os.environ.get("SPARK2_5_FIXTURE_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"),
        "vllm-spark2_5-plugin",
        "fixtures",
    )
    return Path(root)


def inputs_hash() -> str:
    """Hash of everything that determines the trained fixture."""
    from importlib import resources

    import spark2_5_dev.checkpoints as checkpoints
    import spark2_5_dev.reference as reference
    import spark2_5_dev.tools as tools

    digest = hashlib.sha256()
    for source in (__file__, reference.__file__, checkpoints.__file__, tools.__file__):
        digest.update(Path(source).read_bytes())
    digest.update(resources.files("spark2_5_dev").joinpath("chat_template.jinja").read_bytes())
    return digest.hexdigest()[:16]


def _as_vllm_renders(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` with tool-call arguments decoded, as vLLM hands them to templates."""
    rendered = json.loads(json.dumps(messages))
    for message in rendered:
        for call in message.get("tool_calls") or []:
            call["function"]["arguments"] = json.loads(call["function"]["arguments"])
    return rendered


def _encode(tokenizer: Any, conversation: Conversation) -> tuple[list[int], list[int]]:
    prompt = tokenizer.apply_chat_template(
        _as_vllm_renders(conversation.messages),
        tools=conversation.tools or None,
        add_generation_prompt=True,
        tokenize=False,
        **conversation.chat_template_kwargs,
    )
    prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
    reply_ids = tokenizer.encode(conversation.reply + tokenizer.eos_token, add_special_tokens=False)
    return prompt_ids, reply_ids


def _reproduces_all(model: Any, examples: list[tuple[list[int], list[int]]]) -> bool:
    import torch

    for dtype in (torch.float32, torch.bfloat16):
        model.to(dtype)
        try:
            for prompt_ids, reply_ids in examples:
                tokens, _ = model.generate(prompt_ids, len(reply_ids))
                if tokens != reply_ids:
                    return False
        finally:
            model.to(torch.float32)
    return True


@contextlib.contextmanager
def _one_intra_op_thread() -> Iterator[None]:
    """Run torch on one thread: the tiny model gains little from a second, and on a
    busy 2-core machine a 2-thread team waits at every op for a descheduled
    thread (training was measured 30 to 60 times slower beside other suites)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def train(out_dir: Path, log: Any = print) -> Path:
    """Train the fixture into ``out_dir`` (created); raise if it does not converge."""
    with _one_intra_op_thread():
        return _train(out_dir, log)


def _train(out_dir: Path, log: Any) -> Path:
    import torch
    from transformers import AutoTokenizer

    from spark2_5_dev.checkpoints import (
        random_spark2_5,
        save_checkpoint,
        spark2_5_config_dict,
        write_tokenizer,
    )

    torch.manual_seed(SEED)
    config = spark2_5_config_dict(**FIXTURE_CONFIG_OVERRIDES)
    with tempfile.TemporaryDirectory() as tokenizer_dir:
        write_tokenizer(tokenizer_dir)
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    examples = [_encode(tokenizer, c) for c in CONVERSATIONS]

    length = max(len(p) + len(r) for p, r in examples)
    inputs = torch.full((len(examples), length), config["pad_token_id"])
    targets = torch.full((len(examples), length), -100)
    for row, (prompt_ids, reply_ids) in enumerate(examples):
        sequence = prompt_ids + reply_ids
        inputs[row, : len(sequence)] = torch.tensor(sequence)
        # Position t predicts token t + 1; learn only the reply.
        targets[row, len(prompt_ids) - 1 : len(sequence) - 1] = torch.tensor(reply_ids)

    model = random_spark2_5(config, seed=SEED, std=0.02)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, weight_decay=0.0)
    started = time.monotonic()
    for step in range(1, MAX_STEPS + 1):
        logits = model(inputs)
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-100
        )
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 50 == 0:
            log(f"fixture: step {step} loss {loss.item():.5f} ({time.monotonic() - started:.0f}s)")
            if loss.item() < 1e-3 and _reproduces_all(model.eval(), examples):
                break
            model.train()
    else:
        raise RuntimeError(f"the fixture did not converge in {MAX_STEPS} steps (loss {loss:.4f})")

    save_checkpoint(model, config, out_dir)
    (out_dir / "fixture.json").write_text(
        json.dumps(
            {
                "inputs_hash": inputs_hash(),
                "seed": SEED,
                "steps": step,
                "final_loss": loss.item(),
                "train_seconds": round(time.monotonic() - started, 1),
                "conversations": [c.name for c in CONVERSATIONS],
                "torch": torch.__version__,
            },
            indent=2,
        )
        + "\n"
    )
    return out_dir


def build_fixture(cache_dir: Path | None = None, log: Any = print) -> Path:
    """The trained fixture checkpoint, trained now only if not cached."""
    target = (cache_dir or default_cache_dir()) / f"spark2_5-chat-{inputs_hash()}"
    if (target / "fixture.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=target.parent))
    try:
        train(staging, log)
        staging.rename(target)  # atomic: a half-trained model is never cached
    except OSError:
        if not (target / "fixture.json").exists():  # not a concurrent builder
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def main() -> None:
    parser = argparse.ArgumentParser(
        prog=f"python -m {__spec__.name}",
        description="Build (or find) the trained Spark2_5 fixture.",
    )
    parser.add_argument("--cache-dir", type=Path, help="default: $SPARK2_5_FIXTURE_CACHE")
    args = parser.parse_args()
    print(build_fixture(args.cache_dir))


if __name__ == "__main__":
    main()
