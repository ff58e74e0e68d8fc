"""``spark25`` under vLLM's own streaming consumers, at every cut of every output.

Each output of a generated corpus (complete calls in both forms, repeated keys,
stray text inside and between calls, two calls, undeclared names, thinking) is
cut after every one of its tokens, as ``max_tokens`` cuts it. Every cut is
served four ways on vLLM's serving-layer ``Parser`` around ``spark25``:

* Chat Completions, not streamed: ``Parser.parse``;
* Chat Completions, streamed: ``Parser.parse_delta`` token by token, each delta
  sent as vLLM's ``ChatCompletionStreamResponse`` chunk and folded by the openai
  SDK's ``ChatCompletionStreamState`` (what ``chat.completions.stream()`` uses);
* Responses, not streamed: ``Parser.parse`` into vLLM's
  ``build_response_output_items``;
* Responses, streamed: vLLM's ``_process_simple_streaming_events`` itself (the
  ``SimpleStreamingEventProcessor`` loop), fed token by token.

Asserted: no consumer raises; stream and non-stream agree in both APIs (a call
the cut falls inside is, streamed, that call as far as written, and not streamed
its text as content); every call any cut returns is one of the complete output's
calls, whole or, streamed and last, cut short."""

from __future__ import annotations

import asyncio
import importlib
import inspect
import itertools
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spark2_5_dev.host_features import (
    ends_incomplete_responses_with_their_own_event,
    streams_responses_through_parser,
)
from spark2_5_dev.tool_parsing import (
    WEATHER_TOOL,
    Parsed,
    chat_request,
    serving_parser_cls,
    stream_agrees,
)
from vllm_spark2_5_plugin.spark2_5_tool_parser import DeltaMessage

pytestmark = pytest.mark.slow
RESPONSES_PATH = (
    "the Responses path tested is vLLM 0.32's (SimpleStreamingEventProcessor, "
    "build_response_output_items); 0.23 has the first only"
)

if not (
    streams_responses_through_parser()
    and hasattr(
        importlib.import_module("vllm.entrypoints.openai.responses.utils"),
        "build_response_output_items",
    )
):
    pytest.skip(RESPONSES_PATH, allow_module_level=True)

TIME_TOOL = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}},
    },
}
CHAT_TOOLS = [WEATHER_TOOL, TIME_TOOL]


def call(name: str, pairs: list[tuple[str, str]], sep: str = "", stray: str = "") -> str:
    """A call; ``stray`` goes between its pairs and before ``</tool_call>``."""
    body = stray.join(
        f"<arg_key>{key}</arg_key>{sep}<arg_value>{value}</arg_value>{sep}" for key, value in pairs
    )
    return f"<tool_call>{name}{sep}{body}{stray}</tool_call>"


def corpus() -> list[str]:
    """Calls of every shape the parser distinguishes, each alone and with text around."""
    pairs = {
        "plain": [("city", "Paris"), ("days", "3")],
        "repeated-key": [("city", "Paris"), ("city", "Rome")],
    }
    outputs = []
    for name, kv, sep, stray in itertools.product(
        ("get_weather", "delete_all"), pairs.values(), ("", "\n"), ("", " note ")
    ):
        outputs.append(call(name, kv, sep, stray))
    weather = call("get_weather", pairs["plain"])
    time = call("get_time", [("zone", "CET")], "\n")
    outputs += [
        f"Sure. {weather} and {time} Done.",
        f"Let me think. <tool_call>get_time</tool_call></think>OK {weather}",
        "No call </arg_key> here <tool_call> at all",
    ]
    return outputs


def requests() -> dict[str, Any]:
    from vllm.entrypoints.openai.responses.protocol import ResponsesRequest

    responses_tools = [{"type": "function", **tool["function"]} for tool in CHAT_TOOLS]
    return {
        "chat": chat_request(tools=CHAT_TOOLS),
        "responses": ResponsesRequest(model="tiny", input="Weather?", tools=responses_tools),
    }


def token_deltas(tokenizer, text: str) -> list[tuple[str, list[int]]]:
    """One delta per token, as vLLM streams by default."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    return [(tokenizer.decode([token], skip_special_tokens=False), [token]) for token in ids]


def grouped(deltas: list[tuple[str, list[int]]], ends: set[int]) -> list[tuple[str, list[int]]]:
    """Consecutive deltas joined, ending after each position in ``ends``: the several
    tokens per delta of ``--stream-interval`` and of speculative decoding."""
    joined, text, tokens = [], "", []
    for position, (piece, ids) in enumerate(deltas, start=1):
        text, tokens = text + piece, tokens + ids
        if position in ends or position == len(deltas):
            joined.append((text, tokens))
            text, tokens = "", []
    return joined


def chat_non_streamed(parser, text: str, request) -> tuple:
    reasoning, content, calls = parser.parse(text, request, enable_auto_tools=True)
    return reasoning or None, content or None, [(c.name, c.arguments) for c in calls or []]


def chat_streamed(parser, deltas: list[tuple[str, list[int]]], request, finish="length") -> tuple:
    """Each delta as vLLM's chunk, folded by the openai SDK's stream state; the last
    one finishes the stream with ``finish``."""
    from openai.lib.streaming.chat import ChatCompletionStreamState
    from openai.types.chat import ChatCompletionChunk
    from vllm.entrypoints.openai.chat_completion.protocol import (
        ChatCompletionResponseStreamChoice,
        ChatCompletionStreamResponse,
    )

    state = ChatCompletionStreamState()
    reasoning = ""
    for position, (text, tokens) in enumerate(deltas):
        last = position == len(deltas) - 1
        message = parser.parse_delta(text, tokens, request, prompt_token_ids=[], finished=last)
        if message is None and not last:
            continue
        message = message or DeltaMessage()
        reasoning += message.reasoning or ""
        choice = ChatCompletionResponseStreamChoice(
            index=0, delta=message, finish_reason=finish if last else None
        )
        # Built and sent as vLLM's server does (unset fields left out).
        chunk = ChatCompletionStreamResponse(
            id="chatcmpl-1",
            object="chat.completion.chunk",
            created=0,
            model="tiny",
            choices=[choice],
        )
        state.handle_chunk(
            ChatCompletionChunk.model_validate_json(chunk.model_dump_json(exclude_unset=True))
        )
    if not deltas:
        return None, None, []
    # The snapshot: the final completion refuses to exist for a "length" finish.
    message = state.current_completion_snapshot.choices[0].message
    calls = [(c.function.name, c.function.arguments) for c in message.tool_calls or []]
    return reasoning or None, message.content or None, calls


# The status of the item still open when a "length" finish cuts a stream (every
# stream here ends so): vLLM 0.33 closes it as incomplete, 0.32 as completed.
CUT_STREAM_LAST_ITEM_STATUS = (
    "incomplete" if ends_incomplete_responses_with_their_own_event() else "completed"
)


def responses_summary(items, last_status: str = "completed") -> tuple:
    """Reasoning, message text and ``(name, arguments)`` calls of Responses output
    items; each call item completed, but the last one ``last_status``."""
    reasoning = "".join(
        part.text for item in items if item.type == "reasoning" for part in item.content or []
    )
    text = "".join(part.text for item in items if item.type == "message" for part in item.content)
    calls = []
    for position, item in enumerate(items, start=1):
        if item.type == "function_call":
            status = last_status if position == len(items) else "completed"
            assert isinstance(item.name, str) and item.status == status, item
            calls.append((item.name, item.arguments))
    return reasoning or None, text or None, calls


def responses_non_streamed(parser, text: str, request) -> tuple:
    return responses_summary(responses_items(parser, text, request))


def responses_items(parser, text: str, request) -> list:
    from vllm.entrypoints.openai.responses.utils import build_response_output_items

    reasoning, content, calls = parser.parse(text, request, enable_auto_tools=True)
    # vLLM 0.24 builds the items without the request's tools.
    takes_tools = "tools" in inspect.signature(build_response_output_items).parameters
    tools = {"tools": request.tools} if takes_tools else {}
    return build_response_output_items(
        reasoning=reasoning, content=content, tool_calls=calls or [], **tools
    )


def responses_streamed(parser, deltas: list[tuple[str, list[int]]], request, finish="length"):
    items = responses_streamed_items(parser, deltas, request, finish)
    return responses_summary(
        items, CUT_STREAM_LAST_ITEM_STATUS if finish == "length" else "completed"
    )


def responses_streamed_items(
    parser, deltas: list[tuple[str, list[int]]], request, finish: str = "length"
) -> list:
    """vLLM's own simple streaming loop over one context per delta; the last one
    finishes the stream with ``finish``."""
    from vllm.entrypoints.openai.responses.context import SimpleContext
    from vllm.entrypoints.openai.responses.serving import OpenAIServingResponses
    from vllm.outputs import CompletionOutput, RequestOutput

    # vLLM's loop needs nothing of the serving object but its _raise_if_error.
    serving = object.__new__(OpenAIServingResponses)
    context = SimpleContext(response_parser=parser)

    async def outputs():
        for position, (text, tokens) in enumerate(deltas):
            last = position == len(deltas) - 1
            output = CompletionOutput(
                0, text, tokens, None, None, finish_reason=finish if last else None
            )
            context.append_output(RequestOutput("r", None, [], None, [output], finished=last))
            yield context

    async def run():
        events = serving._process_simple_streaming_events(
            request, None, outputs(), context, "tiny", None, None, 0, lambda event: event
        )
        return [event async for event in events]

    events = asyncio.run(run())
    return [event.item for event in events if event.type == "response.output_item.done"]


SERVED = {
    "chat": (chat_non_streamed, chat_streamed),
    "responses": (responses_non_streamed, responses_streamed),
}


@pytest.mark.parametrize("api", SERVED)
@pytest.mark.parametrize("reasoning_parser", [None, "holo2"])
def test_every_cut_of_every_output_folds_alike_streamed_or_not(tokenizer, api, reasoning_parser):
    parser_cls = serving_parser_cls(tokenizer, reasoning_parser)
    request = requests()[api]
    non_streamed, streamed = SERVED[api]
    for output in corpus():
        if reasoning_parser is None and "</think>" in output:
            continue
        deltas = token_deltas(tokenizer, output)
        whole_calls = non_streamed(parser_cls(tokenizer, request.tools), output, request)[2]
        for cut in range(len(deltas) + 1):
            cut_deltas = deltas[:cut]
            text = "".join(piece for piece, _ in cut_deltas)
            expected = non_streamed(parser_cls(tokenizer, request.tools), text, request)
            got = streamed(parser_cls(tokenizer, request.tools), cut_deltas, request)
            assert got[0] == expected[0], (api, output, cut)
            assert stream_agrees(Parsed(*got[1:]), Parsed(*expected[1:])), (api, output, cut)
            calls = expected[2]
            # A cut never yields a call the whole output does not make, or part of
            # one but the streamed call it falls inside.
            assert calls == whole_calls[: len(calls)], (output, cut, calls)
            for _, arguments in calls:
                assert isinstance(json.loads(arguments), dict)
            if len(got[2]) > len(calls):
                name, arguments = got[2][-1]
                assert (name, True) == (
                    whole_calls[len(calls)][0],
                    whole_calls[len(calls)][1].startswith(arguments),
                ), (output, cut, got)


def agent_outputs(thinking: bool) -> st.SearchStrategy[str]:
    """Text and calls in any order (text before, between and after calls), after a
    thinking block where the reasoning parser reads one."""
    weather = call("get_weather", [("city", "Paris"), ("days", "3")])
    time = call("get_time", [("zone", "CET")], "\n")
    texts = ["Sure. ", " Done.", "a < b", "\n", "OK"]
    parts = st.lists(st.sampled_from([weather, time, *texts]), min_size=1, max_size=5)
    think = st.sampled_from(["Let me see.</think>", "</think>"]) if thinking else st.just("")
    return st.builds(lambda head, body: head + "".join(body), think, parts)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
@pytest.mark.parametrize("api", SERVED)
@pytest.mark.parametrize("reasoning_parser", [None, "holo2"])
def test_any_grouping_of_tokens_into_deltas_serves_the_non_streamed_result(
    tokenizer, api, reasoning_parser, data
):
    """Several tokens per delta (``--stream-interval``, speculative decoding), grouped
    anyhow, with the stream finishing normally: the reasoning, every character of
    the content (text after a call included) and every call, streamed as not, and
    no consumer raises."""
    parser_cls = serving_parser_cls(tokenizer, reasoning_parser)
    request = requests()[api]
    non_streamed, streamed = SERVED[api]
    output = data.draw(agent_outputs(thinking=reasoning_parser is not None), label="output")
    tokens = token_deltas(tokenizer, output)
    ends = data.draw(st.sets(st.integers(1, len(tokens))), label="delta ends")
    got = streamed(parser_cls(tokenizer, request.tools), grouped(tokens, ends), request, "stop")
    assert blank_content_beside_calls_as_none(got) == non_streamed(
        parser_cls(tokenizer, request.tools), output, request
    )


@pytest.mark.parametrize("api", SERVED)
def test_text_after_a_call_in_the_delta_that_closes_it_is_served_after_the_call(tokenizer, api):
    """The last delta closes a call opened before it and carries text written after
    the call (vLLM merges what the parser releases at the end into that delta): the
    Responses stream once failed on it (a nameless call item); both APIs give the
    call whole and the text."""
    parser_cls = serving_parser_cls(tokenizer)
    request = requests()[api]
    non_streamed, streamed = SERVED[api]
    output = "Sure. " + call("get_weather", [("city", "Paris")]) + " Done."
    tokens = token_deltas(tokenizer, output)
    close = next(position for position, (text, _) in enumerate(tokens) if text == "</tool_call>")
    got = streamed(parser_cls(tokenizer, request.tools), grouped(tokens, {close}), request, "stop")
    assert got == (None, "Sure.  Done.", [("get_weather", '{"city":"Paris"}')])
    assert got == non_streamed(parser_cls(tokenizer, request.tools), output, request)


def blank_content_beside_calls_as_none(result: tuple) -> tuple:
    """vLLM's rule for a response that is not streamed: whitespace-only content beside
    calls is no content (a stream has already sent it)."""
    reasoning, content, calls = result
    return reasoning, None if calls and not (content or "").strip() else content, calls


def test_stray_markup_in_a_call_is_dropped_in_both_responses(tokenizer):
    """Text inside a call that forms no pair is in neither Responses output: a call
    item carries no text, and a stream cannot put it before a call already sent."""
    parser_cls = serving_parser_cls(tokenizer)
    request = requests()["responses"]
    output = call("get_weather", [("city", "Paris")], stray=" note ")
    deltas = token_deltas(tokenizer, output)
    streamed = responses_streamed_items(parser_cls(tokenizer, request.tools), deltas, request)
    whole = responses_items(parser_cls(tokenizer, request.tools), output, request)
    for items, status in ((streamed, CUT_STREAM_LAST_ITEM_STATUS), (whole, "completed")):
        assert [item.type for item in items] == ["function_call"]
        assert responses_summary(items, status) == (
            None,
            None,
            [("get_weather", '{"city":"Paris"}')],
        )
