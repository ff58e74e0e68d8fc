"""An agent's turns at several tokens per delta, through ``vllm serve`` of the trained
fixture with ``--tool-call-parser spark25 --reasoning-parser holo2``: with
``--stream-interval 4`` and with ngram and EAGLE speculative decoding (each step
sends every accepted draft token at once), and with the interval that puts a
call's end and the text after it in the last delta. Chat Completions and the Responses
API, streamed (the openai SDK's stream helpers) and not: every call, and every
character of the reasoning and of the content, text after a call included, as
the fixture learnt to answer."""

from __future__ import annotations

import json
from typing import Any

import pytest

from carrier_harness.server import ServerFailed
from spark2_5_dev import fixture, speculative
from spark2_5_dev.chat import conversation
from spark2_5_dev.host_features import streams_responses_through_parser
from spark2_5_dev.streamed import StreamedAnswer, reasoning_of
from spark2_5_dev.tool_parsing import compact

pytestmark = [pytest.mark.serve, pytest.mark.slow]

# The fixture's turns with tools, as it learnt them: (reasoning, content, calls).
# Calls alone, a call after thinking with text around it, answers after a tool
# result and after thinking.
LEARNT = {
    "weather-call": (None, None, [("get_weather", compact(fixture.PARIS_CALL))]),
    "weather-call-unicode": (None, None, [("get_weather", compact(fixture.HEFEI_CALL))]),
    "time-call": (None, None, [("get_time", compact(fixture.TOKYO_CALL))]),
    "thinking-call-with-text": (
        fixture.FORECAST_REASONING,
        fixture.BEFORE_CALL + fixture.AFTER_CALL,
        [("get_weather", compact(fixture.PARIS_CALL))],
    ),
    "follow-up": (None, fixture.PARIS_FOLLOW_UP, []),
    "thinking-with-tools": (fixture.GREETING_REASONING, fixture.GREETING_ANSWER, []),
    "plain-with-tools": (None, fixture.CAPITAL_ANSWER, []),
}
STREAM_INTERVAL = ["--stream-interval", "4"]
NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2}
# What this vLLM's CPU build raises where it cannot decode speculatively at all
# (test_speculative.py names the releases): the server does not start.
HOST_SPECULATION_BUGS = ("USE_FP64_GUMBEL", "Cannot inspect kernel parameters")


def interval_to_the_close(model: Any) -> int:
    """The ``--stream-interval`` whose last delta of the thinking call with text starts
    at ``</tool_call>`` and carries the text after it: vLLM sends the first token
    alone, then every N; the call opened in the delta before."""
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(model))
    reply = conversation("thinking-call-with-text").reply
    tokens = tokenizer.encode(reply + tokenizer.eos_token, add_special_tokens=False)
    close = tokens.index(tokenizer.convert_tokens_to_ids("</tool_call>"))
    assert len(tokens) <= 2 * close - 1, "the text after the call fits the last delta"
    return close - 1


def speculation_args(name: str, model: Any, workdir: Any) -> list[str]:
    if name == "stream-interval-4":
        return STREAM_INTERVAL
    if name == "stream-interval-to-the-close":
        return ["--stream-interval", str(interval_to_the_close(model))]
    config = NGRAM
    if name == "eagle":
        head = speculative.build_head(model, workdir / "eagle-head", eagle3=False)
        config = {"method": "eagle", "model": str(head), "num_speculative_tokens": 3}
    return ["--speculative-config", json.dumps(config)]


@pytest.fixture(
    scope="module", params=["stream-interval-4", "stream-interval-to-the-close", "ngram", "eagle"]
)
def client(request, spark_chat_model, carrier_enabled_server, tmp_path_factory):
    workdir = tmp_path_factory.mktemp(request.param)
    args = [
        *fixture.SERVE_ARGS,
        "--reasoning-parser",
        "holo2",
        *speculation_args(request.param, spark_chat_model, workdir),
    ]
    try:
        with carrier_enabled_server(spark_chat_model, args) as server:
            yield server.openai_client()
    except ServerFailed as failed:
        if request.param.startswith("stream-interval") or not any(
            bug in str(failed) for bug in HOST_SPECULATION_BUGS
        ):
            raise
        pytest.xfail(f"this vLLM's CPU build cannot decode speculatively: {str(failed)[-300:]}")


def chat_kwargs(client, case: fixture.Conversation) -> dict[str, Any]:
    return {
        "model": client.models.list().data[0].id,
        "messages": case.messages,
        "tools": case.tools,
        "temperature": 0,
        "max_tokens": 120,
        # holo2 reads an output as thinking unless the request turns thinking off, as
        # the turns the fixture learnt without it do (no <think> in their prompt).
        "extra_body": {"chat_template_kwargs": case.chat_template_kwargs or fixture.THINKING_OFF},
    }


def chat_created(client, case) -> tuple:
    message = client.chat.completions.create(**chat_kwargs(client, case)).choices[0].message
    calls = [(call.function.name, call.function.arguments) for call in message.tool_calls or []]
    return reasoning_of(message) or None, message.content or None, calls


def chat_streamed(client, case) -> tuple:
    """``chat.completions.stream()``: every chunk it folds, each call begun with its id."""
    answer = StreamedAnswer()
    with client.chat.completions.stream(**chat_kwargs(client, case)) as stream:
        for event in stream:
            if event.type == "chunk":
                answer.add(event.chunk)
    return answer.reasoning or None, answer.content or None, list(answer.calls())


def responses_kwargs(client, case: fixture.Conversation) -> dict[str, Any]:
    kwargs = chat_kwargs(client, case)
    return {
        "model": kwargs["model"],
        "input": [message for message in case.messages if message["role"] == "user"],
        "tools": [{"type": "function", **tool["function"]} for tool in case.tools],
        "temperature": 0,
        "max_output_tokens": 120,
        "extra_body": kwargs["extra_body"],
    }


def responses_summary(items) -> tuple:
    reasoning = "".join(
        part.text for item in items if item.type == "reasoning" for part in item.content or []
    )
    text = "".join(part.text for item in items if item.type == "message" for part in item.content)
    calls = [(item.name, item.arguments) for item in items if item.type == "function_call"]
    return reasoning or None, text or None, calls


def responses_created(client, case) -> tuple:
    return responses_summary(client.responses.create(**responses_kwargs(client, case)).output)


def responses_streamed(client, case) -> tuple:
    """``responses.stream()``: the items its events completed, and every text delta."""
    items, text_deltas = [], []
    with client.responses.stream(**responses_kwargs(client, case)) as stream:
        for event in stream:
            if event.type == "response.output_item.done":
                items.append(event.item)
            elif event.type == "response.output_text.delta":
                text_deltas.append(event.delta)
        final = stream.get_final_response()
    summary = responses_summary(items)
    assert summary == responses_summary(final.output)
    assert "".join(text_deltas) == (summary[1] or "")
    return summary


# Only the turns without a tool result: the Responses input here is the user's text.
RESPONSES_CASES = [name for name in LEARNT if name != "follow-up"]


@pytest.mark.parametrize("name", LEARNT)
def test_chat_streamed_and_not_is_the_learnt_turn(client, name):
    case = conversation(name)
    assert chat_created(client, case) == chat_streamed(client, case) == LEARNT[name]


@pytest.mark.parametrize("name", RESPONSES_CASES)
def test_responses_streamed_and_not_is_the_learnt_turn(client, name):
    if not streams_responses_through_parser():
        pytest.skip("this vLLM's Responses API does not run the serving-layer parsers")
    case = conversation(name)
    assert responses_created(client, case) == responses_streamed(client, case) == LEARNT[name]
