"""``spark25`` against vLLM's own ``glm45`` parser, a peer implementation of the
same ``<tool_call>``/``<arg_key>``/``<arg_value>`` grammar that nobody here wrote.

On a shared corpus in the newline form both must report the same calls (names
and decoded arguments) and the same text before the first call. Where they
differ on purpose, ``DIFFERENCES`` pins both behaviours and says why; if vLLM
changes ``glm45``, the pinned case fails and the list (and
``docs/tool-calling.md``) must be revisited. vLLM 0.23 registers an older
implementation as ``glm45`` (``Glm4MoeModelToolParser``; 0.24 and later
``Glm47MoeModelToolParser``); where it behaves differently, ``older_glm45`` pins
that too.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

import pytest

from spark2_5_dev.tool_parsing import (
    TOOLS,
    Parsed,
    chat_request,
    non_streaming,
)
from vllm_spark2_5_plugin.spark2_5_tool_parser import Spark25ToolParser

REQUEST = chat_request()


OLDER_GLM45 = "Glm4MoeModelToolParser"


@pytest.fixture(scope="module")
def glm45_cls():
    from vllm.tool_parsers import ToolParserManager

    return ToolParserManager.get_tool_parser("glm45")


@pytest.fixture(scope="module")
def glm45_parse(tokenizer, glm45_cls):
    def parse(text, request=REQUEST):
        parser = glm45_cls(tokenizer, request.tools)
        # What vLLM's serving layer sets when no reasoning parser is configured.
        parser.skip_reasoning_parsing = True
        return non_streaming(parser, text, request)

    return parse


def spark25_parse(tokenizer, text, request=REQUEST):
    return non_streaming(Spark25ToolParser(tokenizer), text, request)


def newline_call(name, pairs):
    return (
        f"<tool_call>{name}\n"
        + "".join(
            f"<arg_key>{key}</arg_key>\n<arg_value>{value}</arg_value>\n" for key, value in pairs
        )
        + "</tool_call>"
    )


SAMPLE_VALUES = {
    "string": ["Paris", "東京 ☀", "a < b > c", "line 1\nline 2", '{"not": "parsed"}', " padded "],
    "integer": ["0", "-12", "42", "123456789012345678901234567890"],
    "number": ["0.5", "-1e-3", "7"],
    "boolean": ["true", "false", "True"],
    "object": ['{"a": [1, 2, {"b": null}]}', "{}"],
    "array": ['["x", 1, true]', "[]"],
}


def sample_value(rng, schema):
    types = schema.get("type") or ("integer" if "anyOf" in schema else "string")
    if isinstance(types, list):
        if rng.random() < 0.3:
            return "null"
        types = types[0]
    return rng.choice(SAMPLE_VALUES[types])


def corpus(size=200, seed=0):
    """Outputs in the newline form: optional text, then one to three well-formed calls
    with declared tools, declared keys (each at most once) and values of their types."""
    rng = random.Random(seed)
    tools = {tool["function"]["name"]: tool["function"]["parameters"] for tool in TOOLS}
    outputs = []
    for _ in range(size):
        text = rng.choice(["", "", "Let me check that.\n", "Sure — 東京 first.\n\n"])
        for _ in range(rng.randint(1, 3)):
            name = rng.choice(sorted(tools))
            properties = {
                key: schema
                for key, schema in tools[name]["properties"].items()
                if key not in ("choice", "untyped", "nullable_text")
            }
            keys = rng.sample(sorted(properties), rng.randint(0, min(4, len(properties))))
            text += newline_call(name, [(key, sample_value(rng, properties[key])) for key in keys])
            text += rng.choice(["", "\n"])
        outputs.append(text)
    return outputs


def decoded(parsed):
    return [(name, json.loads(args)) for name, args in parsed.calls]


def with_older_glm45_nulls(calls):
    """``calls`` as vLLM 0.23's glm45 reports them: ``null`` for the string-or-null
    parameter stays the string ``"null"`` (pinned in ``DIFFERENCES``)."""
    return [
        (
            name,
            {
                key: "null" if value is None and key == "maybe_text" else value
                for key, value in args.items()
            },
        )
        for name, args in calls
    ]


def test_both_parsers_agree_on_a_shared_corpus(tokenizer, glm45_parse, glm45_cls):
    outputs = corpus()
    assert sum(text.count("<tool_call>") for text in outputs) > 350
    older = glm45_cls.__name__ == OLDER_GLM45  # it does not strip the text before a call
    for text in outputs:
        ours, theirs = spark25_parse(tokenizer, text), glm45_parse(text)
        expected_calls = with_older_glm45_nulls(decoded(ours)) if older else decoded(ours)
        assert decoded(theirs) == expected_calls, text
        before_first_call = text.split("<tool_call>", 1)[0]
        stripped = before_first_call.strip() or None
        expected = (before_first_call or None) if older else stripped
        assert (theirs.content or None) == expected, text
        assert ((ours.content or "").strip() or None) == stripped, text


@dataclass(frozen=True)
class Difference:
    id: str
    output: str
    glm45: Parsed
    spark25: Parsed
    why: str
    tools_declared: bool = True
    older_glm45: Parsed | None = None  # what vLLM 0.23's glm45 returns, where it differs


DIFFERENCES = [
    Difference(
        "argument-json-spacing",
        newline_call("get_weather", [("city", "Paris"), ("days", "3")]),
        Parsed(None, [("get_weather", '{"city": "Paris", "days": 3}')]),
        Parsed(None, [("get_weather", '{"city":"Paris","days":3}')]),
        "spark25 writes compact JSON; the decoded arguments are the same",
    ),
    Difference(
        "text-after-and-between-calls",
        "Hello "
        + newline_call("get_weather", [("city", "Paris")])
        + " mid "
        + newline_call("get_weather", [("city", "Rome")])
        + " bye",
        Parsed(
            "Hello", [("get_weather", '{"city": "Paris"}'), ("get_weather", '{"city": "Rome"}')]
        ),
        Parsed(
            "Hello  mid  bye",
            [("get_weather", '{"city":"Paris"}'), ("get_weather", '{"city":"Rome"}')],
        ),
        "glm45 keeps only the stripped text before the first call; spark25 loses no text",
        older_glm45=Parsed(
            "Hello ", [("get_weather", '{"city": "Paris"}'), ("get_weather", '{"city": "Rome"}')]
        ),
    ),
    Difference(
        "undeclared-tool",
        "x " + newline_call("delete_all", [("really", "yes")]),
        Parsed("x ", []),
        Parsed("x " + newline_call("delete_all", [("really", "yes")]), []),
        "glm45 drops a call to an undeclared tool; spark25 returns it verbatim as content",
        older_glm45=Parsed("x ", [("delete_all", '{"really": "yes"}')]),
    ),
    Difference(
        "no-tools-declared",
        newline_call("get_weather", [("city", "Paris")]),
        Parsed(None, [("get_weather", '{"city": "Paris"}')]),
        Parsed(newline_call("get_weather", [("city", "Paris")]), []),
        "with no tools in the request, spark25 parses nothing as a call",
        tools_declared=False,
    ),
    Difference(
        "unterminated-pair",
        "x <tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Par",
        Parsed("x", [("get_weather", "{}")]),
        Parsed("x <tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Par", []),
        "glm45 returns the cut-off call without its unfinished pair, as if complete; spark25 "
        "returns a call that was never closed verbatim as content (streamed: as far as written)",
        older_glm45=Parsed("x <tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Par", []),
    ),
    Difference(
        "repeated-key",
        newline_call("get_weather", [("city", "Paris"), ("city", "Rome")]),
        Parsed(None, [("get_weather", '{"city": "Rome"}')]),
        Parsed(None, [("get_weather", '{"city":"Paris"}')]),
        "glm45 lets the later pair replace the first; spark25 keeps the first, which a "
        "stream may already have sent",
    ),
    Difference(
        "empty-name",
        newline_call("", [("city", "Paris")]),
        Parsed(None, []),
        Parsed(newline_call("", [("city", "Paris")]), []),
        "glm45 drops a block without a name; spark25 returns it verbatim as content",
        older_glm45=Parsed(None, [("", '{"city": "Paris"}')]),
    ),
    Difference(
        "null-for-a-string-or-null",
        newline_call("typed", [("maybe_text", "null")]),
        Parsed(None, [("typed", '{"maybe_text": null}')]),
        Parsed(None, [("typed", '{"maybe_text":null}')]),
        "both give a string-or-null parameter null; vLLM 0.23's glm45 gives the string",
        older_glm45=Parsed(None, [("typed", '{"maybe_text": "null"}')]),
    ),
    Difference(
        "integral-number-for-integer",
        newline_call("typed", [("count", "3.0")]),
        Parsed(None, [("typed", '{"count": 3.0}')]),
        Parsed(None, [("typed", '{"count":3}')]),
        "spark25 gives an integer parameter an integer when the number is integral",
    ),
]


@pytest.mark.parametrize("difference", DIFFERENCES, ids=[case.id for case in DIFFERENCES])
def test_documented_differences(tokenizer, glm45_parse, glm45_cls, difference):
    request = REQUEST if difference.tools_declared else chat_request(tools=None)
    glm45 = difference.glm45
    if glm45_cls.__name__ == OLDER_GLM45 and difference.older_glm45 is not None:
        glm45 = difference.older_glm45
    assert glm45_parse(difference.output, request) == glm45
    assert spark25_parse(tokenizer, difference.output, request) == difference.spark25
