"""Thinking split from the answer through ``vllm serve --tool-call-parser spark25
--reasoning-parser holo2`` of the trained fixture, whose tokenizer has ``</think>``
as a special token like the real one: every request, with tools or without,
streamed or not, Chat Completions and Responses, gets the same split."""

from __future__ import annotations

import openai
import pytest

from spark2_5_dev import fixture
from spark2_5_dev.host_features import (
    adjusts_every_request_with_a_reasoning_parser,
    streams_responses_through_parser,
)
from spark2_5_dev.streamed import StreamedAnswer, reasoning_of
from spark2_5_dev.tools import WEATHER_TOOL

pytestmark = pytest.mark.serve

MESSAGES = [{"role": "user", "content": fixture.GREETING}]
SPLIT = (fixture.GREETING_REASONING, fixture.GREETING_ANSWER)
TOOLS = {"no-tools": None, "tools": [WEATHER_TOOL]}
OLD_RELEASES_DROP_THINK = (
    "this vLLM asks no tool parser about a request without tools, so its detokenizer "
    "drops </think> (a special token) before the reasoning parser reads the answer"
)


def expect_split(split, tools, streamed):
    """``split`` is the thinking and the answer, except where vLLM drops ``</think>``."""
    dropped = split != SPLIT and not tools and not streamed
    if dropped and not adjusts_every_request_with_a_reasoning_parser():
        pytest.xfail(OLD_RELEASES_DROP_THINK)
    assert split == SPLIT


@pytest.fixture(scope="module")
def server(spark_chat_model, carrier_enabled_server):
    args = [*fixture.SERVE_ARGS, "--reasoning-parser", "holo2"]
    with carrier_enabled_server(spark_chat_model, args) as running:
        yield running


def chat_args(client, tools, thinking):
    return {
        "model": client.models.list().data[0].id,
        "messages": MESSAGES,
        "tools": tools or openai.omit,
        "temperature": 0,
        "max_tokens": 60,
        "extra_body": {"chat_template_kwargs": {"enable_thinking": thinking}},
    }


def chat_split(client, tools, thinking):
    message = client.chat.completions.create(**chat_args(client, tools, thinking)).choices[0]
    return reasoning_of(message.message), message.message.content


def streamed_chat_split(client, tools, thinking):
    answer = StreamedAnswer()
    for chunk in client.chat.completions.create(**chat_args(client, tools, thinking), stream=True):
        answer.add(chunk)
    assert not answer.calls()
    return answer.reasoning or None, answer.content or None


@pytest.mark.parametrize("tools", TOOLS.values(), ids=TOOLS)
@pytest.mark.parametrize("split", [chat_split, streamed_chat_split], ids=["create", "stream"])
def test_chat_splits_thinking_from_the_answer(client, split, tools):
    expect_split(split(client, tools, thinking=True), tools, split is streamed_chat_split)
    if not tools:  # the fixture learnt to answer without thinking only here
        assert split(client, tools, thinking=False) == (None, fixture.GREETING_ANSWER)


def responses_split(response):
    reasoning = [
        part.text
        for item in response.output
        if item.type == "reasoning"
        for part in (item.content or item.summary or [])
    ]
    return "".join(reasoning) or None, response.output_text


@pytest.mark.parametrize("tools", TOOLS.values(), ids=TOOLS)
def test_responses_split_thinking_from_the_answer(client, tools):
    if not streams_responses_through_parser():
        pytest.skip("this vLLM's Responses API does not run the serving-layer parsers")
    kwargs = {
        "model": client.models.list().data[0].id,
        "input": fixture.GREETING,
        "tools": [{"type": "function", **WEATHER_TOOL["function"]}] if tools else openai.omit,
        "temperature": 0,
        "max_output_tokens": 60,
        "extra_body": {"chat_template_kwargs": {"enable_thinking": True}},
    }
    expect_split(responses_split(client.responses.create(**kwargs)), tools, streamed=False)
    with client.responses.stream(**kwargs) as stream:
        assert responses_split(stream.get_final_response()) == SPLIT


def test_without_a_reasoning_parser_the_thinking_stays_in_the_content(
    spark_chat_model, carrier_enabled_server
):
    """Nothing is split and nothing is lost; ``</think>`` is kept where vLLM asks the
    tool parser (tools offered) and dropped as a special token otherwise."""
    with carrier_enabled_server(spark_chat_model, fixture.SERVE_ARGS) as server:
        client = server.openai_client()
        for tools, tag in (TOOLS["tools"], "</think>"), (None, ""):
            reasoning, content = chat_split(client, tools, thinking=True)
            assert (reasoning, content) == (None, tag.join(SPLIT))
