"""Hostile model output for ``spark25``: huge digit runs, deep nesting, exotic
numbers, long tool names. The parser runs in the API server's event loop, so it
must never raise (a 500), never stall every client on one value, never round a
number the model wrote, and stream exactly what it returns without streaming,
however the output is cut."""

from __future__ import annotations

import json

import pytest
from tool_parser_support import (
    TOOLS,
    TYPED_TOOL,
    Parsed,
    chat_request,
    load_tokenizer,
    non_streaming,
    split_at,
    stream_tool_parser,
)

from vllm_spark2_5_plugin import compat
from vllm_spark2_5_plugin.spark2_5_tool_parser import (
    MAX_IDENTIFIER_CHARS,
    MAX_INTEGER_DIGITS,
    MAX_JSON_DEPTH,
    Spark25ToolParser,
    schema_types,
    value_json,
)

TYPED = TYPED_TOOL["function"]["parameters"]["properties"]
REQUEST = chat_request()


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return load_tokenizer(tmp_path_factory.mktemp("tokenizer"))


def call_text(name: str, pairs: list[tuple[str, str]], newline: bool = False) -> str:
    sep = "\n" if newline else ""
    body = "".join(f"<arg_key>{k}</arg_key>{sep}<arg_value>{v}</arg_value>{sep}" for k, v in pairs)
    return f"<tool_call>{name}{sep}{body}</tool_call>"


def parse_both_ways(tokenizer, text: str, request=REQUEST, cuts=None) -> Parsed:
    """The non-streaming result, checked equal to a stream of the same text (one
    character per delta unless ``cuts`` are given)."""
    expected = non_streaming(Spark25ToolParser(tokenizer), text, request)
    deltas = list(text) if cuts is None else split_at(text, cuts)
    assert stream_tool_parser(Spark25ToolParser(tokenizer), deltas, request) == expected
    return expected


def typed_arguments(tokenizer, key: str, value: str) -> str:
    parsed = parse_both_ways(tokenizer, call_text("typed", [(key, value)]))
    assert parsed.content is None and len(parsed.calls) == 1
    return parsed.calls[0][1]


def compact(value) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


NUMERIC_KEYS = ["count", "ratio", "maybe_count", "either", "choice"]


# --- 1. digit runs beyond Python's int-string limit ------------------------------------


@pytest.mark.parametrize("key", [*NUMERIC_KEYS, "options", "items"])
def test_a_digit_run_longer_than_an_integer_may_be_stays_the_text(tokenizer, key):
    """Python refuses to read an integer of more than 4,300 digits; the parser once
    raised that ValueError, streamed and not. Now such a value is the string."""
    digits = "9" * (MAX_INTEGER_DIGITS + 1)
    assert typed_arguments(tokenizer, key, digits) == compact({key: digits})
    assert typed_arguments(tokenizer, key, f"[{digits}]") == compact({key: f"[{digits}]"})


@pytest.mark.parametrize("key", ["count", "ratio", "maybe_count"])
def test_the_longest_integer_is_written_out_exactly(tokenizer, key):
    digits = "-" + "9" * MAX_INTEGER_DIGITS
    arguments = typed_arguments(tokenizer, key, f" {digits}\n")
    assert arguments == "{" + compact(key) + ":" + digits + "}"
    assert json.loads(arguments) == {key: int(digits)}  # Python's default limit reads it


# --- 2. deep nesting -----------------------------------------------------------------


@pytest.mark.parametrize("key", ["options", "items", "count", "ratio", "maybe_count"])
@pytest.mark.parametrize(
    "value",
    ["[" * 5000, "[" * 5000 + "]" * 5000, '{"a":' * 5000 + "1" + "}" * 5000],
    ids=["unclosed", "arrays", "objects"],
)
def test_json_nested_too_deep_stays_the_text(tokenizer, key, value):
    """5,000 levels once raised RecursionError, which the JSON fallback did not catch."""
    assert typed_arguments(tokenizer, key, value) == compact({key: value})


@pytest.mark.parametrize(
    ("key", "open_", "close"), [("items", "[", "]"), ("options", '{"a":', "}")]
)
def test_nesting_is_limited_to_max_json_depth_levels(tokenizer, key, open_, close):
    deepest = open_ * MAX_JSON_DEPTH + "1" + close * MAX_JSON_DEPTH
    assert typed_arguments(tokenizer, key, deepest) == compact({key: json.loads(deepest)})
    deeper = open_ + deepest + close
    assert typed_arguments(tokenizer, key, deeper) == compact({key: deeper})
    empty = "[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1)
    assert value_json(empty, TYPED["items"]) == compact(empty)


@pytest.mark.parametrize("key", ["options", "items", "count"])
def test_json_with_an_unpaired_surrogate_escape_stays_the_text(tokenizer, key):
    """JSON reads "\\ud800" as a lone surrogate, which no response can encode: the
    server would fail to send the call. A pair reads as the character it encodes."""
    for value in ('{"a": "\\ud800"}', '["\\udfff", 1]', '"\\ud83d"'):
        arguments = typed_arguments(tokenizer, key, value)
        assert arguments == compact({key: value})
        arguments.encode("utf-8")
    assert value_json('{"a": ["\\ud83d\\ude00"]}', TYPED["options"]) == '{"a":["😀"]}'


def test_a_deeply_nested_schema_does_not_break_conversion():
    schema = {"type": "integer"}
    for _ in range(5000):
        schema = {"anyOf": [schema, {"type": "null"}]}
    assert schema_types(schema) == {"integer", "null"}
    assert value_json(" 5 ", schema) == "5"


# --- 3. conversion time is linear in the value's length --------------------------------


@pytest.mark.timeout(120)
@pytest.mark.parametrize("key", ["count", "ratio", "either", "options"])
def test_a_long_almost_number_does_not_stall_the_parser(tokenizer, key):
    """Not a speed measurement (benchmarks/bench_parser.py has those): the number regex
    once backtracked quadratically, 5 s at 10,000 digits, so 200,000 digits took about
    half an hour; linear conversion takes milliseconds. The timeout catches a hang."""
    value = "1" * 200_000 + "x"
    assert typed_arguments(tokenizer, key, value) == compact({key: value})


# --- 4. numbers are never rounded ------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "raw", "expected"),
    [
        # An integer parameter gets the exact integer, never a float's rounding.
        ("count", "1e23", "100000000000000000000000"),
        ("count", "9007199254740993.0", "9007199254740993"),
        ("count", "9007199254740993", "9007199254740993"),
        ("count", "1.5e1", "15"),
        ("count", "1200e-2", "12"),
        ("count", "0.0001e4", "1"),
        ("count", "-0", "0"),
        ("count", "-0.0e5", "0"),
        ("count", "+7", "7"),
        ("count", "007", "7"),
        ("count", "1e308", "1" + "0" * 308),
        ("count", "12e307", "12" + "0" * 307),
        # Not an exact integer: the JSON the text spells if that reads back exactly,
        # else the text.
        ("count", "3.5", "3.5"),
        ("count", "3.50", "3.5"),
        ("count", "9007199254740993.5", '"9007199254740993.5"'),
        ("count", "1e309", '"1e309"'),
        ("count", "1e-400", '"1e-400"'),
        ("count", "1e" + "9" * 5000, compact("1e" + "9" * 5000)),
        # ASCII digits only; no NaN, Infinity, hex or separators.
        ("count", "٣", '"٣"'),
        ("count", "３", '"３"'),
        ("count", "1_000", '"1_000"'),
        ("count", "0x1F", '"0x1F"'),
        ("count", "1 000", '"1 000"'),
        ("count", "Infinity", '"Infinity"'),
        ("count", "-NaN", '"-NaN"'),
        ("count", "1e", '"1e"'),
        ("count", ".", '"."'),
        # A number parameter keeps the model's literal when a float would round it.
        ("ratio", "0.25", "0.25"),
        ("ratio", "+1.50", "1.5"),
        ("ratio", "-1e-3", "-0.001"),
        ("ratio", ".5", "0.5"),
        ("ratio", "9007199254740993", "9007199254740993"),
        ("ratio", "9007199254740993.5", "9007199254740993.5"),
        ("ratio", "0.1000000000000000000001", "0.1000000000000000000001"),
        ("ratio", "-00.5E-400", "-0.5E-400"),
        ("ratio", "1e-" + "9" * 5000, "1e-" + "9" * 5000),
        ("ratio", "1e400", '"1e400"'),
        ("ratio", "-1e" + "9" * 5000, compact("-1e" + "9" * 5000)),
        # Inside objects and arrays too: a value a float would round stays the text.
        (
            "options",
            '{"x": 1.5, "n": 123456789012345678901234}',
            '{"x":1.5,"n":123456789012345678901234}',
        ),
        ("options", '{"x": 0.1000000000000000000001}', compact('{"x": 0.1000000000000000000001}')),
        ("items", "[1e-400]", compact("[1e-400]")),
        ("items", "[1e400]", compact("[1e400]")),
    ],
)
def test_numbers_are_exact_or_stay_the_text(key, raw, expected):
    assert value_json(raw, TYPED[key]) == expected


def test_exact_numbers_end_to_end(tokenizer):
    pairs = [("count", "1e23"), ("ratio", "9007199254740993.5"), ("maybe_count", "2.0")]
    parsed = parse_both_ways(tokenizer, call_text("typed", pairs, newline=True))
    assert parsed.calls == [
        ("typed", '{"count":100000000000000000000000,"ratio":9007199254740993.5,"maybe_count":2}')
    ]


# --- 5. long tool names: streamed as not streamed ---------------------------------------


def tool_named(name: str) -> dict:
    parameters = {"type": "object", "properties": {"n": {"type": "integer"}}}
    return {"type": "function", "function": {"name": name, "parameters": parameters}}


@pytest.mark.parametrize("length", [MAX_IDENTIFIER_CHARS, MAX_IDENTIFIER_CHARS + 1, 3000])
@pytest.mark.parametrize("newline", [False, True], ids=["compact", "newline"])
def test_a_declared_tool_with_a_long_name_is_a_call_streamed_or_not(tokenizer, length, newline):
    """A 257-character tool name once gave a call without streaming and content when
    streamed one character at a time (the newline form)."""
    name = ("get_" + "long_" * length)[:length]
    request = chat_request(tools=[*TOOLS, tool_named(name)])
    text = call_text(name, [("n", "5")], newline)
    assert parse_both_ways(tokenizer, text, request) == Parsed(None, [(name, '{"n":5}')])


@pytest.mark.parametrize("newline", [False, True], ids=["compact", "newline"])
def test_a_name_longer_than_every_declared_name_is_content_either_way(tokenizer, newline):
    declared = "t" * 400
    request = chat_request(tools=[*TOOLS, tool_named(declared)])
    for name in (declared + "t", "x" * (MAX_IDENTIFIER_CHARS + 1)):
        text = call_text(name, [("n", "5")], newline) + " after"
        assert parse_both_ways(tokenizer, text, request) == Parsed(text)


def test_function_tool_names_with_and_without_vllms_helper(monkeypatch):
    import vllm.tool_parsers.utils as utils

    request = chat_request(tools=[*TOOLS, tool_named("x" * 300)])
    names = ["get_weather", "typed", "x" * 300]
    assert compat.function_tool_names(request.tools) == names
    assert compat.function_tool_names(None) == []
    monkeypatch.delattr(utils, "get_function_tools")
    assert compat.function_tool_names(request.tools) == names
