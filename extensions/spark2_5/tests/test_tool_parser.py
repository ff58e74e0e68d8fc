"""The ``spark25`` tool-call parser on vLLM's real parser API: formats, type
conversion, undeclared tools and malformed markup, ``adjust_request`` and
guided decoding for ``tool_choice``, reasoning parsers, and the compat helpers
that hide vLLM's API drift."""

from __future__ import annotations

import json
import random
import sys
import types
from typing import Any

import pytest

from spark2_5_dev.host_features import FORCED_CALL_REFUSAL, constrains_forced_calls
from spark2_5_dev.tool_parsing import (
    TOOLS,
    WEATHER_TOOL,
    Parsed,
    accumulate,
    arguments,
    chat_request,
    compact,
    non_streaming,
    parse_both_ways,
    register_spark25,
    serving_parser_cls,
    serving_parser_deltas,
)
from vllm_spark2_5_plugin import compat
from vllm_spark2_5_plugin.spark2_5_tool_parser import (
    MAX_IDENTIFIER_CHARS,
    MAX_SCHEMA_DEPTH,
    Spark25ToolParser,
    check_tools,
    value_json,
)

pytestmark = pytest.mark.contract


@pytest.fixture(scope="module")
def request_with_tools():
    return chat_request()


# --- registration -----------------------------------------------------------------


def test_registered_name_resolves_to_the_parser_in_vllms_registry():
    register_spark25()
    manager = compat.tool_parser_manager()
    assert manager.get_tool_parser("spark25") is Spark25ToolParser
    assert issubclass(Spark25ToolParser, compat.tool_parser_base())
    assert "spark2_5" not in manager.list_registered()


# --- the call format -----------------------------------------------------------------


COMPACT = (
    "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value>"
    "<arg_key>days</arg_key><arg_value>3</arg_value></tool_call>"
)
NEWLINE = (
    "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
    "<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>"
)
EXPECTED = Parsed(None, [("get_weather", '{"city":"Paris","days":3}')])


@pytest.mark.parametrize(
    "text",
    [
        COMPACT,
        NEWLINE,
        "<tool_call> get_weather \t<arg_key> city </arg_key>  \n <arg_value>Paris</arg_value>"
        " \r\n<arg_key>days</arg_key><arg_value> 3 </arg_value>\n\n</tool_call>",
    ],
    ids=["compact", "newline", "whitespace-between-tags"],
)
def test_compact_newline_and_spaced_forms_parse_alike(tokenizer, request_with_tools, text):
    assert parse_both_ways(tokenizer, text, request_with_tools) == EXPECTED


def test_text_around_and_between_several_calls_is_content(tokenizer, request_with_tools):
    text = f"Let me check.\n{COMPACT}\nand then {NEWLINE} Done."
    assert parse_both_ways(tokenizer, text, request_with_tools) == Parsed(
        "Let me check.\n\nand then  Done.", EXPECTED.calls * 2
    )


def test_values_keep_newlines_angle_brackets_json_and_unicode(tokenizer, request_with_tools):
    value = 'line 1\nif a < b and c > d: print("<b>")\n{"k": [1, 2]}\n東京 ☀ naïve'
    text = (
        f"<tool_call>get_weather<arg_key>city</arg_key><arg_value>{value}</arg_value></tool_call>"
    )
    parsed = parse_both_ways(tokenizer, text, request_with_tools)
    assert arguments(parsed) == [("get_weather", {"city": value})]
    # Compact JSON, non-ASCII kept as is.
    assert parsed.calls[0][1] == "{" + '"city":' + json.dumps(value, ensure_ascii=False) + "}"
    assert "東京" in parsed.calls[0][1] and "\\u" not in parsed.calls[0][1]


def test_a_call_without_arguments_has_an_empty_object(tokenizer, request_with_tools):
    text = "<tool_call>get_weather</tool_call>"
    assert parse_both_ways(tokenizer, text, request_with_tools) == Parsed(
        None, [("get_weather", "{}")]
    )


def test_value_may_contain_other_tags_as_text(tokenizer, request_with_tools):
    value = "see <arg_key> and <tool_call> and <arg_value> here"
    text = (
        f"<tool_call>get_weather<arg_key>city</arg_key><arg_value>{value}</arg_value></tool_call>"
    )
    assert arguments(parse_both_ways(tokenizer, text, request_with_tools)) == [
        ("get_weather", {"city": value})
    ]


# --- type conversion -------------------------------------------------------------------

TYPED = TOOLS[1]["function"]["parameters"]["properties"]


@pytest.mark.parametrize(
    ("key", "raw", "expected"),
    [
        ("text", " 42 ", " 42 "),
        ("text", "null", "null"),
        ("text", "true", "true"),
        ("count", " 42\n", 42),
        ("count", "-7", -7),
        ("count", "3.0", 3),
        ("count", "123456789012345678901234567890", 123456789012345678901234567890),
        ("count", "3.5", 3.5),
        ("count", "many", "many"),
        ("ratio", "0.25", 0.25),
        ("ratio", "2", 2),
        ("ratio", "1e3", 1000),
        ("ratio", "1e999", "1e999"),
        ("ratio", "nan", "nan"),
        ("flag", "True", True),
        ("flag", "false", False),
        ("flag", "1", True),
        ("flag", "yes", "yes"),
        ("options", '{"a": [1, {"b": null}]}', {"a": [1, {"b": None}]}),
        ("options", "{'a': 1}", "{'a': 1}"),
        ("options", "[1]", [1]),
        ("options", '{"x": 1e999}', '{"x": 1e999}'),
        ("items", '["x", 2]', ["x", 2]),
        ("maybe_count", "null", None),
        ("maybe_count", "NULL", None),
        ("maybe_count", "5", 5),
        ("maybe_count", "five", "five"),
        ("maybe_text", "null", None),
        ("maybe_text", "5", "5"),
        ("nullable_text", "null", None),
        ("choice", "b", "b"),
        ("choice", "3", 3),
        ("either", "4", 4),
        ("either", "true", True),
        ("untyped", "7", "7"),
        ("undeclared", '{"a": 1}', '{"a": 1}'),
    ],
)
def test_values_follow_the_declared_schema_type(key, raw, expected):
    # JSON text tells 3 from 3.0 and "3" from 3, as a type check would.
    assert value_json(raw, TYPED.get(key)) == compact(expected)


@pytest.mark.parametrize(
    "schema",
    [None, "string", [], {"type": 7}, {"type": [None, "integer"]}, {"enum": "ab"}, {"anyOf": 3}],
)
def test_malformed_schemas_do_not_break_conversion(schema):
    assert value_json(" 5 ", schema) in ('" 5 "', "5")


def test_typed_arguments_end_to_end(tokenizer, request_with_tools):
    pairs = [("count", "2"), ("maybe_count", "null"), ("maybe_text", "null"), ("text", "null")]
    text = (
        "<tool_call>typed"
        + "".join(f"<arg_key>{k}</arg_key><arg_value>{v}</arg_value>" for k, v in pairs)
        + "</tool_call>"
    )
    assert parse_both_ways(tokenizer, text, request_with_tools).calls == [
        ("typed", '{"count":2,"maybe_count":null,"maybe_text":null,"text":"null"}')
    ]


# --- what is not a call ----------------------------------------------------------------


def test_a_call_to_an_undeclared_tool_comes_back_verbatim_as_content(tokenizer, request_with_tools):
    unknown = "<tool_call>delete_all<arg_key>really</arg_key><arg_value>yes</arg_value></tool_call>"
    text = f"Hi {unknown} {COMPACT}"
    assert parse_both_ways(tokenizer, text, request_with_tools) == Parsed(
        f"Hi {unknown} ", EXPECTED.calls
    )


@pytest.mark.parametrize(
    "request_fields",
    [{"tools": None}, {"tool_choice": "none"}],
    ids=["no-tools", "tool-choice-none"],
)
def test_without_callable_tools_everything_is_content(tokenizer, request_fields):
    request = chat_request(**{"tools": TOOLS, **request_fields})
    text = f"a {COMPACT} b <tool_call>"
    assert parse_both_ways(tokenizer, text, request) == Parsed(text, [])


# --- malformed markup: content outside calls; inside a call only pairs count -----------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", Parsed(None)),
        ("<tool_call>", Parsed("<tool_call>")),
        ("x <tool_call>get_wea", Parsed("x <tool_call>get_wea")),
        ("<tool_call></tool_call>", Parsed("<tool_call></tool_call>")),
        ("<tool_call>  <arg_key>a</arg_key>", Parsed("<tool_call>  <arg_key>a</arg_key>")),
        ("<tool_call>get_weather</arg_key>", Parsed("<tool_call>get_weather</arg_key>")),
        ("<tool_call>" + "x" * (MAX_IDENTIFIER_CHARS + 1), Parsed("<tool_call>" + "x" * 257)),
        (
            "<tool_call>get_weather<arg_key>city",
            Parsed("<tool_call>get_weather<arg_key>city"),
        ),
        (
            "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Pa",
            Parsed("<tool_call>get_weather<arg_key>city</arg_key><arg_value>Pa"),
        ),
        (
            "<tool_call>get_weather\n<arg_key>city</arg_key> <arg_value>Paris</arg_value>\n",
            Parsed(
                "<tool_call>get_weather\n<arg_key>city</arg_key> <arg_value>Paris</arg_value>\n"
            ),
        ),
        (
            "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value>stray",
            Parsed(
                "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value>stray"
            ),
        ),
        (
            "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</tool_call>after",
            Parsed("after", [("get_weather", '{"city":"Paris"}')]),
        ),
        (
            "<tool_call>get_weather<arg_key>city</arg_key>oops<arg_value>Paris</arg_value>"
            "</tool_call>",
            Parsed(None, [("get_weather", "{}")]),
        ),
        (
            "<tool_call>get_weather stray<arg_key>city</arg_key><arg_value>Paris</arg_value>"
            "</tool_call>",
            Parsed(None, [("get_weather", '{"city":"Paris"}')]),
        ),
        (
            "<tool_call>get weather<arg_key>city</arg_key></tool_call>",
            Parsed("<tool_call>get weather<arg_key>city</arg_key></tool_call>"),
        ),
        (
            "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value>"
            "note<arg_value>x</arg_value><arg_key>city</arg_key><arg_value>Rome</arg_value>"
            "<arg_key> </arg_key><arg_value>y</arg_value></tool_call>",
            Parsed(None, [("get_weather", '{"city":"Paris"}')]),
        ),
        (
            "<tool_call>get_weather<arg_key>ci<tool_call>get_weather</tool_call>",
            Parsed(None, [("get_weather", "{}"), ("get_weather", "{}")]),
        ),
        (
            "<tool_call>get_weather<tool_call>get_weather</tool_call></tool_call></arg_value>",
            Parsed("<tool_call>get_weather</tool_call></arg_value>", [("get_weather", "{}")]),
        ),
        ("a </tool_call> <arg_key>b</arg_key> <", Parsed("a </tool_call> <arg_key>b</arg_key> <")),
    ],
    ids=[
        "empty",
        "lone-start-tag",
        "unterminated-name",
        "empty-name",
        "blank-name",
        "stray-tag-after-name",
        "name-too-long",
        "unterminated-key",
        "unterminated-value",
        "unclosed-call",
        "unclosed-call-with-stray-text",
        "value-ended-by-call-end",
        "text-between-key-and-value",
        "text-after-name",
        "space-in-name",
        "stray-value-duplicate-and-blank-keys",
        "new-call-inside-key",
        "new-call-after-name",
        "orphan-tags",
    ],
)
def test_malformed_markup_is_content_outside_calls_and_dropped_inside(
    tokenizer, request_with_tools, text, expected
):
    assert parse_both_ways(tokenizer, text, request_with_tools) == expected


# --- adjust_request and tool_choice ---------------------------------------------------------


def composed_parser(tokenizer, reasoning_parser=None, **kwargs):
    """vLLM's serving-layer ``Parser`` around spark25, as ``vllm serve`` builds it."""
    return serving_parser_cls(tokenizer, reasoning_parser)(tokenizer, TOOLS, **kwargs)


@pytest.mark.parametrize(
    "fields", [{}, {"tools": None}, {"tool_choice": "none"}], ids=["tools", "no-tools", "none"]
)
def test_adjust_request_keeps_special_tags_on_every_request(tokenizer, fields):
    """The call tags and ``</think>`` are special tokens: with or without tools, vLLM
    must hand them to the parsers (a reasoning parser needs ``</think>``)."""
    parser = Spark25ToolParser(tokenizer)
    assert parser.adjust_request(chat_request(**fields)).skip_special_tokens is False


def test_auto_tool_choice_is_not_constrained(tokenizer):
    request = composed_parser(tokenizer).adjust_request(chat_request(tool_choice="auto"))
    assert request.structured_outputs is None


NAMED = {"type": "function", "function": {"name": "get_weather"}}


def random_grammar_outputs(tokenizer, structural_tag, seed, count, prefer=lambda text: False):
    """Outputs of a random walk through the grammar vLLM sends to the engine (a
    stand-in for a random-weight model): at each step a random allowed token, or
    with probability 0.3 one whose text ``prefer`` picks."""
    import xgrammar

    vocab_size = len(tokenizer.get_vocab())
    info = xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size)
    grammar = xgrammar.GrammarCompiler(info).compile_structural_tag(structural_tag)
    bitmask = xgrammar.allocate_token_bitmask(1, vocab_size)
    rng = random.Random(seed)
    for _ in range(count):
        matcher = xgrammar.GrammarMatcher(grammar)
        tokens = []
        while not matcher.is_terminated() and len(tokens) < 400:
            matcher.fill_next_token_bitmask(bitmask)
            allowed = [t for t in range(vocab_size) if bitmask[0, t // 32] >> (t % 32) & 1]
            preferred = [t for t in allowed if prefer(tokenizer.decode([t]))]
            token = rng.choice(preferred if preferred and rng.random() < 0.3 else allowed)
            assert matcher.accept_token(token)
            tokens.append(token)
        if tokens[-1] == tokenizer.eos_token_id:
            tokens.pop()
        yield tokenizer.decode(tokens, skip_special_tokens=False)


def adjust_forced(tokenizer, **fields):
    """``adjust_request`` of a forced-choice request. Where vLLM cannot constrain
    forced calls (0.23) it checks the documented 400 instead and returns None."""
    from vllm.exceptions import VLLMValidationError

    request = chat_request(**fields)
    if constrains_forced_calls():
        return composed_parser(tokenizer).adjust_request(request)
    with pytest.raises(VLLMValidationError, match=FORCED_CALL_REFUSAL) as error:
        composed_parser(tokenizer).adjust_request(request)
    assert error.value.parameter == "tool_choice"
    return None


def one_call_per_output(tokenizer, tool_choice) -> bool:
    """Whether vLLM's grammar enforces ``parallel_tool_calls=False`` (vLLM 0.32 on):
    before, the structural tag is the same either way and allows several calls."""
    tags = {
        composed_parser(tokenizer)
        .adjust_request(chat_request(tool_choice=tool_choice, parallel_tool_calls=parallel))
        .structured_outputs.structural_tag
        for parallel in (True, False)
    }
    return len(tags) == 2


def spark_calls(tokenizer, output, request, single: bool) -> list[tuple[str, Any]]:
    """The calls a grammar output parses into: one when the grammar enforces it."""
    calls = arguments(non_streaming(Spark25ToolParser(tokenizer), output, request))
    assert len(calls) == 1 if single else calls, output
    return calls


@pytest.mark.parametrize("tool_choice", ["required", NAMED], ids=["required", "named"])
def test_forced_tool_choice_gets_a_grammar_whose_every_output_is_a_spark_call(
    tokenizer, tool_choice
):
    request = adjust_forced(tokenizer, tool_choice=tool_choice, parallel_tool_calls=False)
    if request is None:
        return  # refused with the documented 400
    assert request.skip_special_tokens is False
    structural_tag = request.structured_outputs.structural_tag
    assert structural_tag and "<tool_call>get_weather" in structural_tag
    allowed_names = {"get_weather"} if tool_choice == NAMED else {"get_weather", "typed"}
    # A named choice is one call on every release.
    single = tool_choice == NAMED or one_call_per_output(tokenizer, tool_choice)
    names = set()
    for output in random_grammar_outputs(
        tokenizer, structural_tag, seed=0, count=20, prefer=lambda text: text.startswith("</")
    ):
        for name, args in spark_calls(tokenizer, output, request, single):
            assert name in allowed_names and isinstance(args, dict), output
            names.add(name)
    assert names == allowed_names


def test_strict_tool_grammar_yields_schema_typed_arguments(tokenizer):
    strict_tool = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "strict": True,
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "enum": ["Paris", "東京"]},
                    "metric": {"type": "boolean"},
                },
                "required": ["city", "metric"],
                "additionalProperties": False,
            },
        },
    }
    request = adjust_forced(
        tokenizer, tools=[strict_tool], tool_choice="required", parallel_tool_calls=False
    )
    if request is None:
        return  # refused with the documented 400
    single = one_call_per_output(tokenizer, "required")
    # Whitespace around values is legal and unbounded; preferring anything else
    # lets the walk end.
    for output in random_grammar_outputs(
        tokenizer,
        request.structured_outputs.structural_tag,
        seed=1,
        count=10,
        prefer=lambda text: bool(text.strip()),
    ):
        for name, args in spark_calls(tokenizer, output, request, single):
            # The grammar lets a model pad values with whitespace: typed values drop
            # it, string values keep it (they are verbatim).
            assert name == "get_weather" and args["city"].strip() in ("Paris", "東京"), output
            assert isinstance(args["metric"], bool), output


def test_forced_tool_choice_without_structural_tags_is_a_clear_400(tokenizer, monkeypatch):
    import vllm.envs
    from vllm.exceptions import VLLMValidationError

    # A module attribute wins over vllm.envs' lazy (and later cached) lookup.
    monkeypatch.setattr(vllm.envs, "VLLM_ENFORCE_STRICT_TOOL_CALLING", False, raising=False)
    with pytest.raises(VLLMValidationError) as error:
        composed_parser(tokenizer).adjust_request(chat_request(tool_choice="required"))
    assert error.value.parameter == "tool_choice"
    message = str(error.value)
    # Where vLLM cannot constrain forced calls at all (0.23), that is the reason given.
    strict_off = "VLLM_ENFORCE_STRICT_TOOL_CALLING"
    reason = strict_off if constrains_forced_calls() else FORCED_CALL_REFUSAL
    assert "tool_choice='required'" in message and reason in message
    assert 'tool_choice="auto"' in message

    monkeypatch.setattr(Spark25ToolParser, "structural_tag_model", None)
    with pytest.raises(VLLMValidationError, match=r"named tool 'get_weather'.*upgrade vLLM"):
        composed_parser(tokenizer).adjust_request(chat_request(tool_choice=NAMED))


def tool_with(name: str = "f", parameters: Any = None) -> dict[str, Any]:
    function = {"name": name, **({} if parameters is None else {"parameters": parameters})}
    return {"type": "function", "function": function}


def refusal(tokenizer, tools, tool_choice="auto"):
    """The 400 ``vllm serve`` answers a request declaring ``tools`` with: the serving
    layer's parser refuses it before the request reaches the engine."""
    from vllm.exceptions import VLLMValidationError

    with pytest.raises(VLLMValidationError) as error:
        composed_parser(tokenizer).adjust_request(chat_request(tools, tool_choice=tool_choice))
    assert error.value.parameter == "tools"
    return str(error.value)


@pytest.mark.parametrize("name", ["", "get weather", "get\nweather", "f<tool_call>", "a</arg_key>"])
@pytest.mark.parametrize("tool_choice", ["auto", "required"])
def test_a_tool_no_spark_call_can_name_is_a_400(tokenizer, name, tool_choice):
    """vLLM took these: the model saw a tool it could not call, and
    ``tool_choice="required"`` ended with no call and a 200."""
    message = refusal(tokenizer, [tool_with(name, {"type": "object"})], tool_choice)
    assert f"function name {json.dumps(name)}" in message and "Fix: name the tool" in message


@pytest.mark.parametrize(
    ("parameters", "place"),
    [
        ({"type": "nonsense"}, 'at $.type, "nonsense" is not one of array, boolean'),
        ({"type": ["string", "int"]}, 'at $.type, ["string", "int"] is not one of'),
        ({"type": "object", "properties": "x"}, 'at $.properties, "x" is not an object of'),
        ({"properties": {"a": {"required": True}}}, "at $.properties.a.required, true is not"),
        ({"type": "object", "required": "city"}, 'at $.required, "city" is not an array'),
        ({"properties": {"a b": {"enum": "x"}}}, 'at $.properties["a b"].enum, "x" is not an'),
        ({"anyOf": []}, "at $.anyOf, [] is not a non-empty array of schemas"),
        ({"items": [{"type": "string"}, 5]}, "at $.items[1], 5 is not a schema (an object)"),
        ({"$defs": {"x": {"not": {"type": 1}}}}, 'at $["$defs"].x.not.type, 1 is not one of'),
    ],
)
@pytest.mark.parametrize("tool_choice", ["auto", "required"])
def test_parameters_that_are_not_a_json_schema_are_a_400_naming_the_place(
    tokenizer, parameters, place, tool_choice
):
    """vLLM took these under ``auto``; forced, they failed in the engine as
    "Invalid grammar specification: 'triggers'", in a stream after its 200."""
    message = refusal(tokenizer, [WEATHER_TOOL, tool_with("f", parameters)], tool_choice)
    assert 'parameters of function "f" are not a usable JSON Schema' in message
    assert place in message and "Fix: correct the schema there" in message


def test_what_a_refusal_echoes_is_cut_short(tokenizer):
    name, value = "x " * 5000, "v" * 100_000
    assert len(refusal(tokenizer, [tool_with(name)])) < 500
    assert len(refusal(tokenizer, [tool_with("f", {"type": value})])) < 500


def nested_schema(levels: int, keyword: str = "items") -> dict[str, Any]:
    """A schema whose objects nest ``levels`` deep, one schema level per object."""
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(levels - 1):
        schema = {keyword: schema}
    return schema


@pytest.mark.parametrize("keyword", ["items", "not"])
def test_parameter_schemas_nest_at_most_max_schema_depth_levels(tokenizer, keyword):
    check_tools(
        chat_request(tools=[tool_with("f", nested_schema(MAX_SCHEMA_DEPTH, keyword))]).tools
    )
    deeper = [tool_with("f", nested_schema(MAX_SCHEMA_DEPTH + 1, keyword))]
    assert f"more than {MAX_SCHEMA_DEPTH} levels deep" in refusal(tokenizer, deeper)


def test_valid_tools_pass_as_they_are():
    request = chat_request(
        tools=[
            *TOOLS,
            tool_with("no_parameters"),
            tool_with("draft_4", {"$schema": "http://json-schema.org/draft-04/schema#"}),
            tool_with(
                "名前.v2", {"type": "object", "properties": {}, "additionalProperties": False}
            ),
            tool_with("pair", {"type": "array", "items": [{"type": "string"}, True]}),
            tool_with("refs", {"$defs": {"a": {"type": "integer"}}, "$ref": "#/$defs/a"}),
        ]
    )
    tools = json.loads(json.dumps([tool.model_dump() for tool in request.tools]))
    check_tools(request.tools)
    assert [tool.model_dump() for tool in request.tools] == tools


# --- reasoning parsers ---------------------------------------------------------------------

THINKING_OUTPUT = (
    "I could call <tool_call>get_weather<arg_key>city</arg_key><arg_value>Rome</arg_value>"
    "</tool_call> but no.</think>Checking.<tool_call>get_weather<arg_key>city</arg_key>"
    "<arg_value>Paris</arg_value></tool_call>"
)
THINKING = (
    "I could call <tool_call>get_weather<arg_key>city</arg_key><arg_value>Rome</arg_value>"
    "</tool_call> but no.",
    "Checking.",
    [("get_weather", '{"city":"Paris"}')],
)
NOT_THINKING_OUTPUT = THINKING_OUTPUT.split("</think>")[1]
NOT_THINKING = (None, "Checking.", [("get_weather", '{"city":"Paris"}')])


def reason_and_parse(tokenizer, reasoning_parser, output, chat_template_kwargs):
    """Non-streaming and token-by-token streaming results of vLLM's composed parser,
    on the tokens Spark2_5 would produce after the chat template's prompt."""
    request = chat_request(chat_template_kwargs=chat_template_kwargs)
    prompt = tokenizer.apply_chat_template(
        request.messages,
        tools=TOOLS,
        add_generation_prompt=True,
        tokenize=False,
        **chat_template_kwargs,
    )
    prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
    kwargs = {"chat_template_kwargs": chat_template_kwargs}

    reasoning, content, calls = composed_parser(tokenizer, reasoning_parser, **kwargs).parse(
        output, request, enable_auto_tools=True
    )
    full = (reasoning, content, [(call.name, call.arguments) for call in calls or []])

    parser = composed_parser(tokenizer, reasoning_parser, **kwargs)
    deltas = serving_parser_deltas(parser, tokenizer, output, request, prompt_ids)
    streamed_reasoning = "".join(delta.reasoning or "" for delta in deltas if delta) or None
    streamed = accumulate(deltas)
    return full, (streamed_reasoning, streamed.content, streamed.calls)


@pytest.mark.parametrize(
    ("chat_template_kwargs", "output", "expected"),
    [
        ({"enable_thinking": True}, THINKING_OUTPUT, THINKING),
        ({}, THINKING_OUTPUT, THINKING),
        ({"enable_thinking": False}, NOT_THINKING_OUTPUT, NOT_THINKING),
    ],
    ids=["thinking", "thinking-by-default", "thinking-off"],
)
def test_holo2_reasoning_parser_composes_with_spark25(
    tokenizer, chat_template_kwargs, output, expected
):
    """``--reasoning-parser holo2`` (vLLM's DeepSeek-V3 think parser, thinking on unless
    the request turns it off): reasoning is split off, a call written while thinking is
    not executed, calls after ``</think>`` are, streamed or not."""
    full, streamed = reason_and_parse(tokenizer, "holo2", output, chat_template_kwargs)
    assert full == expected
    assert streamed == expected


def test_deepseek_r1_reasoning_parser_composes_only_while_thinking(tokenizer):
    """``deepseek_r1`` splits the same way while thinking, but with thinking turned off
    it files the whole answer, calls included, under reasoning."""
    full, streamed = reason_and_parse(tokenizer, "deepseek_r1", THINKING_OUTPUT, {})
    assert full == streamed == THINKING
    full, streamed = reason_and_parse(
        tokenizer, "deepseek_r1", NOT_THINKING_OUTPUT, {"enable_thinking": False}
    )
    assert full[0] == streamed[0] == NOT_THINKING_OUTPUT
    assert not full[2] and not streamed[2]


# --- compat: both shapes of every drifting API ----------------------------------------------


@pytest.mark.parametrize("host_list", [True, False], ids=["vllm-0.32+", "vllm-0.23-0.31"])
def test_tool_lookup_with_and_without_vllms_get_function_tools(
    host_list, tokenizer, request_with_tools, monkeypatch
):
    """Before vLLM 0.32 there is no ``get_function_tools``: the adapter then reads the
    function tools itself (Chat and Responses function tools) and parses the same."""
    import vllm.tool_parsers.utils as utils
    from openai.types.responses import FunctionTool

    expected = Parsed("x ", [("get_weather", '{"city":"Paris","days":3}')])  # either way
    if host_list and not hasattr(utils, "get_function_tools"):
        pytest.skip("this vLLM has no get_function_tools: the other case is its path")
    if not host_list:
        monkeypatch.delattr(utils, "get_function_tools", raising=False)
    assert parse_both_ways(tokenizer, f"x {COMPACT}", request_with_tools) == expected
    tools = dict(compat.function_tools(request_with_tools.tools))
    assert list(tools) == ["get_weather", "typed"]
    assert tools["get_weather"] == WEATHER_TOOL["function"]["parameters"]
    assert compat.function_tools(None) == []
    lookup = FunctionTool(type="function", name="lookup", parameters={"type": "object"})
    assert compat.function_tools([lookup]) == [("lookup", {"type": "object"})]


def test_protocol_types_and_tool_call_ids_from_older_module_locations(monkeypatch):
    """Before vLLM 0.29 the protocol types lived in ``vllm.entrypoints.openai.engine.
    protocol``; before 0.32 ``make_tool_call_id`` lived in ``vllm.entrypoints.chat_utils``."""
    current = compat.tool_call_protocol()
    assert current.__name__ in (
        "vllm.entrypoints.generate.base.protocol",  # 0.29 and later
        "vllm.entrypoints.openai.engine.protocol",  # 0.23 to 0.28
    )
    assert compat.tool_call_id_factory()().startswith("chatcmpl-tool-")

    older_protocol = types.ModuleType("vllm.entrypoints.openai.engine.protocol")
    older_protocol.DeltaMessage = current.DeltaMessage
    older_chat_utils = types.ModuleType("vllm.entrypoints.chat_utils")
    older_chat_utils.make_tool_call_id = lambda: "older-id"
    # A None entry makes the import fail, as on releases that lack the module.
    monkeypatch.setitem(sys.modules, "vllm.entrypoints.generate.base.protocol", None)
    monkeypatch.setitem(sys.modules, "vllm.renderers.chat_utils", None)
    monkeypatch.setitem(sys.modules, "vllm.entrypoints.openai.engine.protocol", older_protocol)
    monkeypatch.setitem(sys.modules, "vllm.entrypoints.chat_utils", older_chat_utils)
    assert compat.tool_call_protocol() is older_protocol
    assert compat.tool_call_id_factory()() == "older-id"

    monkeypatch.setitem(sys.modules, "vllm.entrypoints.openai.engine.protocol", None)
    with pytest.raises(ImportError, match=r"vllm\.entrypoints\.generate\.base\.protocol"):
        compat.tool_call_protocol()


def test_structural_tag_support_and_request_errors(monkeypatch):
    import vllm.tool_parsers.structural_tag_registry as registry

    listed = hasattr(registry, "SUPPORTED_STRUCTURAL_TAG_MODELS")  # vLLM 0.24 and later
    assert ("glm_4_7" in compat.structural_tag_models()) is listed
    assert Spark25ToolParser.structural_tag_model == ("glm_4_7" if listed else None)
    error = compat.request_validation_error("bad", parameter="tool_choice", value="required")
    assert type(error).__name__ == "VLLMValidationError"
    assert (error.parameter, error.value) == ("tool_choice", "required")

    monkeypatch.delattr(registry, "SUPPORTED_STRUCTURAL_TAG_MODELS", raising=False)  # 0.23
    assert compat.structural_tag_models() == frozenset()


@pytest.mark.parametrize("module", ["scanner", "values", "schema"])
def test_the_parsers_core_imports_no_vllm(module):
    """Only the adapter meets vLLM; the core takes the tools as plain data."""
    import ast
    from pathlib import Path

    import vllm_spark2_5_plugin.spark2_5_tool_parser as package

    tree = ast.parse((Path(package.__file__).parent / f"{module}.py").read_text())
    imported = {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    }
    imported |= {
        f"{node.module}.{alias.name}"
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    outside = {name for name in imported if name.split(".")[0] == "vllm" or "compat" in name}
    assert not outside, outside
