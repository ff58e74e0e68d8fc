"""``spark25`` behind a real ``vllm serve`` (carrier enabled), driven by the ``openai``
client. The model is the tiny random Llama with Spark2_5's tokenizer, so what it
says is arbitrary: the tests assert only what must hold for any model, which is
exactly what the parser and guided decoding guarantee. ``tool_choice="required"``
and a named tool still return a Spark-format call holding every required key,
streaming returns what the non-streaming request returns, and bad input gets a
clear error."""

from __future__ import annotations

import json

import openai
import pytest

from carrier_harness.project import PROJECT_ROOT
from carrier_harness.server import run_vllm_serve_expecting_failure
from spark2_5_dev import tools
from spark2_5_dev.carrier import clean_env
from spark2_5_dev.host_features import FORCED_CALL_REFUSAL, constrains_forced_calls
from spark2_5_dev.streamed import StreamedAnswer
from spark2_5_dev.tool_parsing import Parsed, stream_agrees
from spark2_5_dev.tools import with_parameters

pytestmark = pytest.mark.serve

SERVE_ARGS = [
    "--enable-auto-tool-choice",
    "--tool-call-parser",
    "spark25",
    # Two identical greedy requests must compute identically.
    "--no-enable-prefix-caching",
]
# Enums and booleans keep a random model's constrained arguments short; a forced
# call must hold the required keys, which a random model would rarely write unasked.
WEATHER_TOOL = with_parameters(
    tools.WEATHER_TOOL,
    {"city": {"type": "string", "enum": ["Paris", "Rome"]}, "metric": {"type": "boolean"}},
    required=("city", "metric"),
)
TIME_TOOL = with_parameters(
    tools.TIME_TOOL, {"zone": {"type": "string", "enum": ["UTC", "CET"]}}, required=("zone",)
)
STRICT_TOOL = with_parameters(
    tools.WEATHER_TOOL, {"metric": {"type": "boolean"}}, required=("metric",), strict=True
)
STRICT_TOOL["function"]["parameters"]["additionalProperties"] = False
README = PROJECT_ROOT / "README.md"
NAMED = {"type": "function", "function": {"name": "get_time"}}
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def server(tiny_llama, carrier_enabled_server):
    with carrier_enabled_server(tiny_llama, SERVE_ARGS) as running:
        yield running


def request_args(client, tools, tool_choice, **extra):
    return {
        "model": client.models.list().data[0].id,
        "messages": MESSAGES,
        "tools": tools,
        "tool_choice": tool_choice,
        "temperature": 0,
        "max_tokens": 160,
        **extra,
    }


def complete(client, **args):
    choice = client.chat.completions.create(**args).choices[0]
    tool_calls = choice.message.tool_calls or []
    assert all(call.id and call.type == "function" for call in tool_calls)
    calls = [(call.function.name, call.function.arguments) for call in tool_calls]
    return choice.finish_reason, choice.message.content or "", calls


def stream(client, **args):
    """Accumulate a streamed answer like a client (each call begins with its id and
    name)."""
    streamed = StreamedAnswer()
    for chunk in client.chat.completions.create(stream=True, **args):
        streamed.add(chunk)
    return streamed.finish_reason, streamed.content, list(streamed.calls())


def check_arguments(calls, tools, forced=False):
    """Each call names a declared tool; its arguments are a JSON object whose keys
    are declared (every required one, when the call was forced) and whose values
    have the declared types."""
    schemas = {tool["function"]["name"]: tool["function"]["parameters"] for tool in tools}
    for name, arguments in calls:
        properties = schemas[name]["properties"]
        decoded = json.loads(arguments)
        assert isinstance(decoded, dict) and set(decoded) <= set(properties), arguments
        if forced:
            assert set(schemas[name]["required"]) <= set(decoded), arguments
        for key, value in decoded.items():
            if "enum" in properties[key]:
                assert value in properties[key]["enum"], arguments
            else:
                assert isinstance(value, bool), arguments


@pytest.mark.parametrize(
    ("tools", "tool_choice", "names"),
    [
        ([WEATHER_TOOL, TIME_TOOL], "required", {"get_weather", "get_time"}),
        ([WEATHER_TOOL, TIME_TOOL], NAMED, {"get_time"}),
        ([STRICT_TOOL], "required", {"get_weather"}),
    ],
    ids=["required", "named", "required-strict"],
)
def test_forced_tool_choice_returns_a_spark_call_streamed_or_not(client, tools, tool_choice, names):
    args = request_args(client, tools, tool_choice, parallel_tool_calls=False)
    if not constrains_forced_calls():  # vLLM 0.23: refused, streamed or not
        for create in (complete, stream):
            with pytest.raises(openai.BadRequestError, match=FORCED_CALL_REFUSAL):
                create(client, **args)
        return
    finish_reason, content, calls = complete(client, **args)
    if not calls:
        # The random model may pad a strict value with whitespace until max_tokens
        # cuts the call: then it is no call, its text (a forced Spark call's start)
        # is the content.
        assert finish_reason == "length", (finish_reason, content)
        assert any(content.startswith(f"<tool_call>{name}") for name in names), content
    else:
        assert len(calls) == 1 and calls[0][0] in names, (finish_reason, content, calls)
    check_arguments(calls, tools, forced=True)
    # OpenAI reports a named call with "stop", a required one with "tool_calls";
    # before 0.32 vLLM's non-streaming path may say "length" where the stream says
    # "tool_calls" for the same tokens.
    reasons = {"stop", "length"} if tool_choice == NAMED else {"tool_calls", "length"}
    assert finish_reason in reasons
    streamed_reason, streamed_content, streamed_calls = stream(client, **args)
    assert streamed_reason in reasons
    streamed = Parsed(streamed_content or None, streamed_calls)
    assert stream_agrees(streamed, Parsed(content or None, calls)), (streamed, content, calls)


def test_auto_tool_choice_streams_what_it_returns(client):
    tools = [WEATHER_TOOL, TIME_TOOL]
    args = request_args(client, tools, "auto")
    finish_reason, content, calls = complete(client, **args)
    assert finish_reason in ("stop", "length", "tool_calls")
    check_arguments(calls, tools)
    streamed_reason, streamed_content, streamed_calls = stream(client, **args)
    assert streamed_reason == finish_reason
    assert stream_agrees(
        Parsed(streamed_content or None, streamed_calls), Parsed(content or None, calls)
    )


def test_strict_tools_beyond_the_pinned_bound_are_a_400_and_the_server_serves_on(
    carrier_enabled_server, tmp_path
):
    """One request's strict tools over ``MAX_PINNED_PROPERTIES`` get a 400 naming the
    tool and the limit, streamed or not, before anything compiles; the next request
    is served as usual. A Spark2_5 checkpoint, whose context holds such a prompt."""
    from spark2_5_dev.checkpoints import build_spark2_5_checkpoint
    from vllm_spark2_5_plugin.spark2_5_tool_parser import MAX_PINNED_PROPERTIES

    properties = {f"p{index:04d}": {"type": "string"} for index in range(MAX_PINNED_PROPERTIES + 1)}
    huge = with_parameters(tools.WEATHER_TOOL, properties, strict=True)
    model = build_spark2_5_checkpoint(tmp_path / "model", seed=2)
    with carrier_enabled_server(model, [*SERVE_ARGS, "--max-model-len", "16384"]) as server:
        client = server.openai_client()
        args = request_args(client, [huge], "auto")
        for streamed in (False, True):
            with pytest.raises(openai.BadRequestError) as refused:
                if streamed:
                    list(client.chat.completions.create(**args, stream=True))
                else:
                    client.chat.completions.create(**args)
            message = str(refused.value)
            assert 'the largest is function "get_weather"' in message, message
            assert f"more than the {MAX_PINNED_PROPERTIES:,}" in message
        finish_reason, _, _ = complete(client, **request_args(client, [WEATHER_TOOL], "auto"))
        assert finish_reason in ("stop", "length", "tool_calls")


def test_forced_tool_choice_on_a_server_that_cannot_constrain_is_a_400(
    tiny_llama, carrier_enabled_server
):
    with carrier_enabled_server(
        tiny_llama, SERVE_ARGS, VLLM_ENFORCE_STRICT_TOOL_CALLING="0"
    ) as server:
        client = server.openai_client()
        with pytest.raises(openai.BadRequestError) as error:
            client.chat.completions.create(**request_args(client, [WEATHER_TOOL], "required"))
        message = error.value.body["message"] if error.value.body else str(error.value)
        # Where vLLM cannot constrain forced calls at all (0.23), that is the reason given.
        strict_off = "VLLM_ENFORCE_STRICT_TOOL_CALLING"
        reason = strict_off if constrains_forced_calls() else FORCED_CALL_REFUSAL
        assert "tool_choice='required'" in message and reason in message
        # The same server still answers auto requests.
        assert complete(client, **request_args(client, [WEATHER_TOOL], "auto", max_tokens=4))


@pytest.mark.parametrize(
    ("parser", "enabled"), [("spark2_5", "1"), ("spark25", "0")], ids=["misspelled", "disabled"]
)
def test_an_unknown_parser_name_is_refused_as_the_readme_quotes(tiny_llama, parser, enabled):
    """Misspelled, vLLM lists the right name; with the carrier off, the README's
    troubleshooting quotes exactly what vLLM says."""
    result = run_vllm_serve_expecting_failure(
        tiny_llama,
        ["--enable-auto-tool-choice", "--tool-call-parser", parser],
        env=clean_env(SPARK2_5_PLUGIN_ENABLE=enabled),
    )
    output = result.stdout + result.stderr
    assert result.returncode != 0
    (line,) = [line for line in output.splitlines() if "invalid tool call parser" in line]
    refusal = f"invalid tool call parser: {parser} (chose from {{"
    assert refusal in line
    choices = line.split("(chose from {", 1)[1].rsplit("}", 1)[0]
    assert ("spark25" in {name.strip() for name in choices.split(",")}) is (enabled == "1")
    if enabled == "0":
        assert f"`KeyError: '{refusal}" in " ".join(README.read_text(encoding="utf-8").split())
