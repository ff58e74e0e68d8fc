"""End to end through the front door: ``vllm serve`` of the trained Spark2_5 fixture
with ``--enable-auto-tool-choice --tool-call-parser spark25`` (carrier enabled, no
``--trust-remote-code``), driven by the official ``openai`` client.

Every OpenAI surface the server offers is tried at every ``max_tokens`` cut of a
tool call: Chat Completions (``create``, ``stream()``, ``parse()`` with
``pydantic_function_tool``) and the Responses API (``create``, ``stream()``)
return the same thing streamed or not and never a cut call as a call, and carry
the agent loop (tool result back, next turn); ``tool_choice="none"`` returns the
markup without or with its tags as ``docs/tool-calling.md`` says."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import openai
import pydantic
import pytest
from transformers import PreTrainedTokenizerFast

from spark2_5_dev import fixture
from spark2_5_dev.chat import chat, conversation
from spark2_5_dev.host_features import (
    FORCED_CALL_REFUSAL,
    constrains_forced_calls,
    ends_incomplete_responses_with_their_own_event,
    final_response_is_the_streamed_items,
    flushes_stream_end,
    keeps_length_for_cut_streamed_calls,
    streams_responses_through_parser,
)
from spark2_5_dev.streamed import StreamedAnswer
from spark2_5_dev.tool_parsing import Parsed, stream_agrees

pytestmark = [pytest.mark.serve, pytest.mark.kernels]


@pytest.fixture(scope="module")
def server(spark_chat_model, carrier_enabled_server):
    with carrier_enabled_server(spark_chat_model, fixture.SERVE_ARGS) as running:
        yield running


def test_served_without_remote_code(server):
    log = server.log()
    assert "Resolved architecture: Spark2_5ForCausalLM" in log
    assert "trust_remote_code=False" in log


def test_plain_chat(client):
    choice = chat(client, [{"role": "user", "content": fixture.CAPITAL_QUESTION}])
    assert choice.finish_reason == "stop"
    assert choice.message.content == fixture.CAPITAL_ANSWER
    assert not choice.message.tool_calls


def test_plain_answer_when_tools_are_offered_but_not_needed(client):
    plain = conversation("plain-with-tools")
    choice = chat(client, plain.messages, plain.tools)
    assert choice.finish_reason == "stop"
    assert choice.message.content == fixture.CAPITAL_ANSWER
    assert not choice.message.tool_calls


@pytest.mark.parametrize(
    ("name", "function", "arguments"),
    [
        ("weather-call", "get_weather", fixture.PARIS_CALL),
        ("weather-call-unicode", "get_weather", fixture.HEFEI_CALL),
        ("time-call", "get_time", fixture.TOKYO_CALL),
    ],
)
def test_tool_call(client, name, function, arguments):
    case = conversation(name)
    choice = chat(client, case.messages, case.tools)
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.type == "function"
    assert call.id
    assert call.function.name == function
    assert json.loads(call.function.arguments) == arguments  # typed: days is an int
    # Compact JSON with non-ASCII kept as is.
    assert call.function.arguments == json.dumps(
        arguments, ensure_ascii=False, separators=(",", ":")
    )
    assert not choice.message.content


def test_streamed_tool_call_arrives_as_written(client):
    case = conversation("weather-call")
    stream = client.chat.completions.create(
        model=client.models.list().data[0].id,
        messages=case.messages,
        tools=case.tools,
        temperature=0,
        max_tokens=120,
        stream=True,
    )
    events, finish_reason, content = [], None, ""
    for chunk in stream:
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        content += delta.content or ""
        events.extend(delta.tool_calls or [])
        finish_reason = chunk.choices[0].finish_reason or finish_reason
    assert finish_reason == "tool_calls"
    assert content == ""
    # The id and name first, then the arguments as the model writes them (vLLM
    # merges the deltas of tokens a slow client has not read yet: how many chunks
    # carry them depends on timing).
    first, *rest = events
    assert first.index == 0 and first.id and first.function.name == "get_weather"
    assert all(event.index == 0 and not event.id and not event.function.name for event in rest)
    pieces = [first.function.arguments, *(event.function.arguments for event in rest)]
    assert json.loads("".join(pieces)) == fixture.PARIS_CALL


def test_follow_up_after_tool_result(client):
    case = conversation("follow-up")
    choice = chat(client, case.messages, case.tools)
    assert choice.finish_reason == "stop"
    assert choice.message.content == fixture.PARIS_FOLLOW_UP


@pytest.mark.parametrize(
    "tool_choice",
    ["required", {"type": "function", "function": {"name": "get_weather"}}],
    ids=["required", "named"],
)
def test_forced_tool_choice_returns_a_call(client, tool_choice):
    # The model would answer this in plain text; the forced choice must still call.
    question = [{"role": "user", "content": fixture.CAPITAL_QUESTION}]
    if not constrains_forced_calls():  # vLLM 0.23 cannot force it: a 400 naming the reason
        with pytest.raises(openai.BadRequestError, match=FORCED_CALL_REFUSAL):
            chat(client, question, [fixture.WEATHER_TOOL], tool_choice=tool_choice)
        return
    choice = chat(client, question, [fixture.WEATHER_TOOL], tool_choice=tool_choice)
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather"
    arguments = json.loads(call.function.arguments)
    assert set(arguments) == {"city", "days"}
    assert isinstance(arguments["days"], int)


def test_call_to_undeclared_tool_is_not_returned(client):
    case = conversation("undeclared-call")
    choice = chat(client, case.messages, case.tools)
    assert not choice.message.tool_calls
    assert choice.finish_reason == "stop"
    # Nothing the model wrote is lost: the markup stays visible as content.
    assert "get_weather" in choice.message.content


def test_concurrent_mixed_requests_match_sequential_answers(client):
    cases = [c for c in fixture.CONVERSATIONS if c.name != "undeclared-call"]

    def answer(case):
        choice = chat(client, case.messages, case.tools)
        calls = [(t.function.name, t.function.arguments) for t in choice.message.tool_calls or []]
        return choice.finish_reason, choice.message.content or "", calls

    alone = {c.name: answer(c) for c in cases}
    batch = [cases[i % len(cases)] for i in range(32)]
    with ThreadPoolExecutor(max_workers=32) as pool:
        together = list(pool.map(answer, batch))
    for case, result in zip(batch, together, strict=True):
        assert result == alone[case.name], case.name


# --- every OpenAI surface, at every cut -------------------------------------------------

QUESTION = [{"role": "user", "content": fixture.PARIS_QUESTION}]
REPLY = fixture.tool_call_text("get_weather", fixture.PARIS_CALL)
ARGUMENTS = json.dumps(fixture.PARIS_CALL, separators=(",", ":"))
RESPONSES_PATH = "the Responses path documented is vLLM 0.32's (SimpleStreamingEventProcessor)"
RESPONSES_TOOL = {"type": "function", **fixture.WEATHER_TOOL["function"]}


class GetWeather(pydantic.BaseModel):
    city: str
    days: int


@pytest.fixture(scope="module")
def model(client):
    return client.models.list().data[0].id


@pytest.fixture(scope="module")
def cuts(spark_chat_model):
    """Every ``max_tokens`` that ends the reply inside the call, the one that ends it
    right after ``</tool_call>`` (before the end-of-text token), and one that does
    not cut."""
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(spark_chat_model))
    reply_tokens = len(tokenizer.encode(REPLY, add_special_tokens=False))
    return [*range(1, reply_tokens + 1), 120]


def ask_weather(client, model, max_tokens, **kwargs):
    choice = chat(
        client, QUESTION, [fixture.WEATHER_TOOL], model=model, max_tokens=max_tokens, **kwargs
    )
    calls = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls or []]
    return choice.finish_reason, choice.message.content or "", calls


def chat_stream_helper(client, model, max_tokens):
    """``chat.completions.stream()``: the chunks it folds."""
    streamed = StreamedAnswer()
    with client.chat.completions.stream(
        model=model,
        messages=QUESTION,
        tools=[fixture.WEATHER_TOOL],
        temperature=0,
        max_tokens=max_tokens,
    ) as stream:
        for event in stream:
            if event.type == "chunk":
                streamed.add(event.chunk)
    return streamed.finish_reason, streamed.content, list(streamed.calls())


def check_stream_agrees(streamed_content, streamed_calls, content, calls):
    """The stream of a reply agrees with the reply (``stream_agrees``); vLLM 0.23,
    which never ends the parser's stream, sends a prefix of the content. A call
    the cut falls inside is, streamed, the reply's call as far as written."""
    streamed = Parsed(streamed_content or None, list(streamed_calls))
    if flushes_stream_end():
        assert stream_agrees(streamed, Parsed(content or None, calls)), (streamed, content)
    else:
        assert content.startswith(streamed_content) and streamed_calls[: len(calls)] == calls
    for name, arguments in streamed_calls[len(calls) :]:
        assert (name, ARGUMENTS.startswith(arguments)) == ("get_weather", True), arguments


def test_chat_completions_at_every_cut(client, model, cuts):
    """Not streamed, a cut call is content, verbatim, with ``length``; only a closed
    call is a call. Streamed, the call goes out as it is written and stops where
    the cut falls, with ``length``. Both agree on every closed call; vLLM 0.32
    rewrites the finish reason of a closed call cut before the end of the output to
    ``tool_calls`` unstreamed. vLLM 0.23 to 0.30 finish every stream that sent a
    call with ``tool_calls``."""
    whole = ("", [("get_weather", ARGUMENTS)])
    for max_tokens in cuts:
        finish_reason, content, calls = ask_weather(client, model, max_tokens)
        streamed_reason, streamed_content, streamed_calls = chat_stream_helper(
            client, model, max_tokens
        )
        check_stream_agrees(streamed_content, streamed_calls, content, calls)
        if max_tokens < cuts[-2]:
            marks_cut = keeps_length_for_cut_streamed_calls() or not streamed_calls
            assert streamed_reason == ("length" if marks_cut else "tool_calls"), max_tokens
            assert (finish_reason, calls) == ("length", [])
            assert content and REPLY.startswith(content), (max_tokens, content)
        elif max_tokens == cuts[-2]:
            assert (content, calls) == whole
            assert (finish_reason, streamed_reason) in {
                ("tool_calls", "length"),
                ("length", "length"),
                ("tool_calls", "tool_calls"),
            }
        else:
            assert (finish_reason, streamed_reason, content, calls) == ("tool_calls",) * 2 + whole


def responses_summary(response):
    calls = [(o.name, o.arguments) for o in response.output if o.type == "function_call"]
    text = "".join(part.text for o in response.output if o.type == "message" for part in o.content)
    return response.status, text, calls


@pytest.mark.skipif(not streams_responses_through_parser(), reason=RESPONSES_PATH)
def test_responses_api_at_every_cut(client, model, cuts):
    """``responses.create`` and ``responses.stream()`` agree at every cut as Chat
    Completions do: not streamed, no ``function_call`` item for a cut call (its
    text is a message); streamed, the call as far as written; status
    ``incomplete``. The stream ends with ``response.completed`` carrying that
    status (vLLM 0.32) or with ``response.incomplete`` (0.33)."""
    for max_tokens in cuts:
        kwargs = {"model": model, "input": fixture.PARIS_QUESTION, "tools": [RESPONSES_TOOL]}
        kwargs.update(temperature=0, max_output_tokens=max_tokens)
        response = client.responses.create(**kwargs)
        status, text, calls = responses_summary(response)
        if max_tokens < cuts[-2]:
            assert (status, calls) == ("incomplete", []), max_tokens
            assert text and REPLY.startswith(text), (max_tokens, text)
        else:
            assert (text, calls) == ("", [("get_weather", ARGUMENTS)])
        if max_tokens < cuts[-1]:
            assert status == "incomplete"
            assert response.incomplete_details.reason == "max_output_tokens"
        else:
            assert status == "completed"
        with client.responses.stream(**kwargs) as stream:
            streamed = list(stream)
        events = [event.type for event in streamed]
        own_event = status == "incomplete" and ends_incomplete_responses_with_their_own_event()
        assert events[-1] == ("response.incomplete" if own_event else "response.completed")
        final = streamed[-1].response
        assert "error" not in events
        if calls:  # the call's events, in order, its arguments as they were written
            added, *deltas, done, item_done = [
                e for e in events if "function_call" in e or "output_item" in e
            ]
            assert (added, done, item_done) == (
                "response.output_item.added",
                "response.function_call_arguments.done",
                "response.output_item.done",
            )
            assert set(deltas) == {"response.function_call_arguments.delta"}
        streamed_status, streamed_text, streamed_calls = responses_summary(final)
        assert streamed_status == status
        check_stream_agrees(streamed_text, streamed_calls, text, calls)
        raw = client.responses.create(**kwargs, stream=True)
        done = [event.item for event in raw if event.type == "response.output_item.done"]
        event_calls = [(i.name, i.arguments) for i in done if i.type == "function_call"]
        if final_response_is_the_streamed_items():
            assert event_calls == streamed_calls
        else:  # the final response is the whole output parsed afresh: a cut call is text
            assert event_calls[: len(calls)] == calls
            for name, arguments in event_calls[len(calls) :]:
                assert (name, ARGUMENTS.startswith(arguments)) == ("get_weather", True)
                assert "<tool_call>get_weather" in streamed_text


def test_chat_completions_parse_with_a_pydantic_function_tool(client, model):
    tool = openai.pydantic_function_tool(GetWeather, name="get_weather")
    for tool_choice in ("auto", "required"):
        if tool_choice == "required" and not constrains_forced_calls():
            with pytest.raises(openai.BadRequestError, match=FORCED_CALL_REFUSAL):
                client.chat.completions.parse(
                    model=model, messages=QUESTION, tools=[tool], tool_choice=tool_choice
                )
            continue
        completion = client.chat.completions.parse(
            model=model,
            messages=QUESTION,
            tools=[tool],
            tool_choice=tool_choice,
            temperature=0,
            max_tokens=120,
        )
        (call,) = completion.choices[0].message.tool_calls
        assert call.function.parsed_arguments == GetWeather(**fixture.PARIS_CALL)
    # Cut inside the call: no call to parse, and the SDK says why.
    with pytest.raises(openai.LengthFinishReasonError):
        client.chat.completions.parse(
            model=model, messages=QUESTION, tools=[tool], temperature=0, max_tokens=20
        )


def test_agent_loop_on_both_apis(client, model):
    """The call goes out, its result comes back, the next turn answers from it."""
    message = chat(client, QUESTION, [fixture.WEATHER_TOOL], model=model).message
    (call,) = message.tool_calls
    turn = [
        *QUESTION,
        message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": fixture.PARIS_TOOL_RESULT},
    ]
    answer = chat(client, turn, [fixture.WEATHER_TOOL], model=model)
    assert (answer.finish_reason, answer.message.content) == ("stop", fixture.PARIS_FOLLOW_UP)

    if not streams_responses_through_parser():
        return  # RESPONSES_PATH
    kwargs = {"model": model, "tools": [RESPONSES_TOOL], "temperature": 0}
    first = client.responses.create(input=fixture.PARIS_QUESTION, **kwargs)
    (item,) = first.output
    assert (item.type, item.name, item.arguments) == ("function_call", "get_weather", ARGUMENTS)
    result = {"type": "function_call_output", "call_id": item.call_id}
    result["output"] = fixture.PARIS_TOOL_RESULT
    turn = [*QUESTION, item.model_dump(exclude_none=True), result]
    second = client.responses.create(input=turn, **kwargs)
    assert (second.status, second.output_text) == ("completed", fixture.PARIS_FOLLOW_UP)


def test_tool_choice_none_returns_the_markup_without_or_with_its_tags(client, model):
    """The tags are special tokens: vLLM drops them unless the request keeps them."""
    _, stripped, calls = ask_weather(client, model, 120, tool_choice="none")
    assert calls == [] and stripped == "get_weathercityParisdays3"
    _, verbatim, calls = ask_weather(
        client, model, 120, tool_choice="none", extra_body={"skip_special_tokens": False}
    )
    assert calls == [] and verbatim == REPLY
