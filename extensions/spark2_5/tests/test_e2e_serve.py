"""End to end through the front door: ``vllm serve`` of the trained Spark2_5 fixture
with ``--enable-auto-tool-choice --tool-call-parser spark25`` (carrier enabled, no
``--trust-remote-code``), driven by the official ``openai`` client."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from carrier_harness.server import VllmServer
from spark2_5_dev import fixture
from spark2_5_dev.carrier import clean_env
from spark2_5_dev.host_features import FORCED_CALL_REFUSAL, constrains_forced_calls

pytestmark = pytest.mark.serve


@pytest.fixture(scope="module")
def server(spark_chat_model, tmp_path_factory):
    log = tmp_path_factory.mktemp("e2e") / "serve.log"
    env = clean_env(SPARK2_5_PLUGIN_ENABLE="1")
    with VllmServer(spark_chat_model, fixture.SERVE_ARGS, env=env, log_path=log) as running:
        yield running


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)


def chat(client, messages, tools=None, **kwargs):
    return client.chat.completions.create(
        model=client.models.list().data[0].id,
        messages=messages,
        tools=tools or openai.omit,
        temperature=0,
        max_tokens=120,
        **kwargs,
    )


def conversation(name: str) -> fixture.Conversation:
    return next(c for c in fixture.CONVERSATIONS if c.name == name)


def test_served_without_remote_code(server):
    log = server.log()
    assert "Resolved architecture: Spark2_5ForCausalLM" in log
    assert "trust_remote_code=False" in log


def test_plain_chat(client):
    reply = chat(client, [{"role": "user", "content": fixture.CAPITAL_QUESTION}])
    choice = reply.choices[0]
    assert choice.finish_reason == "stop"
    assert choice.message.content == fixture.CAPITAL_ANSWER
    assert not choice.message.tool_calls


def test_plain_answer_when_tools_are_offered_but_not_needed(client):
    plain = conversation("plain-with-tools")
    choice = chat(client, plain.messages, plain.tools).choices[0]
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
    choice = chat(client, case.messages, case.tools).choices[0]
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


def test_streamed_tool_call_arrives_whole(client):
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
    # One delta, sent when the call closed: id, name and the whole arguments.
    (event,) = events
    assert event.index == 0 and event.id and event.function.name == "get_weather"
    assert json.loads(event.function.arguments) == fixture.PARIS_CALL


def test_follow_up_after_tool_result(client):
    case = conversation("follow-up")
    choice = chat(client, case.messages, case.tools).choices[0]
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
    choice = chat(client, question, [fixture.WEATHER_TOOL], tool_choice=tool_choice).choices[0]
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather"
    arguments = json.loads(call.function.arguments)
    assert set(arguments) == {"city", "days"}
    assert isinstance(arguments["days"], int)


def test_call_to_undeclared_tool_is_not_returned(client):
    case = conversation("undeclared-call")
    choice = chat(client, case.messages, case.tools).choices[0]
    assert not choice.message.tool_calls
    assert choice.finish_reason == "stop"
    # Nothing the model wrote is lost: the markup stays visible as content.
    assert "get_weather" in choice.message.content


def test_concurrent_mixed_requests_match_sequential_answers(client):
    cases = [c for c in fixture.CONVERSATIONS if c.name != "undeclared-call"]

    def answer(case):
        choice = chat(client, case.messages, case.tools).choices[0]
        calls = [(t.function.name, t.function.arguments) for t in choice.message.tool_calls or []]
        return choice.finish_reason, choice.message.content or "", calls

    alone = {c.name: answer(c) for c in cases}
    batch = [cases[i % len(cases)] for i in range(32)]
    with ThreadPoolExecutor(max_workers=32) as pool:
        together = list(pool.map(answer, batch))
    for case, result in zip(batch, together, strict=True):
        assert result == alone[case.name], case.name
