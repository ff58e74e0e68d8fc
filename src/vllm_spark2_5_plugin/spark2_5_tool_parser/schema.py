# SPDX-License-Identifier: Apache-2.0
"""The checks a request's function tools pass before vLLM builds a grammar.

A tool whose name no Spark2_5 call can carry, or whose parameters are not a
usable JSON Schema, is refused naming the tool (``check_tools``); the adapter
answers the refusal with a 400. The tools arrive as ``(name, parameters)`` pairs.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from vllm_spark2_5_plugin.spark2_5_tool_parser.scanner import TAGS, WHITESPACE
from vllm_spark2_5_plugin.spark2_5_tool_parser.values import nests_deeper_than

# A tool's parameter schema nests at most this deep: vLLM's bound for the
# structured-output schemas a forced call turns it into.
MAX_SCHEMA_DEPTH = 64
_SCHEMA_TYPES = ("array", "boolean", "integer", "null", "number", "object", "string")
# Keywords whose value is one schema, an object of schemas or a non-empty array of
# schemas in every JSON Schema draft ("items" is a schema or an array of them).
_SCHEMA_VALUED = frozenset(
    (
        "not",
        "additionalProperties",
        "contains",
        "propertyNames",
        "if",
        "then",
        "else",
        "additionalItems",
        "unevaluatedProperties",
        "unevaluatedItems",
    )
)
_SCHEMA_OBJECTS = frozenset(
    ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
)
_SCHEMA_ARRAYS = frozenset(("anyOf", "oneOf", "allOf", "prefixItems"))
_HOLDING_SCHEMAS = _SCHEMA_VALUED | _SCHEMA_OBJECTS | _SCHEMA_ARRAYS | {"items"}
_CHECKED_KEYWORDS = _HOLDING_SCHEMAS | {"type", "required", "enum"}
# The most characters of structural tag (the call grammar vLLM hands xgrammar: the
# tools' names, keys and value schemas) one request may have compiled. Compile
# time grows faster than the tag (about 1 s at this size, 3 to 7 s at three
# times it, 23 to 84 s at ten times it; extensions/spark2_5/benchmarks/
# bench_grammar.py measures it), and compiles queue for a small pool of workers,
# so a bigger tag would hold up every later constrained request.
MAX_GRAMMAR_SCHEMA_CHARS = 350_000


def _name_problem(name: str) -> str | None:
    """Why no Spark2_5 call can name a tool called ``name``, or None."""
    if not name:
        return "is empty"
    if WHITESPACE.search(name):
        return "contains whitespace, where a Spark2_5 call's tool name ends"
    if any(tag in name for tag in TAGS):
        return "contains a tag of Spark2_5's call format"
    return None


def _shown(value: Any) -> str:
    """``value`` as JSON, cut short: messages must not echo a whole hostile schema."""
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 60 else text[:57] + "..."


def _json_path(where: tuple[str | int, ...]) -> str:
    """``("properties", "a b", "items", 0)`` as ``$.properties["a b"].items[0]``, its
    middle cut out when long: a schema may nest 64 levels of long names."""
    path = "$" + "".join(
        f"[{step}]"
        if isinstance(step, int)
        else f".{step}"
        if step.isidentifier()
        else f"[{_shown(step)}]"
        for step in where
    )
    return path if len(path) <= 160 else f"{path[:60]}...{path[-97:]}"


def _keyword_problem(schema: dict[str, Any]) -> tuple[str, str] | None:
    """``(keyword, what is wrong)`` for the first unsound structural keyword of one
    schema object, or None."""
    if "type" in schema:
        declared = schema["type"]
        names = declared if isinstance(declared, list) else [declared]
        if not names or not all(isinstance(name, str) and name in _SCHEMA_TYPES for name in names):
            return "type", f"{_shown(declared)} is not one of {', '.join(_SCHEMA_TYPES)}"
    required = schema.get("required", [])
    if not isinstance(required, list) or not all(isinstance(key, str) for key in required):
        return "required", f"{_shown(required)} is not an array of property names"
    if not isinstance(schema.get("enum", []), list):
        return "enum", f"{_shown(schema['enum'])} is not an array of values"
    for key in sorted(schema.keys() & _SCHEMA_OBJECTS):
        if not isinstance(schema[key], dict):
            return key, f"{_shown(schema[key])} is not an object of schemas"
    for key in sorted(schema.keys() & _SCHEMA_ARRAYS):
        if not (isinstance(schema[key], list) and schema[key]):
            return key, f"{_shown(schema[key])} is not a non-empty array of schemas"
    return None


def _subschemas(schema: dict[str, Any]) -> list[tuple[tuple[str | int, ...], Any]]:
    """``(steps, subschema)`` of the schemas directly inside ``schema``, whose
    keywords :func:`_keyword_problem` found sound."""
    children: list[tuple[tuple[str | int, ...], Any]] = []
    for key in sorted(schema.keys() & _HOLDING_SCHEMAS, reverse=True):
        value = schema[key]
        if key in _SCHEMA_OBJECTS:
            children += [((key, name), child) for name, child in value.items()]
        elif key in _SCHEMA_ARRAYS or (key == "items" and isinstance(value, list)):
            children += [((key, index), child) for index, child in enumerate(value)]
        else:
            children.append(((key,), value))
    return children


def _schema_problem(schema: dict[str, Any]) -> str | None:
    """Where a parameter schema is unusable and why, or None. Checked: the nesting
    depth and the keywords that shape calls (``type``, ``required``, ``enum`` and
    those holding subschemas), in time linear in the schema's size."""
    if nests_deeper_than(schema, MAX_SCHEMA_DEPTH):
        return f"at $, objects and arrays nest more than {MAX_SCHEMA_DEPTH} levels deep"
    pending: list[tuple[tuple[str | int, ...], Any]] = [((), schema)]
    while pending:
        where, node = pending.pop()
        if isinstance(node, bool):  # true and false are schemas too
            continue
        if not isinstance(node, dict):
            return f"at {_json_path(where)}, {_shown(node)} is not a schema (an object)"
        if node.keys().isdisjoint(_CHECKED_KEYWORDS):
            continue
        if problem := _keyword_problem(node):
            keyword, what = problem
            return f"at {_json_path((*where, keyword))}, {what}"
        pending += [((*where, *steps), child) for steps, child in _subschemas(node)]
    return None


class ToolsRefused(ValueError):
    """A request's ``tools`` that the carrier refuses; ``value`` names the tool."""

    parameter = "tools"

    def __init__(self, message: str, value: str) -> None:
        super().__init__(message)
        self.value = value


def check_tools(tools: Sequence[tuple[str, Any]]) -> None:
    """Refuse a function tool no Spark2_5 call can name or whose parameters are not
    a usable JSON Schema. vLLM takes both: the model is shown a tool it cannot
    call, ``tool_choice="required"`` ends without a call, and a forced call's
    broken schema fails later as a grammar error that names nothing, in a stream
    only after the response has begun."""
    for name, parameters in tools:
        if problem := _name_problem(name):
            raise ToolsRefused(
                f"tools: the function name {_shown(name)} {problem}, so the model could "
                "never call it. Fix: name the tool with letters, digits, '_' and '-' only.",
                value=_shown(name),
            )
        if isinstance(parameters, dict) and (problem := _schema_problem(parameters)):
            raise ToolsRefused(
                f"tools: the parameters of function {_shown(name)} are not a usable JSON "
                f"Schema: {problem}. Fix: correct the schema there (https://json-schema.org).",
                value=_shown(name),
            )


# A grammar that pins whole schemas compiles far slower per property than one that pins
# names and keys: one strict tool of 300 properties compiled in 0.6 s, of 600 in 3.8 s,
# of 1,000 in 22 s, of 1,400 in 39 s, all within the character bound (vLLM 0.32 CPU,
# 2 cores; benchmarks/bench_agent_tools.py, evidence/perf-agent-tools.json). Compiles
# queue for a few workers, so one such request would hold up the constrained requests
# after it: a request pins at most this many properties in all. A forced call pins
# the schemas of tools that do not say "strict" only up to it; tools that say
# "strict": true beyond it are refused.
MAX_PINNED_PROPERTIES = 300


def declared_properties(tools: Sequence[tuple[str, Any]]) -> int:
    """How many properties the tools' schemas declare, nested and under ``$defs`` too."""
    count, pending = 0, [schema for _, schema in tools]
    while pending:  # no recursion: the schema may not have been checked yet
        node = pending.pop()
        if isinstance(node, dict):
            if isinstance(node.get("properties"), dict):
                count += len(node["properties"])
            pending.extend(node.values())
        elif isinstance(node, list):
            pending.extend(node)
    return count


def check_strict_properties(strict_tools: Sequence[tuple[str, Any]]) -> None:
    """Refuse, naming the largest, ``"strict": true`` tools whose schemas declare more
    than ``MAX_PINNED_PROPERTIES`` properties in all: their grammar pins every one."""
    total = declared_properties(strict_tools)
    if total <= MAX_PINNED_PROPERTIES:
        return
    largest, name = max((declared_properties([tool]), tool[0]) for tool in strict_tools)
    raise ToolsRefused(
        f'tools: the "strict": true tools declare {total:,} properties in all, more than '
        f"the {MAX_PINNED_PROPERTIES:,} one request's call grammar may pin (it would "
        f"compile for seconds, holding up the requests after it); the largest is "
        f'function {_shown(name)} ({largest:,} properties). Fix: set "strict": false '
        "on the largest tools, or send fewer or smaller strict tools.",
        value=_shown(name),
    )


def check_grammar_size(tools: Sequence[tuple[str, Any]], structural_tag: str) -> None:
    """Refuse, naming the largest tool, a request whose call grammar
    (``structural_tag``, the JSON vLLM compiles) is longer than
    ``MAX_GRAMMAR_SCHEMA_CHARS``."""
    size = len(structural_tag)
    if size <= MAX_GRAMMAR_SCHEMA_CHARS:
        return
    sizes = [(len(json.dumps(schema, ensure_ascii=False)), name) for name, schema in tools]
    largest, name = max(sizes, default=(0, ""))
    raise ToolsRefused(
        f"tools: the grammar that constrains this request's tool calls would be "
        f"{size:,} characters, more than the {MAX_GRAMMAR_SCHEMA_CHARS:,} one request may "
        f"have compiled; the largest tool is function {_shown(name)} (parameters of "
        f"{largest:,} characters). Fix: send fewer tools or fewer parameters, or "
        f'tool_choice="auto" without "strict" tools.',
        value=_shown(name),
    )
