"""Streaming throughput of the ``spark25`` tool-call parser against vLLM's ``glm45``.

Both parsers read the same long model output (prose, many short calls and some
calls that write a multi-line file) through their ``ToolParser`` streaming API,
the way vLLM's serving layer drives them: one delta at a time, then
``finish_streaming``. Two delta sizes:

* ``1-char``: every character is its own delta, tags included, no token ids;
* ``token``: each tag is one delta with its special-token id (as with the real
  tokenizer), other text comes in 4-character pieces (about one BPE token).

Printed: throughput of each parser and their ratio, then the time for 1x, 2x
and 4x the output (the same output repeated), divided by the 1x time times the
multiple (1.00 is exactly linear growth). Every run is checked: the streamed calls
must be the ones the generator wrote.

Then ``spark25``'s cost per character of one argument value as the value grows
from 1,000 to 64,000 characters: converting hostile values by schema type (a
digit run, digits ending in a letter, a long fraction or exponent, JSON arrays
of integers and of floats, endlessly nested JSON) and streaming a whole call
with such a value one character per delta. Each size's time per character is
also divided by the 1,000-character one: 1.00 is the same cost per character
at every size, i.e. linear time.

Times are CPU seconds of this process
(``time.process_time``, so other jobs on a shared machine distort them less than
wall-clock time), the best of ``--repeats`` runs, with Python's cyclic garbage
collector paused as ``timeit`` pauses it.

    .venv/bin/python extensions/spark2_5/benchmarks/bench_parser.py
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import random
import tempfile
import time
from collections.abc import Callable, Sequence

import common  # noqa: F401  (puts the dev helpers on the path)
import vllm
from transformers import AutoTokenizer
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

from spark2_5_dev.checkpoints import write_tokenizer
from vllm_spark2_5_plugin import compat
from vllm_spark2_5_plugin.spark2_5_tool_parser import DeltaMessage, Spark25ToolParser, value_json

TAGS = ("<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>")
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "parameters": {
                "type": "object",
                "properties": {key: {"type": kind} for key, kind in properties.items()},
            },
        },
    }
    for name, properties in {
        "get_weather": {"city": "string", "days": "integer"},
        "search": {"query": "string", "limit": "integer", "exact": "boolean"},
        "write_file": {"path": "string", "content": "string"},
    }.items()
]
WORDS = ("the", "model", "reads", "a", "file", "and", "calls", "a", "tool", "with", "typed", "args")


def newline_call(name: str, pairs: Sequence[tuple[str, str]]) -> str:
    body = "".join(f"<arg_key>{k}</arg_key>\n<arg_value>{v}</arg_value>\n" for k, v in pairs)
    return f"<tool_call>{name}\n{body}</tool_call>"


def model_output(size: int, file_calls: float, seed: int = 0) -> tuple[str, int]:
    """About ``size`` characters of prose and calls; returns the text and its call count.

    A ``file_calls`` share of the calls write a 1-3 KB multi-line file (code with
    ``<`` in it); the others are short weather and search calls."""
    rng = random.Random(seed)
    parts: list[str] = []
    calls = length = 0
    while length < size:
        prose = " ".join(rng.choice(WORDS) for _ in range(rng.randint(10, 60))) + ".\n"
        kind = rng.random()
        if kind < file_calls:
            lines = [
                f"    if x{i} < limit: total += x{i}  # 東京" for i in range(rng.randint(25, 75))
            ]
            call = newline_call(
                "write_file", [("path", f"src/m{calls}.py"), ("content", "\n".join(lines))]
            )
        elif rng.random() < 0.5:
            call = newline_call(
                "get_weather", [("city", rng.choice(["Paris", "合肥"])), ("days", "3")]
            )
        else:
            query = " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 8)))
            call = newline_call("search", [("query", query), ("limit", "10"), ("exact", "false")])
        parts += [prose, call, "\n"]
        length += len(prose) + len(call) + 1
        calls += 1
    return "".join(parts), calls


def char_deltas(text: str, tokenizer) -> list[tuple[str, list[int]]]:
    return [(char, []) for char in text]


def token_deltas(text: str, tokenizer) -> list[tuple[str, list[int]]]:
    deltas: list[tuple[str, list[int]]] = []
    position = 0
    while position < len(text):
        tag = next((tag for tag in TAGS if text.startswith(tag, position)), None)
        if tag is not None:
            piece = tag
        else:
            end = text.find("<", position + 1, position + 4)
            piece = text[position : end if end != -1 else position + 4]
        deltas.append((piece, tokenizer.encode(piece, add_special_tokens=False)))
        position += len(piece)
    return deltas


def make_glm45(tokenizer, request):
    parser = compat.tool_parser_manager().get_tool_parser("glm45")(tokenizer, request.tools)
    # What the serving layer sets when no reasoning parser is configured.
    parser.skip_reasoning_parsing = True
    return parser


def make_spark25(tokenizer, request):
    return Spark25ToolParser(tokenizer, request.tools)


PARSERS: dict[str, Callable] = {"spark25": make_spark25, "glm45": make_glm45}


def stream_seconds(make_parser, tokenizer, request, deltas, expected_calls: int) -> float:
    parser = make_parser(tokenizer, request)
    stream = parser.extract_tool_calls_streaming
    names = 0
    # As timeit does: the cyclic collector would otherwise time this script's own
    # list of deltas, which vLLM never holds.
    gc.collect()
    gc.disable()
    try:
        start = time.process_time()
        for text, ids in deltas:
            message = stream("", text, text, [], ids, ids, request)
            if message is not None and message.tool_calls:
                names += sum(1 for call in message.tool_calls if call.function.name)
        final = parser.finish_streaming()
        elapsed = time.process_time() - start
    finally:
        gc.enable()
    if final is not None and final.tool_calls:
        names += sum(1 for call in final.tool_calls if call.function.name)
    if names != expected_calls:
        raise AssertionError(
            f"{type(parser).__name__} streamed {names} calls, not {expected_calls}"
        )
    return elapsed


def delta_message_seconds(count: int) -> float:
    """What building ``count`` content-only ``DeltaMessage``s costs: the floor every
    parser pays when each delta is text to stream."""
    gc.collect()
    gc.disable()
    try:
        start = time.process_time()
        for _ in range(count):
            DeltaMessage(content="x")
        return time.process_time() - start
    finally:
        gc.enable()


# Hostile argument values of ``size`` characters, with the schema they are read by.
VALUE_KINDS: dict[str, tuple[dict, Callable[[int], str]]] = {
    "integer: a digit run": ({"type": "integer"}, lambda size: "9" * size),
    "integer: digits, then a letter": ({"type": "integer"}, lambda size: "1" * (size - 1) + "x"),
    "number: a long fraction": ({"type": "number"}, lambda size: "0." + "1" * (size - 2)),
    "number: a long exponent": ({"type": "number"}, lambda size: "1e-" + "9" * (size - 3)),
    "array: JSON integers": ({"type": "array"}, lambda size: "[" + "1," * (size // 2 - 1) + "1]"),
    # 1.50 is not how Python writes 1.5: each float takes the exact comparison.
    "array: JSON floats": (
        {"type": "array"},
        lambda size: "[" + "1.50," * (size // 5 - 1) + "1.5]",
    ),
    "array: unclosed nesting": ({"type": "array"}, lambda size: "[" * size),
}
VALUE_SIZES = (1_000, 4_000, 16_000, 64_000)


def conversion_seconds(schema: dict, value: str, runs: int) -> float:
    """CPU time of ``runs`` conversions of ``value``."""
    gc.collect()
    gc.disable()
    try:
        start = time.process_time()
        for _ in range(runs):
            value_json(value, schema)
        return time.process_time() - start
    finally:
        gc.enable()


def value_call(size: int) -> str:
    """A call whose integer value is ``size`` characters of digits ending in a letter."""
    return newline_call("get_weather", [("days", "1" * (size - 1) + "x")])


def value_seconds_per_char(repeats: int, tokenizer, request) -> dict[str, list[float]]:
    """Per value kind, CPU seconds per character at each of ``VALUE_SIZES``."""
    rows = {}
    for name, (schema, make) in VALUE_KINDS.items():
        rows[name] = []
        for size in VALUE_SIZES:
            runs = 256_000 // size  # about 256,000 characters per timing
            seconds = best_of(repeats, conversion_seconds, schema, make(size), runs)
            rows[name].append(seconds / (runs * size))
    rows["a call streamed, 1-char deltas"] = []
    for size in VALUE_SIZES:
        deltas = char_deltas(value_call(size), tokenizer)
        seconds = best_of(repeats, stream_seconds, make_spark25, tokenizer, request, deltas, 1)
        rows["a call streamed, 1-char deltas"].append(seconds / len(deltas))
    return rows


def print_value_scaling(repeats: int, tokenizer, request) -> None:
    sizes = [f"{size // 1000}K" for size in VALUE_SIZES]
    header = ["value (schema)", *(f"{s} µs/char" for s in sizes), *(f"{s} / 1K" for s in sizes[1:])]
    print("\n| " + " | ".join(header) + " |")
    print("|---" * len(header) + "|")
    for name, per_char in value_seconds_per_char(repeats, tokenizer, request).items():
        cells = [f"{seconds * 1e6:.3f}" for seconds in per_char]
        cells += [f"{seconds / per_char[0]:.2f}" for seconds in per_char[1:]]
        print(f"| {name} | " + " | ".join(cells) + " |")


def best_of(repeats: int, run: Callable[..., float], *args) -> float:
    return min(run(*args) for _ in range(repeats))


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            cpu = next(ln.split(":", 1)[1].strip() for ln in cpuinfo if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return (
        f"{cpu}, {os.cpu_count()} CPUs, Python {platform.python_version()}, vLLM {vllm.__version__}"
    )


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    cli.add_argument("--size", type=int, default=100_000, help="characters in the 1x output")
    cli.add_argument("--repeats", type=int, default=3, help="runs per timing; the best is kept")
    cli.add_argument(
        "--file-calls", type=float, default=0.1, help="share of calls that write a 1-3 KB file"
    )
    args = cli.parse_args()

    with tempfile.TemporaryDirectory() as directory:
        write_tokenizer(directory)
        tokenizer = AutoTokenizer.from_pretrained(directory)
    request = ChatCompletionRequest(
        model="tiny", messages=[{"role": "user", "content": "go"}], tools=TOOLS
    )
    text, calls = model_output(args.size, args.file_calls)
    print(f"machine: {machine()}")
    files = text.count("<tool_call>write_file")
    print(
        f"output: {len(text):,} characters, {calls} calls ({files} write a file), "
        f"best of {args.repeats} runs\n"
    )

    print("| deltas | spark25 | glm45 | spark25 speed-up |")
    print("|---|---|---|---|")
    for label, split in (("1-char", char_deltas), ("token", token_deltas)):
        deltas = split(text, tokenizer)
        seconds = {
            name: best_of(args.repeats, stream_seconds, make, tokenizer, request, deltas, calls)
            for name, make in PARSERS.items()
        }
        rates = {name: len(text) / s / 1e6 for name, s in seconds.items()}
        print(
            f"| {label} ({len(deltas):,} deltas) | {rates['spark25']:.2f} MB/s "
            f"({seconds['spark25'] * 1e6 / len(text):.2f} µs/char) | {rates['glm45']:.2f} MB/s "
            f"({seconds['glm45'] * 1e6 / len(text):.2f} µs/char) | "
            f"{seconds['glm45'] / seconds['spark25']:.1f}x |"
        )

    floor = best_of(args.repeats, delta_message_seconds, 100_000) * 10
    print(f"\nvLLM's DeltaMessage(content=...) alone: {floor:.2f} µs each")

    print("\n| parser, deltas | 1x | 2x | 4x | 2x / (2 * 1x) | 4x / (4 * 1x) |")
    print("|---|---|---|---|---|---|")
    for name, make in PARSERS.items():
        for label, split in (("1-char", char_deltas), ("token", token_deltas)):
            times = []
            for multiple in (1, 2, 4):
                # The same output repeated: k times the length, the same mix.
                deltas = split(text * multiple, tokenizer)
                n_calls = calls * multiple
                times.append(
                    best_of(args.repeats, stream_seconds, make, tokenizer, request, deltas, n_calls)
                )
            print(
                f"| {name}, {label} | {times[0]:.3f} s | {times[1]:.3f} s | {times[2]:.3f} s | "
                f"{times[1] / (2 * times[0]):.2f} | {times[2] / (4 * times[0]):.2f} |"
            )

    print_value_scaling(args.repeats, tokenizer, request)


if __name__ == "__main__":
    main()
