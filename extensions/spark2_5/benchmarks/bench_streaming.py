"""When a streamed call reaches the client: ``spark25``, an earlier ``spark25``, ``glm45``.

Token-delta replay: one model output (prose, short calls and calls that write a
1-3 KB file) goes through each parser's streaming API one
token-sized delta at a time, with the previous and current text and token ids
vLLM's serving layer passes, then ``finish_streaming``. For every call the
script finds the delta in which the model wrote the name's last character and
each argument value's first character, and the delta after which the client
holds the name and that value's first byte. Printed per parser:

* lag to the name and to each argument's first byte, in deltas (about tokens):
  0 is the same delta the model wrote it in;
* the share of each ``write_file`` ``content`` value the client holds before
  the model writes its ``</arg_value>``;
* microseconds per character spent inside the parser calls (wall clock, the
  best of ``--repeats`` runs).

Each parser runs in its own process. The earlier ``spark25`` is the carrier's
parser package at ``--baseline`` (a git ref of this repository), extracted with
``git archive``; every run checks that the streamed calls join to the calls the
model wrote.

    .venv/bin/python extensions/spark2_5/benchmarks/bench_streaming.py --baseline REF
"""

from __future__ import annotations

import bisect
import io
import json
import random
import re
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import common

from spark2_5_dev.checkpoints import write_tokenizer

PACKAGE_NAME = "vllm_spark2_5_plugin"
PACKAGE = f"src/{PACKAGE_NAME}"
CALL = re.compile(r"<tool_call>([^\n<]*)\n(.*?)</tool_call>", re.DOTALL)
PAIR = re.compile(r"<arg_key>(.*?)</arg_key>\n<arg_value>(.*?)</arg_value>", re.DOTALL)
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


def model_output(size: int, file_calls: float, seed: int = 0) -> str:
    """About ``size`` characters of prose and calls. A ``file_calls`` share of the
    calls write a 1-3 KB multi-line file (code with ``<`` in it); the others are
    short weather and search calls."""
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
    return "".join(parts)


def token_deltas(text: str, tokenizer) -> list[tuple[str, list[int]]]:
    """``text`` in about-token-sized deltas: each tag one delta with its special-token
    id (as with the real tokenizer), other text in pieces of up to 4 characters."""
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
    from vllm_spark2_5_plugin import compat

    parser = compat.tool_parser_manager().get_tool_parser("glm45")(tokenizer, request.tools)
    # What the serving layer sets when no reasoning parser is configured.
    parser.skip_reasoning_parsing = True
    return parser


def make_spark25(tokenizer, request):
    """``spark25`` from the carrier code this process imports (``--code`` or the tree's)."""
    from vllm_spark2_5_plugin.spark2_5_tool_parser import Spark25ToolParser

    return Spark25ToolParser(tokenizer, request.tools)


PARSERS: dict[str, Callable] = {"spark25": make_spark25, "glm45": make_glm45}


def written_calls(text: str) -> list[dict[str, Any]]:
    """Each call's name, its end and every value's first and closing character offset."""
    calls = []
    for call in CALL.finditer(text):
        values = {
            pair.group(1): (call.start(2) + pair.start(2), call.start(2) + pair.end(2))
            for pair in PAIR.finditer(call.group(2))
        }
        calls.append({"name": call.group(1), "name_end": call.end(1) - 1, "values": values})
    return calls


def replay(make_parser, tokenizer, request, deltas) -> tuple[list[dict], float]:
    """Per call index: the first delta holding its name and the arguments' length after
    every delta that added to them; and the CPU seconds inside the parser."""
    parser = make_parser(tokenizer, request)
    seen: dict[int, dict[str, Any]] = {}
    previous_text, previous_ids, inside = "", [], 0.0

    def take(position: int, message: Any) -> None:
        for call in (message.tool_calls if message is not None else None) or ():
            state = seen.setdefault(call.index, {"name_at": None, "arguments": "", "growth": []})
            if call.function is None:
                continue
            if call.function.name and state["name_at"] is None:
                state["name_at"] = position
                state["name"] = call.function.name
            if call.function.arguments:
                state["arguments"] += call.function.arguments
                state["growth"].append((position, len(state["arguments"])))

    for position, (delta_text, delta_ids) in enumerate(deltas):
        current_text, current_ids = previous_text + delta_text, previous_ids + delta_ids
        start = time.perf_counter()
        message = parser.extract_tool_calls_streaming(
            previous_text, current_text, delta_text, previous_ids, current_ids, delta_ids, request
        )
        inside += time.perf_counter() - start
        take(position, message)
        previous_text, previous_ids = current_text, current_ids
    finish = getattr(parser, "finish_streaming", None)
    if finish is not None:
        start = time.perf_counter()
        message = finish()
        inside += time.perf_counter() - start
        take(len(deltas), message)
    return [seen[index] for index in sorted(seen)], inside


def first_byte_offset(arguments: str, key: str) -> int:
    """Where the value of ``key`` starts in the arguments JSON (inside its quotes)."""
    start = arguments.index(json.dumps(key) + ":") + len(json.dumps(key)) + 1
    while arguments[start] == " ":
        start += 1
    return start + (arguments[start] == '"')


def delta_of(ends: list[int], char: int) -> int:
    """The delta that carries character ``char`` (``ends``: each delta's end offset)."""
    return bisect.bisect_right(ends, char)


def lags(text: str, deltas, streamed: list[dict]) -> dict[str, list[float]]:
    ends, total = [], 0
    for piece, _ in deltas:
        total += len(piece)
        ends.append(total)
    written = written_calls(text)
    if [call.get("name") for call in streamed] != [call["name"] for call in written]:
        raise AssertionError("the streamed calls are not the calls the model wrote")
    out: dict[str, list[float]] = {"name": [], "string value": [], "typed value": [], "share": []}
    for model, client in zip(written, streamed, strict=True):
        arguments = json.loads(client["arguments"])
        out["name"].append(client["name_at"] - delta_of(ends, model["name_end"]))
        for key, (first, close) in model["values"].items():
            offset = first_byte_offset(client["arguments"], key)
            arrived = next(at for at, length in client["growth"] if length > offset)
            kind = "string value" if isinstance(arguments[key], str) else "typed value"
            out[kind].append(arrived - delta_of(ends, first))
            if key == "content":
                closing = delta_of(ends, close)
                held = max((n for at, n in client["growth"] if at < closing), default=0)
                size = len(json.dumps(arguments[key], ensure_ascii=False)) - 2
                out["share"].append(min(max(held - offset, 0), size) / size)
    return out


def run_parser(name: str, size: int, repeats: int, file_calls: float = 0.1) -> dict[str, Any]:
    """One parser's figures (in this process, whose path picks the parser's code)."""
    from transformers import AutoTokenizer
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    with tempfile.TemporaryDirectory() as directory:
        write_tokenizer(directory)
        tokenizer = AutoTokenizer.from_pretrained(directory)
    request = ChatCompletionRequest(
        model="tiny", messages=[{"role": "user", "content": "go"}], tools=TOOLS
    )
    text = model_output(size, file_calls)
    deltas = token_deltas(text, tokenizer)
    make = PARSERS["glm45" if name == "glm45" else "spark25"]
    runs = [replay(make, tokenizer, request, deltas) for _ in range(repeats)]
    return {
        "characters": len(text),
        "deltas": len(deltas),
        "lags": lags(text, deltas, runs[0][0]),
        "us_per_char": min(seconds for _, seconds in runs) * 1e6 / len(text),
    }


def extract_baseline(ref: str, into: Path) -> Path:
    archive = subprocess.run(
        ["git", "-C", str(common.ROOT), "archive", "--format=tar", ref, PACKAGE],
        capture_output=True,
        check=True,
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into / "src"


def in_child(name: str, code: Path | None, size: int, repeats: int) -> dict[str, Any]:
    command = [sys.executable, __file__, "--child", name, "--size", str(size)]
    command += ["--repeats", str(repeats)] + (["--code", str(code)] if code else [])
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{name} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.splitlines()[-1])


def summary_rows(results: dict[str, dict[str, Any]]) -> list[list[Any]]:
    rows = []
    for label, result in results.items():
        lag = result["lags"]
        rows.append(
            [
                label,
                f"{statistics.median(lag['name']):.0f} / {max(lag['name'])}",
                f"{statistics.median(lag['string value']):.0f} / {max(lag['string value'])}",
                f"{statistics.median(lag['typed value']):.0f} / {max(lag['typed value'])}",
                f"{min(lag['share']):.3f} / {statistics.median(lag['share']):.3f}",
                result["us_per_char"],
            ]
        )
    return rows


def main() -> None:
    cli = common.base_parser(__doc__.split("\n", 1)[0])
    cli.add_argument("--baseline", required=True, help="git ref of the earlier spark25")
    cli.add_argument("--size", type=int, default=50_000, help="characters of model output")
    cli.add_argument("--repeats", type=int, default=3, help="timed runs; the best is kept")
    args = cli.parse_args()
    if args.quick:
        args.size, args.repeats = 5_000, 1
    record = common.Record("streaming", {"baseline": args.baseline, "size": args.size})
    with tempfile.TemporaryDirectory() as directory:
        baseline = extract_baseline(args.baseline, Path(directory))
        results = {
            "spark25": in_child("spark25", None, args.size, args.repeats),
            f"spark25 at {args.baseline}": in_child("spark25", baseline, args.size, args.repeats),
            "glm45": in_child("glm45", None, args.size, args.repeats),
        }
    first = next(iter(results.values()))
    print(f"output: {first['characters']:,} characters in {first['deltas']:,} deltas")
    headers = [
        "parser",
        "name lag (median / max)",
        "string value lag",
        "typed value lag",
        "content held at close (min / median)",
        "µs/char in the parser",
    ]
    print(common.table(headers, summary_rows(results)))
    record.data["results"] = results
    record.finish(args.out)


def child() -> None:
    cli = common.base_parser("one parser's replay")
    cli.add_argument("--child", required=True)
    cli.add_argument("--code", type=Path)
    cli.add_argument("--size", type=int, required=True)
    cli.add_argument("--repeats", type=int, required=True)
    args = cli.parse_args()
    if args.code is not None:
        sys.path.insert(0, str(args.code))
        # common's dev helpers imported the tree's carrier: forget it, import the baseline.
        for name in [name for name in sys.modules if name.split(".")[0] == PACKAGE_NAME]:
            del sys.modules[name]
        import vllm_spark2_5_plugin

        if not Path(vllm_spark2_5_plugin.__file__).is_relative_to(args.code):
            raise SystemExit(f"the baseline's parser was not imported from {args.code}")
    print(json.dumps(run_parser(args.child, args.size, args.repeats)))


if __name__ == "__main__":
    child() if "--child" in sys.argv else main()
