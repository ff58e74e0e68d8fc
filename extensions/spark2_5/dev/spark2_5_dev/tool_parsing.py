"""Helpers for the ``spark25`` tool-parser tests: real vLLM requests, tokenizer and
parser registry, and drivers that read a parser's output the way a client does."""

from __future__ import annotations

import inspect
import itertools
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spark2_5_dev import tools
from spark2_5_dev.checkpoints import write_tokenizer
from spark2_5_dev.tools import with_parameters
from vllm_spark2_5_plugin import _registration

# The fixture's get_weather with one more parameter type, city alone required.
WEATHER_TOOL = with_parameters(
    tools.WEATHER_TOOL,
    {
        "city": {"type": "string"},
        "days": {"type": "integer"},
        "metric": {"type": "boolean"},
    },
    required=("city",),
)
TYPED_TOOL = {
    "type": "function",
    "function": {
        "name": "typed",
        "parameters": {
            "type": "object",
            "properties": {
                "text": {"type": "string"},
                "count": {"type": "integer"},
                "ratio": {"type": "number"},
                "flag": {"type": "boolean"},
                "options": {"type": "object"},
                "items": {"type": "array"},
                "maybe_count": {"type": ["integer", "null"]},
                "maybe_text": {"type": ["string", "null"]},
                "nullable_text": {"type": "string", "nullable": True},
                "choice": {"enum": ["a", "b", 3]},
                "either": {"anyOf": [{"type": "integer"}, {"type": "boolean"}]},
                "untyped": {"description": "no type given"},
            },
        },
    },
}
TOOLS = [WEATHER_TOOL, TYPED_TOOL]


def load_tokenizer(directory: Path) -> Any:
    """vLLM's tokenizer for the tiny checkpoints (Spark2_5's tags are special tokens)."""
    from vllm.tokenizers import get_tokenizer

    write_tokenizer(directory)
    return get_tokenizer(str(directory))


def register_spark25() -> None:
    """Register the parser as the enabled carrier does (lazily, by import path, with
    its serving-layer hooks), even where a registration stood down before."""
    _registration._register_tool_parser(_registration.RegistrationReport(override=True))


def serving_parser_cls(tokenizer: Any, reasoning_parser: str | None = None) -> Any:
    """vLLM's serving-layer ``Parser`` class around spark25, as ``vllm serve`` builds it.

    ``tokenizer`` (checked against the composition at startup) is passed where
    ``get_parser`` takes it; releases before 0.32 have no such check.
    """
    from vllm.parser.parser_manager import ParserManager

    register_spark25()
    validation = (
        {"tokenizer": tokenizer}
        if "tokenizer" in inspect.signature(ParserManager.get_parser).parameters
        else {}
    )
    return ParserManager.get_parser(
        tool_parser_name=_registration.TOOL_PARSER_NAME,
        reasoning_parser_name=reasoning_parser,
        enable_auto_tools=True,
        **validation,
    )


def chat_request(tools: Sequence[dict] | None = TOOLS, **fields: Any) -> Any:
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    return ChatCompletionRequest(
        model="tiny",
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        tools=list(tools) if tools is not None else None,
        **fields,
    )


@dataclass
class Parsed:
    """What a client ends up with: content, and (name, arguments) per call."""

    content: str | None
    calls: list[tuple[str, str]] = field(default_factory=list)


def non_streaming(parser: Any, text: str, request: Any) -> Parsed:
    result = parser.extract_tool_calls(text, request)
    calls = [(call.function.name, call.function.arguments) for call in result.tool_calls]
    assert result.tools_called == bool(calls)
    return Parsed(result.content, calls)


def stream_agrees(streamed: Parsed, whole: Parsed) -> bool:
    """Whether a stream of an output agrees with its non-streamed result: the same
    content and calls, except for a call the output ends inside, which streamed is
    a call as far as written (never JSON: its brace closes with the call) and not
    streamed is its text, verbatim, at the end of the content."""
    if streamed == whole:
        return True
    if streamed.calls[:-1] != whole.calls or len(streamed.calls) != len(whole.calls) + 1:
        return False
    name, arguments = streamed.calls[-1]
    shown, content = streamed.content or "", whole.content or ""
    block = content[len(shown) :]
    return (
        content.startswith(shown)
        and block.startswith("<tool_call>")
        and name in block
        and not is_json(arguments)
    )


def is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def accumulate(deltas: Iterable[Any]) -> Parsed:
    """Fold streamed ``DeltaMessage``s the way an OpenAI client does, checking the
    stream's shape on the way: each call starts with its id and name."""
    content: list[str] = []
    names: dict[int, str] = {}
    arguments: dict[int, list[str]] = {}
    for delta in deltas:
        if delta is None:
            continue
        if delta.content:
            content.append(delta.content)
        for call in delta.tool_calls:
            if call.index not in names:
                assert call.id and call.function.name, f"call {call.index} starts without id/name"
                names[call.index] = call.function.name
                arguments[call.index] = []
            else:
                assert call.id is None and call.function.name is None
            arguments[call.index].append(call.function.arguments or "")
    assert sorted(names) == list(range(len(names)))
    calls = [(names[index], "".join(arguments[index])) for index in sorted(names)]
    return Parsed("".join(content) or None, calls)


def stream_tool_parser(parser: Any, deltas: Iterable[str], request: Any) -> Parsed:
    """Drive ``extract_tool_calls_streaming`` as vLLM drives an engine-based parser
    (bare deltas), then end the stream as vLLM does (``finish_streaming``)."""

    def messages() -> Iterable[Any]:
        for delta in deltas:
            yield parser.extract_tool_calls_streaming("", delta, delta, [], [], [], request)
        yield parser.finish_streaming()

    return accumulate(messages())


def stream_as_text_so_far(parser: Any, deltas: Iterable[str], request: Any) -> Parsed:
    """Drive ``extract_tool_calls_streaming`` as vLLM 0.23's server and vLLM's own parser
    tests do: the text so far as ``previous_text``, and no ``finish_streaming``."""

    def messages() -> Iterable[Any]:
        previous = ""
        for delta in deltas:
            yield parser.extract_tool_calls_streaming(
                previous, previous + delta, delta, [], [], [], request
            )
            previous += delta

    return accumulate(messages())


def serving_parser_deltas(
    parser: Any, tokenizer: Any, text: str, request: Any, prompt_ids: Sequence[int] = ()
) -> list[Any]:
    """Feed ``text`` to a serving-layer ``Parser`` one token at a time, as vLLM's
    server does (tags are single special tokens), ending with ``finished=True``."""
    token_ids = tokenizer.encode(text, add_special_tokens=False)
    return [
        parser.parse_delta(
            tokenizer.decode([token], skip_special_tokens=False),
            [token],
            request,
            prompt_token_ids=list(prompt_ids),
            finished=position == len(token_ids) - 1,
        )
        for position, token in enumerate(token_ids)
    ]


def parse_both_ways(
    tokenizer: Any, text: str, request: Any, cuts: Iterable[int] | None = None
) -> Parsed:
    """``spark25``'s non-streaming result for ``text``, checked equal to a stream of the
    same text (one character per delta unless ``cuts`` are given)."""
    from vllm_spark2_5_plugin.spark2_5_tool_parser import Spark25ToolParser

    expected = non_streaming(Spark25ToolParser(tokenizer), text, request)
    deltas = list(text) if cuts is None else split_at(text, cuts)
    assert stream_agrees(
        stream_tool_parser(Spark25ToolParser(tokenizer), deltas, request), expected
    )
    return expected


def compact(value: Any) -> str:
    """``value`` as JSON the way ``spark25`` writes arguments: no spaces, non-ASCII kept."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def split_at(text: str, cuts: Iterable[int]) -> list[str]:
    bounds = [0, *sorted(set(cuts)), len(text)]
    return [text[start:end] for start, end in itertools.pairwise(bounds) if end > start]


def arguments(parsed: Parsed) -> list[tuple[str, Any]]:
    return [(name, json.loads(args)) for name, args in parsed.calls]
