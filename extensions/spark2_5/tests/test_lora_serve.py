"""``vllm serve --enable-lora --lora-modules`` with the trained fixture and two
adapters trained on it (PEFT layout), driven by the ``openai`` client: a request
naming an adapter gets its answer, one naming the base model the fixture's,
adapters and the base model share batches, and tool calls still parse."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from spark2_5_dev import fixture, lora
from spark2_5_dev.chat import chat, conversation

pytestmark = [pytest.mark.serve, pytest.mark.slow]

ANSWERS = {name: answer for name, (answer, _) in lora.FIXTURE_ADAPTERS.items()}
QUESTION = [{"role": "user", "content": fixture.CAPITAL_QUESTION}]


@pytest.fixture(scope="module")
def server(spark_chat_model, carrier_enabled_server):
    adapters = lora.build_fixture_adapters(spark_chat_model)
    modules = [f"{name}={path}" for name, path in adapters.items()]
    args = [
        *fixture.SERVE_ARGS,
        "--enable-lora",
        "--lora-modules",
        *modules,
        # One slot more than adapters: with every slot taken, vLLM's CPU LoRA ops
        # apply the last slot's adapter to requests without one.
        "--max-loras",
        str(len(adapters) + 1),
        "--max-lora-rank",
        "8",
    ]
    with carrier_enabled_server(spark_chat_model, args) as running:
        running.base_model = str(spark_chat_model)
        yield running


def test_the_adapters_are_listed_beside_the_base_model(client, server):
    listed = {model.id for model in client.models.list().data}
    assert listed == {server.base_model, *ANSWERS}


def test_the_base_model_answers_as_trained(client, server):
    choice = chat(client, QUESTION, model=server.base_model)
    assert (choice.finish_reason, choice.message.content) == ("stop", fixture.CAPITAL_ANSWER)


@pytest.mark.parametrize("adapter", list(ANSWERS))
def test_a_request_naming_an_adapter_gets_its_answer(client, adapter):
    choice = chat(client, QUESTION, model=adapter)
    assert (choice.finish_reason, choice.message.content) == ("stop", ANSWERS[adapter])
    assert ANSWERS[adapter] != fixture.CAPITAL_ANSWER


def test_the_base_model_and_both_adapters_in_one_batch(client, server):
    expected = {server.base_model: fixture.CAPITAL_ANSWER, **ANSWERS}
    models = [list(expected)[i % len(expected)] for i in range(24)]
    with ThreadPoolExecutor(max_workers=len(models)) as pool:
        replies = pool.map(lambda model: chat(client, QUESTION, model=model), models)
        answers = [reply.message.content for reply in replies]
    assert answers == [expected[model] for model in models]


@pytest.mark.parametrize("model", ["base", "paris-first"])
def test_tool_calls_still_parse(client, server, model):
    weather = conversation("weather-call")
    name = server.base_model if model == "base" else model
    choice = chat(client, weather.messages, weather.tools, model=name)
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == fixture.PARIS_CALL


def test_an_unknown_adapter_name_is_a_404_naming_it(client):
    with pytest.raises(openai.NotFoundError) as error:
        chat(client, QUESTION, model="no-such-adapter")
    assert "no-such-adapter" in str(error.value)
