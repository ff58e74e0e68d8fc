"""Hostile model output for ``spark25``: huge digit runs, deep nesting, exotic
numbers, long tool names. The parser runs in the API server's event loop, so it
must never raise (a 500), never stall every client on one value, never round a
number the model wrote, and stream exactly what it returns without streaming,
however the output is cut."""

from __future__ import annotations

import json
from decimal import Decimal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spark2_5_dev.tool_parsing import (
    TOOLS,
    TYPED_TOOL,
    Parsed,
    chat_request,
    compact,
    parse_both_ways,
)
from vllm_spark2_5_plugin import compat
from vllm_spark2_5_plugin.spark2_5_tool_parser import (
    MAX_IDENTIFIER_CHARS,
    MAX_INTEGER_DIGITS,
    MAX_JSON_DEPTH,
    MAX_SCHEMA_DEPTH,
    check_tools,
    schema_types,
    value_json,
)

TYPED = TYPED_TOOL["function"]["parameters"]["properties"]
REQUEST = chat_request()


def call_text(name: str, pairs: list[tuple[str, str]], newline: bool = False) -> str:
    sep = "\n" if newline else ""
    body = "".join(f"<arg_key>{k}</arg_key>{sep}<arg_value>{v}</arg_value>{sep}" for k, v in pairs)
    return f"<tool_call>{name}{sep}{body}</tool_call>"


def typed_arguments(tokenizer, key: str, value: str) -> str:
    parsed = parse_both_ways(tokenizer, call_text("typed", [(key, value)]), REQUEST)
    assert parsed.content is None and len(parsed.calls) == 1
    return parsed.calls[0][1]


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
    """Not a speed measurement (bench_streaming.py times the parser): the number regex
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
    parsed = parse_both_ways(tokenizer, call_text("typed", pairs, newline=True), REQUEST)
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


def test_function_tools_with_and_without_vllms_helper(monkeypatch):
    import vllm.tool_parsers.utils as utils

    request = chat_request(tools=[*TOOLS, tool_named("x" * 300)])
    names = ["get_weather", "typed", "x" * 300]
    schemas = [tool["function"]["parameters"] for tool in [*TOOLS, tool_named("x")]]
    assert [name for name, _ in compat.function_tools(request.tools)] == names
    assert [schema for _, schema in compat.function_tools(request.tools)] == schemas
    assert compat.function_tools(None) == []
    monkeypatch.delattr(utils, "get_function_tools", raising=False)  # absent before 0.32
    assert [name for name, _ in compat.function_tools(request.tools)] == names
    assert [schema for _, schema in compat.function_tools(request.tools)] == schemas


# --- properties over hostile values ------------------------------------------------------


def hostile_settings(max_examples: int) -> settings:
    return settings(
        max_examples=max_examples,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )


runs = st.builds(
    lambda digit, length: digit * length,
    st.sampled_from("0159"),
    st.one_of(
        st.integers(0, 40),
        st.integers(MAX_INTEGER_DIGITS - 3, MAX_INTEGER_DIGITS + 3),
        st.integers(0, 20_000),
    ),
)
digits = st.one_of(st.text("0123456789", max_size=30), runs)
exponents = st.one_of(
    st.just(""),
    st.builds(
        lambda marker, sign, value: marker + sign + value,
        st.sampled_from("eE"),
        st.sampled_from(["", "+", "-"]),
        st.one_of(
            st.integers(0, 400).map(str),
            st.integers(0, 10**17).map(str),
            st.sampled_from(["0", "00023", "308", "309", "324", "325"]),
        ),
    ),
)
literals = st.builds(
    lambda sign, whole, point, fraction, exponent: sign + whole + point + fraction + exponent,
    st.sampled_from(["", "-", "+"]),
    digits,
    st.sampled_from(["", ".", "."]),
    st.one_of(st.just(""), digits),
    exponents,
)
exotic = st.sampled_from(
    [
        "-0",
        "+0",
        "-0.0",
        "0e0",
        "1e23",
        "9007199254740993",
        "9007199254740993.0",
        "1e400",
        "1e-400",
        "-1e308",
        "NaN",
        "nan",
        "-Infinity",
        "Infinity",
        "inf",
        "٣",
        "１２",
        "٣.٥",
        "1_000",
        "0x1F",
        "1 000",
        "--1",
        "+-1",
        "1e",
        "e5",
        ".",
        "-",
        "",
        "true",
        "null",
    ]
)
deep_json = st.builds(
    lambda brackets, depth, closed: (
        brackets[0] * depth + "1" + (brackets[1] * depth if closed else "")
    ),
    st.sampled_from([("[", "]"), ('{"a":', "}"), ('[{"a":', "}]")]),
    st.one_of(st.integers(0, 2 * MAX_JSON_DEPTH), st.integers(0, 6000)),
    st.booleans(),
)
json_texts = st.sampled_from(
    [
        '{"x": 1.5, "n": [1, -0, 2e3]}',
        '{"x": 0.1000000000000000000001}',
        "[1e400]",
        "[1e-400]",
        '{"a": NaN}',
        "[1, 2,]",
        '{"a": "\\ud800"}',
        "[]",
    ]
)
# Markup inside values is the streaming tests' subject; here values are plain.
# Model text is decoded from bytes, so it never holds a surrogate code point.
prose = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="<"), max_size=20)
spaces = st.sampled_from(["", " ", "\n", " \t\r\n", "\u00a0", "\u3000"])
values = st.builds(
    lambda before, value, after: before + value + after,
    spaces,
    st.one_of(literals, exotic, deep_json, json_texts, prose),
    spaces,
)
TYPED_KEYS = ["count", "ratio", "maybe_count", "either", "choice", "options", "items", "text"]


def check_exact(raw: str, value) -> None:
    """The argument is what the model wrote: the text itself, or exactly the value it
    spells (a number equal to its literal in decimal arithmetic, JSON equal to the
    JSON read with decimal numbers, a boolean or null as spelled)."""
    if value == raw and isinstance(value, str):
        return
    text = raw.strip()
    if isinstance(value, bool):
        assert text.lower() in ({"true", "1"} if value else {"false", "0"}), raw
    elif value is None:
        assert text.lower() == "null", raw
    elif isinstance(value, Decimal):
        assert value == Decimal(text), raw
    else:
        assert value == json.loads(text, parse_float=Decimal, parse_int=Decimal), raw


def refuse_constant(name: str) -> None:
    raise AssertionError(f"{name} in the arguments is not JSON")


def check_arguments(arguments: str, pairs: list[tuple[str, str]]) -> None:
    """Valid JSON that Python's ``json.loads`` reads as it is (no NaN/Infinity, no
    integer beyond its limit, nesting within its recursion limit) and the server can
    send (UTF-8), every value exact."""
    arguments.encode("utf-8")
    assert isinstance(json.loads(arguments, parse_constant=refuse_constant), dict)
    decoded = json.loads(arguments, parse_float=Decimal, parse_int=Decimal)
    assert list(decoded) == [key for key, _ in pairs]
    for key, raw in pairs:
        check_exact(raw, decoded[key])


@hostile_settings(1000)
@given(st.sampled_from(TYPED_KEYS), values)
def test_any_value_converts_to_exact_json(key, raw):
    arguments = "{" + compact(key) + ":" + value_json(raw, TYPED[key]) + "}"
    check_arguments(arguments, [(key, raw)])


name_stems = st.text(st.sampled_from("abcxyz_-.09名"), min_size=1, max_size=30)
tool_names = st.one_of(
    name_stems,
    st.builds(
        lambda stem, length: (stem * length)[:length],
        name_stems,
        st.integers(MAX_IDENTIFIER_CHARS - 8, 5 * MAX_IDENTIFIER_CHARS),
    ),
)


@st.composite
def hostile_outputs(draw):
    """Calls to a declared tool (one with a long name among them), to names a character
    longer or shorter than it, with hostile values, in either form, among prose."""
    long_name = draw(tool_names)
    names = ["typed", long_name, long_name + "x", long_name[:-1] or "y"]
    parts, calls = [], []
    for _ in range(draw(st.integers(1, 3))):
        parts.append(draw(st.sampled_from(["", "Sure. ", "x < y\n", "名前 "])))
        name = draw(st.sampled_from(names))
        keys = draw(st.lists(st.sampled_from(TYPED_KEYS), unique=True, max_size=3))
        pairs = [(key, draw(values)) for key in keys]
        parts.append(call_text(name, pairs, newline=draw(st.booleans())))
        if name in ("typed", long_name):
            calls.append((name, pairs))
    text = "".join(parts)
    # None: one character per delta.
    cuts = None if draw(st.booleans()) else draw(st.lists(st.integers(0, len(text)), max_size=40))
    return long_name, text, cuts, calls


@hostile_settings(300)
@given(hostile_outputs())
def test_hostile_output_streams_as_it_parses_and_keeps_every_value_exact(tokenizer, long_output):
    long_name, text, cuts, calls = long_output
    long_tool = tool_named(long_name)
    long_tool["function"]["parameters"] = TYPED_TOOL["function"]["parameters"]
    request = chat_request(tools=[*TOOLS, long_tool])
    parsed = parse_both_ways(tokenizer, text, request, cuts)
    assert [name for name, _ in parsed.calls] == [name for name, _ in calls]
    for (_, arguments), (_, pairs) in zip(parsed.calls, calls, strict=True):
        check_arguments(arguments, pairs)


# --- hostile tool declarations ---------------------------------------------------------

SCHEMA_KEYWORDS = ["type", "properties", "items", "required", "enum", "anyOf", "not", "$defs"]
schema_keys = st.one_of(
    st.sampled_from([*SCHEMA_KEYWORDS, "additionalProperties", "description", "$ref", "a b"]),
    st.text(max_size=6),
)
json_leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from(["object", "string", "integer", "array", "null", "nonsense", ""]),
    st.text(max_size=8),
)
json_values = st.recursive(
    json_leaves,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(schema_keys, children, max_size=4)
    ),
    max_leaves=40,
)


def wrapped(schema: dict, keyword: str, times: int) -> dict:
    for _ in range(times):
        schema = {keyword: schema}
    return schema


parameter_schemas = st.one_of(
    st.dictionaries(schema_keys, json_values, max_size=6),
    st.builds(
        wrapped,
        st.dictionaries(schema_keys, json_values, max_size=3),
        st.sampled_from(["items", "not", "additionalProperties"]),
        st.integers(1, 3 * MAX_SCHEMA_DEPTH),
    ),
)
declared_names = st.one_of(
    st.text(max_size=20),
    st.sampled_from(["get_weather", "", "get weather", "<tool_call>", "x</arg_value>", "a<b"]),
    st.builds(lambda name: name + "<tool_ca", st.text(max_size=5)),
)


def nesting_depth(value) -> int:
    """How many levels objects and arrays nest in ``value`` (0 for a scalar)."""
    if isinstance(value, dict):
        value = list(value.values())
    if not isinstance(value, list):
        return 0
    return 1 + max(map(nesting_depth, value), default=0)


@hostile_settings(500)
@given(declared_names, parameter_schemas)
def test_any_tool_declaration_is_callable_or_a_named_400(tokenizer, name, parameters):
    """What ``check_tools`` (run by ``adjust_request`` before vLLM builds a grammar)
    lets through can be called by name, streamed or not; what it stops is a 400
    naming the tool, short and with the fix, never another exception."""
    from vllm.exceptions import VLLMValidationError

    request = chat_request(
        tools=[{"type": "function", "function": {"name": name, "parameters": parameters}}]
    )
    try:
        check_tools(request.tools)
    except VLLMValidationError as error:
        message = str(error)
        assert error.parameter == "tools" and "Fix:" in message and len(message) < 1000
        assert message.startswith("tools: the ")
        return
    assert name and not any(c.isspace() for c in name)
    assert nesting_depth(parameters) <= MAX_SCHEMA_DEPTH
    call = f"<tool_call>{name}</tool_call>"
    assert parse_both_ways(tokenizer, call, request) == Parsed(None, [(name, "{}")])
