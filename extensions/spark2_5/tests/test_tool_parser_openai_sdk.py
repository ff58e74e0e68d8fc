"""Every OpenAI surface ``vllm serve`` offers, through the ``openai`` SDK, at every
``max_tokens`` cut of a tool call: the trained Spark2_5 fixture (it answers the
Paris question with a ``get_weather`` call, and the tool result with a
follow-up), served once for the whole module.

Chat Completions (``create``, ``stream()``, ``parse()`` with
``pydantic_function_tool``) and the Responses API (``create``, ``stream()``)
return the same thing streamed or not, never a cut call as a call, and carry the
agent loop (tool result back, next turn); ``tool_choice="none"`` returns the
markup without or with its tags as ``docs/tool-calling.md`` says."""

from __future__ import annotations

import json

import openai
import pydantic
import pytest
from transformers import PreTrainedTokenizerFast

from carrier_harness.server import VllmServer
from spark2_5_dev import fixture
from spark2_5_dev.carrier import clean_env
from spark2_5_dev.streamed import StreamedAnswer
from spark2_5_dev.tools import WEATHER_TOOL

pytestmark = pytest.mark.serve

QUESTION = [{"role": "user", "content": fixture.PARIS_QUESTION}]
REPLY = fixture.tool_call_text("get_weather", fixture.PARIS_CALL)
ARGUMENTS = json.dumps(fixture.PARIS_CALL, separators=(",", ":"))
RESPONSES_TOOL = {"type": "function", **WEATHER_TOOL["function"]}


class GetWeather(pydantic.BaseModel):
    city: str
    days: int


@pytest.fixture(scope="module")
def server(spark_chat_model, tmp_path_factory):
    log = tmp_path_factory.mktemp("openai-sdk") / "serve.log"
    env = clean_env(SPARK2_5_PLUGIN_ENABLE="1")
    with VllmServer(spark_chat_model, fixture.SERVE_ARGS, env=env, log_path=log) as running:
        yield running


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)


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


def chat(client, model, max_tokens, **kwargs):
    choice = client.chat.completions.create(
        model=model,
        messages=QUESTION,
        tools=[WEATHER_TOOL],
        temperature=0,
        max_tokens=max_tokens,
        **kwargs,
    ).choices[0]
    calls = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls or []]
    return choice.finish_reason, choice.message.content or "", calls


def chat_stream_helper(client, model, max_tokens):
    """``chat.completions.stream()``: its events, and the chunks it folds."""
    streamed = StreamedAnswer()
    with client.chat.completions.stream(
        model=model,
        messages=QUESTION,
        tools=[WEATHER_TOOL],
        temperature=0,
        max_tokens=max_tokens,
    ) as stream:
        for event in stream:
            if event.type == "chunk":
                streamed.add(event.chunk)
    assert not streamed.split_calls(), streamed
    return streamed.finish_reason, streamed.content, list(streamed.calls())


def test_chat_completions_at_every_cut(client, model, cuts):
    """A cut call is content, verbatim, with ``length``; only a closed call is a call.
    ``create`` and ``stream()`` agree, but for the finish reason of a closed call cut
    before the end of the output: vLLM rewrites it to ``tool_calls`` unstreamed."""
    whole = ("tool_calls", "", [("get_weather", ARGUMENTS)])
    for max_tokens in cuts:
        finish_reason, content, calls = chat(client, model, max_tokens)
        streamed = chat_stream_helper(client, model, max_tokens)
        if max_tokens < cuts[-2]:
            assert (finish_reason, calls) == ("length", []), max_tokens
            assert content and REPLY.startswith(content), (max_tokens, content)
            assert streamed == (finish_reason, content, calls), max_tokens
        elif max_tokens == cuts[-2]:
            assert (finish_reason, content, calls) == whole
            assert streamed == ("length", content, calls)
        else:
            assert (finish_reason, content, calls) == whole
            assert streamed == whole


def responses_summary(response):
    calls = [(o.name, o.arguments) for o in response.output if o.type == "function_call"]
    text = "".join(part.text for o in response.output if o.type == "message" for part in o.content)
    return response.status, text, calls


def test_responses_api_at_every_cut(client, model, cuts):
    """``responses.create`` and ``responses.stream()`` agree at every cut: no
    ``function_call`` item for a cut call (its text is a message), status
    ``incomplete``; the stream ends with ``response.completed`` carrying that status."""
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
            events = [event.type for event in stream]
            final = stream.get_final_response()
        assert events[-1] == "response.completed", max_tokens
        assert "error" not in events
        if calls:  # the call's events, in order, its arguments in one delta
            assert [e for e in events if "function_call" in e or "output_item" in e] == [
                "response.output_item.added",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.done",
                "response.output_item.done",
            ]
        assert responses_summary(final) == (status, text, calls), max_tokens
        raw = client.responses.create(**kwargs, stream=True)
        done = [event.item for event in raw if event.type == "response.output_item.done"]
        assert [(i.name, i.arguments) for i in done if i.type == "function_call"] == calls


def test_chat_completions_parse_with_a_pydantic_function_tool(client, model):
    tool = openai.pydantic_function_tool(GetWeather, name="get_weather")
    for tool_choice in ("auto", "required"):
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
    message = (
        client.chat.completions.create(
            model=model, messages=QUESTION, tools=[WEATHER_TOOL], temperature=0, max_tokens=120
        )
        .choices[0]
        .message
    )
    (call,) = message.tool_calls
    turn = [
        *QUESTION,
        message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": fixture.PARIS_TOOL_RESULT},
    ]
    answer = client.chat.completions.create(
        model=model, messages=turn, tools=[WEATHER_TOOL], temperature=0, max_tokens=120
    ).choices[0]
    assert (answer.finish_reason, answer.message.content) == ("stop", fixture.PARIS_FOLLOW_UP)

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
    _, stripped, calls = chat(client, model, 120, tool_choice="none")
    assert calls == [] and stripped == "get_weathercityParisdays3"
    _, verbatim, calls = chat(
        client, model, 120, tool_choice="none", extra_body={"skip_special_tokens": False}
    )
    assert calls == [] and verbatim == REPLY
