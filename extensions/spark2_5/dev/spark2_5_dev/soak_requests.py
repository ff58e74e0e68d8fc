"""The request mix of the serving soak (:mod:`spark2_5_dev.soak`).

Well-formed requests are the trained fixture's conversations
(:mod:`spark2_5_dev.fixture`), each with the answer the fixture was trained to
give where it has one; forced tool choices have none (the fixture was never
trained to call a tool for the capital question), so their calls are checked
against the tool's schema; where vLLM cannot constrain forced calls (0.23)
they are refused with the documented 400 instead, and join the refused
requests. Malformed requests are raw HTTP bodies, each with the words its 4xx
message must contain to name the problem.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from spark2_5_dev import chat, fixture
from spark2_5_dev.host_features import FORCED_CALL_REFUSAL, constrains_forced_calls
from spark2_5_dev.tool_parsing import compact

# finish_reason, content, ((name, arguments), ...): what a client ends up with.
Answer = tuple[str | None, str, tuple[tuple[str, str], ...]]

WELL_FORMED_KINDS = ("plain", "tool-call", "streamed-tool-call", "required", "named")
MAX_TOKENS = 120
# Disconnecting clients ask for this many tokens, never stopping early, so every
# one of them is still generating when it hangs up.
DISCONNECT_MAX_TOKENS = 300


@dataclass(frozen=True)
class Case:
    """A well-formed request and, where the fixture was trained on it, its answer."""

    kind: str
    name: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] = field(default_factory=list)
    tool_choice: Any = None
    stream: bool = False
    expected: Answer | None = None

    def arguments(self, model: str) -> dict[str, Any]:
        """Keyword arguments of ``chat.completions.create``."""
        extra = {"tools": self.tools} if self.tools else {}
        if self.tool_choice is not None:
            extra["tool_choice"] = self.tool_choice
        return {
            "model": model,
            "messages": self.messages,
            "temperature": 0,
            "max_tokens": MAX_TOKENS,
            "stream": self.stream,
            **extra,
        }


def _trained(kind: str, name: str, expected: Answer, stream: bool = False) -> Case:
    conversation = chat.conversation(name)
    label = f"{name}-streamed" if stream else name
    return Case(kind, label, conversation.messages, conversation.tools, None, stream, expected)


def _called(name: str, arguments: dict[str, Any]) -> Answer:
    return ("tool_calls", "", ((name, compact(arguments)),))


def _forced(kind: str, name: str, tool_choice: Any, question: str, stream: bool) -> Case:
    messages = [{"role": "user", "content": question}]
    tools = [fixture.WEATHER_TOOL, fixture.TIME_TOOL]
    label = f"{name}-streamed" if stream else name
    return Case(kind, label, messages, tools, tool_choice, stream)


def forced_cases() -> list[Case]:
    """``tool_choice="required"`` and named, streamed and not."""
    named_weather = {"type": "function", "function": {"name": "get_weather"}}
    named_time = {"type": "function", "function": {"name": "get_time"}}
    return [
        _forced(kind, name, choice, question, stream)
        for kind, name, choice, question in (
            ("required", "required-capital", "required", fixture.CAPITAL_QUESTION),
            ("named", "named-weather-capital", named_weather, fixture.CAPITAL_QUESTION),
            ("named", "named-time-tokyo", named_time, fixture.TOKYO_QUESTION),
        )
        for stream in (False, True)
    ]


def well_formed_cases() -> list[Case]:
    """Plain chats, tool calls (streamed too) and, where this vLLM can constrain
    them, forced tool choices."""
    plain = ("stop", fixture.CAPITAL_ANSWER, ())
    undeclared = fixture.tool_call_text("get_weather", fixture.PARIS_CALL)
    return [
        _trained("plain", "plain", plain),
        _trained("plain", "plain-with-tools", plain),
        _trained("plain", "follow-up", ("stop", fixture.PARIS_FOLLOW_UP, ())),
        _trained("plain", "undeclared-call", ("stop", undeclared, ())),
        _trained("tool-call", "weather-call", _called("get_weather", fixture.PARIS_CALL)),
        _trained("tool-call", "weather-call-unicode", _called("get_weather", fixture.HEFEI_CALL)),
        _trained("tool-call", "time-call", _called("get_time", fixture.TOKYO_CALL)),
        *(
            _trained("streamed-tool-call", name, _called(tool, arguments), stream=True)
            for name, tool, arguments in (
                ("weather-call", "get_weather", fixture.PARIS_CALL),
                ("weather-call-unicode", "get_weather", fixture.HEFEI_CALL),
                ("time-call", "get_time", fixture.TOKYO_CALL),
            )
        ),
        *(forced_cases() if constrains_forced_calls() else ()),
    ]


def disconnecting_cases() -> list[Case]:
    """Streams a client hangs up on after a few chunks (``ignore_eos`` keeps them long)."""
    return [
        _trained("disconnect", "plain", ("length", "", ()), stream=True),
        _trained("disconnect", "weather-call", ("length", "", ()), stream=True),
    ]


_PYTHON_TYPES = {"string": str, "integer": int}


def schema_problem(case: Case, answer: Answer) -> str | None:
    """Why a forced answer is not one call to an allowed tool with the arguments its
    schema asks for (every required key, of its type), or None."""
    schemas = {tool["function"]["name"]: tool["function"]["parameters"] for tool in case.tools}
    named = isinstance(case.tool_choice, dict)
    allowed = [case.tool_choice["function"]["name"]] if named else sorted(schemas)
    calls = answer[2]
    if len(calls) != 1 or calls[0][0] not in allowed:
        return f"expected one call to one of {allowed}, got {answer}"
    name, arguments = calls[0]
    values = json.loads(arguments)
    for key in schemas[name]["required"]:
        wanted = _PYTHON_TYPES[schemas[name]["properties"][key]["type"]]
        if not isinstance(values.get(key), wanted) or isinstance(values.get(key), bool):
            return f"argument {key!r} is not a {wanted.__name__}: {arguments}"
    return None


# The status recorded when the server closes the connection without an answer.
NO_ANSWER = 0


@dataclass(frozen=True)
class HostBug:
    """A wrong answer some vLLM releases give to a request, whatever the carrier."""

    status: int  # NO_ANSWER: the connection closed without one
    mentions: tuple[str, ...]
    seen_on: str


@dataclass(frozen=True)
class Malformed:
    """A request the server must refuse: raw body, expected status, words naming it,
    and the answer of a known vLLM bug on the releases that have one."""

    name: str
    body: bytes
    mentions: tuple[str, ...]
    status: int = 400
    host_bug: HostBug | None = None


def _body(model: str, **fields: Any) -> bytes:
    request = {
        "model": model,
        "messages": [{"role": "user", "content": fixture.PARIS_QUESTION}],
        "max_tokens": 16,
        **fields,
    }
    return json.dumps(request).encode()


def _tool(name: str, parameters: Any) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": parameters}}


def _nested(levels: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(levels - 1):
        schema = {"type": "array", "items": schema}
    return schema


# Where the soak met each bug (scripts/run-matrix); the support matrix lists them.
ARRAY_BODY_500 = "vLLM 0.23 to 0.27"
EMPTY_MESSAGES_RESET = "vLLM 0.23 to 0.25, at times (the 400 is logged, then the ASGI app raises)"


def malformed_cases(model: str) -> list[Malformed]:
    """Bodies no client should send: broken JSON, wrong types, invalid tools and
    tool choices, sizes beyond the server's limits, streamed and not."""
    bad_type = _tool("get_weather", {"type": "object", "properties": {"city": {"type": "text"}}})
    weather, spaced = fixture.WEATHER_TOOL, _tool("get weather", {"type": "object"})
    unknown = {"type": "function", "function": {"name": "get_stock_price"}}
    bad_schema = ("get_weather", "$.properties.city.type", '"text" is not one of')
    cases = [
        Malformed("not-json", b'{"model": "x", "messages": [', ("JSON decode error",)),
        Malformed("invalid-utf8", b'{"model": "\xff\xfe"}', ("error parsing the body",)),
        Malformed(
            "body-is-an-array",
            b"[]",
            ("valid dictionary",),
            host_bug=HostBug(500, ("'list' object has no attribute 'get'",), ARRAY_BODY_500),
        ),
        Malformed("deeply-nested-body", b"[" * 100_000, ("error parsing the body",)),
        Malformed(
            "empty-messages",
            _body(model, messages=[]),
            ("empty conversation",),
            host_bug=HostBug(NO_ANSWER, ("connection closed",), EMPTY_MESSAGES_RESET),
        ),
        Malformed("messages-not-a-list", _body(model, messages="hi"), ("messages", "valid list")),
        Malformed(
            "temperature-a-word", _body(model, temperature="hot"), ("temperature", "valid number")
        ),
        Malformed("max-tokens-oversized", _body(model, max_tokens=10**9), ("max_tokens=10",)),
        Malformed("max-tokens-negative", _body(model, max_tokens=-1), ("max_tokens", "-1")),
        Malformed("prompt-too-long", _prompt_too_long(model), ("maximum context length",)),
        Malformed("unknown-model", _body("no-such-model"), ("no-such-model",), status=404),
        Malformed(
            "tool-without-function", _body(model, tools=[{"type": "function"}]), ("function",)
        ),
    ]
    for stream in (False, True):
        suffix = "-streamed" if stream else ""
        cases += [
            Malformed(
                f"invalid-tool-schema{suffix}",
                _body(model, tools=[bad_type], stream=stream),
                bad_schema,
            ),
            Malformed(
                f"invalid-tool-schema-required{suffix}",
                _body(model, tools=[bad_type], tool_choice="required", stream=stream),
                bad_schema,
            ),
            Malformed(
                f"tool-schema-too-deep{suffix}",
                _body(model, tools=[_tool("deep", _nested(80))], stream=stream),
                ("deep", "64 levels"),
            ),
            Malformed(
                f"uncallable-tool-name{suffix}",
                _body(model, tools=[spaced], tool_choice="required", stream=stream),
                ('"get weather"', "whitespace"),
            ),
            Malformed(
                f"unknown-tool-choice-name{suffix}",
                _body(model, tools=[weather], tool_choice=unknown, stream=stream),
                ("tool_choice", "does not match"),
            ),
            Malformed(
                f"tool-choice-without-tools{suffix}",
                _body(model, tool_choice="required", stream=stream),
                ("tool_choice", "tools"),
            ),
            Malformed(
                f"unknown-tool-choice{suffix}",
                _body(model, tools=[weather], tool_choice="sometimes", stream=stream),
                ("tool_choice", "sometimes"),
            ),
        ]
    return cases + _forced_refusals(model)


def _forced_refusals(model: str) -> list[Malformed]:
    """Forced tool choices where this vLLM cannot constrain them: the parser's 400."""
    if constrains_forced_calls():
        return []
    return [
        Malformed(
            f"forced-without-structural-tags-{case.name}",
            _body(
                model,
                messages=case.messages,
                tools=case.tools,
                tool_choice=case.tool_choice,
                stream=case.stream,
            ),
            ("tool_choice", FORCED_CALL_REFUSAL),
        )
        for case in forced_cases()
    ]


def _prompt_too_long(model: str) -> bytes:
    return _body(model, messages=[{"role": "user", "content": "word " * 3000}])
