"""Faulty LoRA adapters loaded at run time into ``vllm serve`` (trained fixture, one
good adapter loaded at start): none changes another request's output.

Answers of the base model and of the good adapter (greedy, a plain answer and a
tool call) are taken before any faulty adapter is used, and compared after each.
Adapters the carrier can see are wrong are refused naming the tensor; those
vLLM refuses before the carrier sees them get vLLM's error, which
``docs/lora-and-quantization.md`` quotes; one whose finite weights overflow the
activations loads, answers garbage, and leaves the other requests' answers as
they were, also in the same batch.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from carrier_harness.server import run_vllm_serve_expecting_failure
from spark2_5_dev import fixture, lora, lora_faults
from spark2_5_dev.carrier import clean_env
from spark2_5_dev.chat import chat

pytestmark = [pytest.mark.serve, pytest.mark.slow]

GOOD = "paris-first"
DOCS = Path(__file__).parents[1] / "docs" / "lora-and-quantization.md"
CONVERSATIONS = [c for c in fixture.CONVERSATIONS if c.name in ("plain", "weather-call")]
# What vLLM 0.32 answers /v1/load_lora_adapter for the adapters it refuses itself.
VLLM_ERRORS = {
    "config-not-json": (
        500,
        "Worker failed with error 'Expecting property name enclosed in double quotes: "
        "line 1 column 2 (char 1)'",
    ),
    "dora": (500, "Worker failed with error 'vLLM does not yet support DoRA.'"),
    "rank-above-max-lora-rank": (
        500,
        "Worker failed with error 'LoRA rank 64 is greater than max_lora_rank 8.'",
    ),
    "no-weights": (500, "doesn't contain tensors'"),
    "truncated-weights": (
        500,
        "Worker failed with error 'Error while deserializing header: incomplete metadata, "
        "file not fully covered'",
    ),
    "no-config": (404, "failed: No adapter found for"),
}


@pytest.fixture(scope="module")
def server(spark_chat_model, carrier_enabled_server):
    adapters = lora.build_fixture_adapters(spark_chat_model)
    args = [
        *fixture.SERVE_ARGS,
        "--enable-lora",
        "--lora-modules",
        f"{GOOD}={adapters[GOOD]}",
        # The good adapter and the overflowing one, plus the slot vLLM's CPU LoRA
        # ops give requests without an adapter.
        "--max-loras",
        "3",
        "--max-lora-rank",
        "8",
    ]
    with carrier_enabled_server(
        spark_chat_model, args, VLLM_ALLOW_RUNTIME_LORA_UPDATING="true"
    ) as running:
        running.base_model = str(spark_chat_model)
        running.good_adapter = adapters[GOOD]
        yield running


def answer(client, model, conversation):
    """The greedy reply: its text and its tool calls, as the client gets them."""
    choice = chat(client, conversation.messages, conversation.tools, model=model, max_tokens=80)
    calls = [
        (c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls or []
    ]
    return choice.message.content, calls


def all_answers(client, server):
    return {
        (model, c.name): answer(client, model, c)
        for model in (server.base_model, GOOD)
        for c in CONVERSATIONS
    }


@pytest.fixture(scope="module")
def before(client, server):
    """Every answer before a faulty adapter was used."""
    answers = all_answers(client, server)
    assert answers[(server.base_model, "plain")] == (fixture.CAPITAL_ANSWER, [])
    assert answers[(GOOD, "weather-call")][1] == [("get_weather", fixture.PARIS_CALL)]
    return answers


def load(server, name, path, **options):
    return httpx.post(
        f"{server.base_url}/v1/load_lora_adapter",
        json={"lora_name": name, "lora_path": str(path), **options},
        timeout=120,
    )


def listed(client):
    return {model.id for model in client.models.list().data}


@pytest.mark.parametrize("case", list(lora_faults.REFUSED_BY_THE_CARRIER))
def test_a_wrong_adapter_is_refused_naming_the_tensor(case, server, client, before, tmp_path):
    fault = lora_faults.REFUSED_BY_THE_CARRIER[case]
    path = lora_faults.faulty_adapter(server.good_adapter, fault, tmp_path / case)
    response = load(server, case, path)
    # vLLM answers every error raised while the engine adds an adapter with 500.
    assert response.status_code == 500
    message = response.json()["error"]["message"]
    assert f"LoRA adapter tensor {fault.tensor!r}" in message
    assert case not in listed(client)
    assert all_answers(client, server) == before


def test_a_wrong_adapter_reloaded_in_place_of_a_good_one_leaves_it_answering(
    server, client, before, tmp_path
):
    fault = lora_faults.REFUSED_BY_THE_CARRIER["qkv-lora-b-row-short"]
    path = lora_faults.faulty_adapter(server.good_adapter, fault, tmp_path / "in-place")
    response = load(server, GOOD, path, load_inplace=True)
    assert response.status_code == 500
    assert fault.tensor in response.json()["error"]["message"]
    assert all_answers(client, server) == before


@pytest.mark.parametrize("case", list(VLLM_ERRORS))
def test_a_malformed_adapter_gets_the_error_the_docs_quote(case, server, client, before, tmp_path):
    path = lora_faults.faulty_adapter(
        server.good_adapter, lora_faults.REFUSED_BY_VLLM[case], tmp_path / case
    )
    response = load(server, case, path)
    status, quoted = VLLM_ERRORS[case]
    assert (response.status_code, quoted in response.json()["error"]["message"]) == (status, True)
    assert quoted in " ".join(DOCS.read_text(encoding="utf-8").split())
    assert case not in listed(client)
    assert all_answers(client, server) == before


def test_an_overflowing_adapter_changes_no_other_request(server, client, before, tmp_path):
    path = lora_faults.faulty_adapter(
        server.good_adapter, lora_faults.LOADED["overflowing"], tmp_path / "overflowing"
    )
    assert load(server, "overflowing", path).status_code == 200
    plain = CONVERSATIONS[0]
    garbage = answer(client, "overflowing", plain)
    assert garbage != before[(GOOD, "plain")]
    # The same batch: the overflowing adapter's requests beside everyone else's.
    keys = [*before, *[("overflowing", "plain")] * 4]
    conversations = {c.name: c for c in CONVERSATIONS}
    with ThreadPoolExecutor(max_workers=len(keys)) as pool:
        answers = list(pool.map(lambda k: answer(client, k[0], conversations[k[1]]), keys))
    assert dict(zip(keys[: len(before)], answers, strict=False)) == before
    assert all_answers(client, server) == before
    unloaded = httpx.post(
        f"{server.base_url}/v1/unload_lora_adapter", json={"lora_name": "overflowing"}
    )
    assert unloaded.status_code == 200
    assert all_answers(client, server) == before


def test_a_wrong_adapter_given_at_start_stops_the_server_naming_the_tensor(
    spark_chat_model, server, tmp_path
):
    fault = lora_faults.REFUSED_BY_THE_CARRIER["lora-a-rank-4-of-8"]
    path = lora_faults.faulty_adapter(server.good_adapter, fault, tmp_path / "at-start")
    server.stop()  # one vLLM at a time; this is the module's last test
    args = [*fixture.SERVE_ARGS, "--enable-lora", "--lora-modules", f"bad={path}"]
    done = run_vllm_serve_expecting_failure(
        spark_chat_model, args, env=clean_env(SPARK2_5_PLUGIN_ENABLE="1"), timeout=420
    )
    assert done.returncode != 0
    assert f"LoRA adapter tensor {fault.tensor!r} has shape [4, 128], expected [8, 128]" in (
        done.stdout + done.stderr
    )
