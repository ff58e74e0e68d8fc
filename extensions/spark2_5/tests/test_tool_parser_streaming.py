"""Streaming ``spark25``: whatever the output and however it is cut into deltas, a
client ends up with the non-streaming result (a call the output ends inside is,
streamed, a call as far as written), receives a call's name once it is complete
and its arguments as the model writes them, never sees a partial tag as content,
and the parser's work grows linearly with the output."""

from __future__ import annotations

import json
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spark2_5_dev.host_features import flushes_stream_end
from spark2_5_dev.tool_parsing import (
    Parsed,
    accumulate,
    chat_request,
    non_streaming,
    serving_parser_cls,
    serving_parser_deltas,
    split_at,
    stream_agrees,
    stream_as_text_so_far,
    stream_tool_parser,
)
from vllm_spark2_5_plugin.spark2_5_tool_parser import Spark25ToolParser

TAGS = ["<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"]
PARTIAL_TAGS = [tag[:end] for tag in TAGS for end in range(1, len(tag))]


REQUEST = chat_request()
NO_TOOLS = chat_request(tools=None)

names = st.sampled_from(["get_weather", "typed", "unknown", "", " get_weather\n", "get weather"])
keys = st.sampled_from(["city", "days", "metric", "count", "maybe_count", "options", " text ", ""])
values = st.one_of(
    st.sampled_from(
        ["Paris", "3", " 3 ", "null", "true", "1e999", '{"a": [1, 2]}', "[1", "東京 ☀", "a\nb"]
    ),
    st.text(max_size=8),
)
whitespace = st.sampled_from(["", "", " ", "\n", " \n\t"])


@st.composite
def calls(draw):
    """A call in the compact or newline form, sometimes cut short."""
    newline = draw(st.booleans())
    sep = "\n" if newline else draw(whitespace)
    text = "<tool_call>" + draw(names) + sep
    for _ in range(draw(st.integers(0, 3))):
        text += f"<arg_key>{draw(keys)}</arg_key>{draw(whitespace)}<arg_value>{draw(values)}"
        text += "</arg_value>" + sep
    text += "</tool_call>"
    if draw(st.integers(0, 4)) == 0:
        text = text[: draw(st.integers(0, len(text)))]
    return text


fragments = st.one_of(
    calls(),
    st.sampled_from(TAGS + PARTIAL_TAGS + ["<", ">", "<<", "a < b", "</"]),
    names,
    keys,
    values,
    whitespace,
    st.text(max_size=12),
)
outputs = st.lists(fragments, max_size=12).map("".join)


@st.composite
def output_and_cuts(draw):
    text = draw(outputs)
    cuts = draw(st.lists(st.integers(0, len(text)), max_size=max(len(text), 1)))
    return text, cuts


def parsed_both_ways(tokenizer, text, cuts, request=REQUEST):
    expected = non_streaming(Spark25ToolParser(tokenizer), text, request)
    streamed = stream_tool_parser(Spark25ToolParser(tokenizer), split_at(text, cuts), request)
    return expected, streamed


PROPERTY_SETTINGS = settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def all_but_an_undecided_tail(streamed: Parsed, expected: Parsed) -> bool:
    """Whether a stream never ended by ``finish_streaming`` holds back at most what is
    still undecided when the output stops: a partial tag, or a ``<tool_call>`` block
    whose name never ended (it may yet be a call)."""
    if stream_agrees(streamed, expected):
        return True
    shown, content = streamed.content or "", expected.content or ""
    tail = content[len(shown) :]
    undecided = tail in PARTIAL_TAGS or (
        tail.startswith("<tool_call>") and "</tool_call>" not in tail
    )
    return content.startswith(shown) and undecided and streamed.calls == expected.calls


@PROPERTY_SETTINGS
@given(output_and_cuts())
def test_a_caller_that_never_ends_the_stream_still_gets_everything(tokenizer, text_and_cuts):
    """vLLM 0.23's server and vLLM's own parser tests pass the text so far and never
    call ``finish_streaming``: nothing decided waits for a later delta, text after a
    call included."""
    text, cuts = text_and_cuts
    expected = non_streaming(Spark25ToolParser(tokenizer), text, REQUEST)
    streamed = stream_as_text_so_far(Spark25ToolParser(tokenizer), split_at(text, cuts), REQUEST)
    assert all_but_an_undecided_tail(streamed, expected)


@PROPERTY_SETTINGS
@given(st.lists(output_and_cuts(), min_size=2, max_size=3))
def test_one_parser_streams_several_outputs_each_as_if_alone(tokenizer, outputs_and_cuts):
    """vLLM's own parser tests stream several outputs, malformed or cut ones too,
    through one parser object, each with a request of its own: each output's calls
    are new calls (an id and a name first, numbered from 0), whatever the last
    output left open."""
    parser = Spark25ToolParser(tokenizer)
    for text, cuts in outputs_and_cuts:
        request = chat_request()
        expected = non_streaming(Spark25ToolParser(tokenizer), text, request)
        streamed = stream_as_text_so_far(parser, split_at(text, cuts), request)
        assert all_but_an_undecided_tail(streamed, expected)


@PROPERTY_SETTINGS
@given(output_and_cuts())
def test_any_split_streams_exactly_the_non_streaming_result(tokenizer, text_and_cuts):
    text, cuts = text_and_cuts
    expected, streamed = parsed_both_ways(tokenizer, text, cuts)
    assert stream_agrees(streamed, expected)
    for _, args in expected.calls:
        # Valid, compact JSON objects with unique keys.
        decoded = json.loads(args)
        assert isinstance(decoded, dict)
        assert json.dumps(decoded, ensure_ascii=False, separators=(",", ":")) == args
    if not expected.calls:
        assert expected.content == (text or None)


@PROPERTY_SETTINGS
@given(outputs)
def test_one_character_deltas_and_no_tools(tokenizer, text):
    expected, streamed = parsed_both_ways(tokenizer, text, range(len(text)))
    assert stream_agrees(streamed, expected)
    assert parsed_both_ways(tokenizer, text, range(len(text)), NO_TOOLS) == (
        (Parsed(text or None),) * 2
    )


@PROPERTY_SETTINGS
@given(outputs, st.data())
def test_a_cut_never_yields_a_call_the_whole_output_does_not_make(tokenizer, text, data):
    """Cut anywhere (``max_tokens``), an output's calls are the first calls of the
    whole output: not streamed each whole (a call the cut falls inside is content),
    streamed the last one as far as the cut lets it be written."""
    whole = non_streaming(Spark25ToolParser(tokenizer), text, REQUEST).calls
    cut = text[: data.draw(st.integers(0, len(text)))]
    calls = non_streaming(Spark25ToolParser(tokenizer), cut, REQUEST).calls
    assert calls == whole[: len(calls)]
    streamed_whole = stream_tool_parser(Spark25ToolParser(tokenizer), list(text), REQUEST)
    streamed_cut = stream_tool_parser(Spark25ToolParser(tokenizer), list(cut), REQUEST)
    assert len(streamed_cut.calls) <= len(streamed_whole.calls)
    for index, (name, arguments) in enumerate(streamed_cut.calls):
        whole_name, whole_arguments = streamed_whole.calls[index]
        assert name == whole_name
        last = index == len(streamed_cut.calls) - 1
        assert whole_arguments.startswith(arguments) if last else arguments == whole_arguments


@PROPERTY_SETTINGS
@given(output_and_cuts())
def test_streamed_content_is_never_taken_back(tokenizer, text_and_cuts):
    """After every delta the content streamed so far is a prefix of the final
    content: no partial tag (or anything else) is sent and later found to be markup."""
    text, cuts = text_and_cuts
    final = non_streaming(Spark25ToolParser(tokenizer), text, REQUEST).content or ""
    parser = Spark25ToolParser(tokenizer)
    streamed = ""
    for delta in split_at(text, cuts):
        message = parser.extract_tool_calls_streaming("", delta, delta, [], [], [], REQUEST)
        streamed += (message and message.content) or ""
        assert final.startswith(streamed)


def test_a_partial_tag_is_held_back_until_it_resolves(tokenizer):
    parser = Spark25ToolParser(tokenizer)

    def content_of(delta):
        message = parser.extract_tool_calls_streaming("", delta, delta, [], [], [], REQUEST)
        return message and message.content

    assert content_of("Hello <tool_") == "Hello "
    assert content_of("cal") is None
    assert content_of("m and <") == "<tool_calm and "
    assert content_of("/arg_key") is None
    assert parser.finish_streaming().content == "</arg_key"


def test_a_call_streams_as_the_model_writes_it(tokenizer):
    """The name goes out once it is complete, a string value character by character,
    a typed value when ``</arg_value>`` ends it, the closing brace with
    ``</tool_call>``; text inside the call that forms no pair is dropped; what
    follows streams at once again."""
    text = (
        "Sure.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
        "note<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call> Done."
    )
    parser = Spark25ToolParser(tokenizer)
    seen = []  # (text fed so far, content, [(index, id given, name, arguments)])
    for position, char in enumerate(text, 1):
        message = parser.extract_tool_calls_streaming("", char, char, [], [], [], REQUEST)
        if message is not None:
            calls = [
                (call.index, bool(call.id), call.function.name, call.function.arguments)
                for call in message.tool_calls
            ]
            seen.append((text[:position], message.content, calls))
    assert parser.finish_streaming() is None
    pieces = [(fed, call) for fed, _, calls in seen for call in calls]
    assert pieces[0] == ("Sure.\n<tool_call>get_weather\n", (0, True, "get_weather", ""))
    assert [call for _, call in pieces[1:7]] == [
        (0, False, None, piece) for piece in ('{"city":"', "P", "a", "r", "i", "s")
    ]
    assert pieces[7][0].endswith("Paris</arg_value>") and pieces[7][1][3] == '"'
    assert pieces[8][0].endswith("<arg_value>3</arg_value>") and pieces[8][1][3] == ',"days":3'
    assert pieces[9][0].endswith("</tool_call>") and pieces[9][1][3] == "}"
    assert len(pieces) == 10
    assert "".join(content or "" for _, content, _ in seen) == "Sure.\n Done."


def test_a_client_has_a_long_argument_before_the_call_closes(tokenizer):
    """An agent writing a file: before ``</arg_value>`` the streamed arguments hold
    every character of the 2,000-character ``content`` written so far."""
    body = "".join(f'line {number}: x < y && "quoted"\n' for number in range(70))[:2000]
    head = "<tool_call>get_weather<arg_key>city</arg_key><arg_value>"
    parser = Spark25ToolParser(tokenizer)
    streamed = []
    for char in head + body:
        message = parser.extract_tool_calls_streaming("", char, char, [], [], [], REQUEST)
        streamed += [call.function.arguments for call in (message.tool_calls if message else [])]
    assert "".join(streamed) == '{"city":' + json.dumps(body, ensure_ascii=False)[:-1]


def is_cut_short(streamed: Parsed, full: Parsed) -> bool:
    """Whether ``streamed`` is ``full`` with only its end missing: a prefix of the
    content, and of each call's arguments, the same names."""
    return (
        (full.content or "").startswith(streamed.content or "")
        and len(streamed.calls) <= len(full.calls)
        and all(
            name == whole_name and whole_args.startswith(args)
            for (name, args), (whole_name, whole_args) in zip(
                streamed.calls, full.calls, strict=False
            )
        )
    )


def test_special_token_deltas_through_vllms_serving_parser(tokenizer):
    """The serving layer's own ``Parser`` streams token by token (tags as single
    special tokens) and ends the stream with ``finished=True``: the held-back tail
    and an unclosed call are released as the non-streaming path reports them.
    vLLM 0.23 never tells the tool parser that the stream ended: there a held-back
    partial tag is not sent, and nothing else is lost or changed."""
    parser_cls = serving_parser_cls(tokenizer)
    ends_clean = (
        "Hi <tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call>"
    )
    tail = "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Pa"
    for text in [ends_clean, f"Hi <tool_call>typed</tool_call> {tail}", "a <tool_c"]:
        reasoning, content, calls = parser_cls(tokenizer).parse(
            text, REQUEST, enable_auto_tools=True
        )
        full = Parsed(content, [(call.name, call.arguments) for call in calls or []])
        deltas = serving_parser_deltas(parser_cls(tokenizer), tokenizer, text, REQUEST)
        assert reasoning is None
        streamed = accumulate(deltas)
        if flushes_stream_end() or not text.endswith("<tool_c"):
            assert stream_agrees(streamed, full), (streamed, full)
        else:
            assert streamed != full and is_cut_short(streamed, full), (streamed, full)


def _stream_seconds(tokenizer, text):
    """Best of three runs of a 1-character stream through the parser."""
    best = float("inf")
    for _ in range(3):
        parser = Spark25ToolParser(tokenizer)
        stream = parser.extract_tool_calls_streaming
        start = time.perf_counter()
        for char in text:
            stream("", char, char, (), (), (), REQUEST)
        parser.finish_streaming()
        best = min(best, time.perf_counter() - start)
    return best


@pytest.mark.parametrize(
    "unit",
    [
        "<tool_call>get_weather<arg_key>city</arg_key><arg_value>x < y</arg_value></tool_call> ",
        None,  # one call with one long value: quadratic in parsers that re-scan it
    ],
    ids=["many-calls", "one-long-value"],
)
def test_streaming_cost_grows_linearly(tokenizer, unit):
    def output(size):
        if unit is not None:
            return unit * (size // len(unit))
        return (
            "<tool_call>get_weather<arg_key>city</arg_key><arg_value>"
            + "if a < b: c = '<arg>'\n" * (size // 22)
            + "</arg_value></tool_call>"
        )

    small, large = (
        _stream_seconds(tokenizer, output(20_000)),
        _stream_seconds(tokenizer, output(80_000)),
    )
    # 4x the output: linear work takes ~4x the time, quadratic ~16x.
    assert large / small < 8, (small, large)
