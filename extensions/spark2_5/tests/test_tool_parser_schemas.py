"""``spark25`` and the schemas clients send: local ``$ref``s resolve for type
conversion (bounded for cycles and depth), ``openai.pydantic_function_tool``
models round-trip through the returned arguments, and the call grammar one
request may have compiled is bounded (a 400 naming the tool, the size and the
limit beyond it)."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest
from pydantic import BaseModel

from spark2_5_dev.fixture import tool_call_text
from spark2_5_dev.host_features import constrains_forced_calls
from spark2_5_dev.tool_parsing import (
    chat_request,
    parse_both_ways,
    serving_parser_cls,
)
from spark2_5_dev.tools import function_tool
from vllm_spark2_5_plugin.spark2_5_tool_parser import (
    MAX_GRAMMAR_SCHEMA_CHARS,
    MAX_PINNED_PROPERTIES,
    MAX_REF_HOPS,
    schema_types,
    value_json,
)

# --- $ref --------------------------------------------------------------------------------


class Query(BaseModel):
    text: str
    limit: int


class Filter(BaseModel):
    field: str
    values: list[int]
    nested: Query | None


class Search(BaseModel):
    query: Query
    backup: Query | None
    filters: list[Filter]
    note: str | None
    count: int


SEARCHES = [
    Search(
        query=Query(text="42", limit=3),
        backup=Query(text="null", limit=0),
        filters=[Filter(field="year", values=[2024, 2025], nested=Query(text="x", limit=1))],
        note="true",
        count=7,
    ),
    Search(query=Query(text="Paris", limit=1), backup=None, filters=[], note=None, count=0),
]


@pytest.mark.parametrize("search", SEARCHES, ids=["all-set", "nones"])
def test_pydantic_function_tool_models_round_trip(tokenizer, search):
    """Nested, optional and lists of models: ``$ref``s into ``$defs`` are followed,
    so each model-typed argument comes back as an object, not a JSON string."""
    tool = openai.pydantic_function_tool(Search, name="search")
    assert '"$ref"' in json.dumps(tool)  # the case at hand: pydantic refers to $defs
    text = tool_call_text("search", search.model_dump(mode="json"))
    (call,) = parse_both_ways(tokenizer, text, chat_request(tools=[tool])).calls
    assert call[0] == "search"
    assert Search.model_validate_json(call[1]) == search


ROOT = {
    "$defs": {
        "count": {"type": "integer"},
        "alias": {"$ref": "#/$defs/count"},
        "loop_a": {"$ref": "#/$defs/loop_b"},
        "loop_b": {"$ref": "#/$defs/loop_a"},
        "self": {"anyOf": [{"$ref": "#/$defs/self"}, {"type": "boolean"}]},
        "a/b~c": {"type": "number"},
    },
    "definitions": {"flag": {"type": "boolean"}},
    "items": [{"type": "null"}],
}


@pytest.mark.parametrize(
    ("ref", "types"),
    [
        ("#/$defs/count", {"integer"}),
        ("#/$defs/alias", {"integer"}),  # a ref to a ref
        ("#/definitions/flag", {"boolean"}),  # the older keyword
        ("#/$defs/a~1b~0c", {"number"}),  # JSON Pointer escapes
        ("#/items/0", {"null"}),
        ("#/$defs/loop_a", set()),  # a cycle ends, saying nothing
        ("#/$defs/self", {"boolean"}),
        ("#/$defs/missing", set()),
        ("other.json#/$defs/count", set()),  # not fetched
        ("#/items/7", set()),
    ],
)
def test_local_refs_resolve_and_cycles_end(ref, types):
    assert schema_types({"$ref": ref}, ROOT) == types


def test_a_chain_of_refs_is_followed_max_ref_hops_deep():
    def chain(length: int) -> dict[str, Any]:
        defs = {f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(length)}
        defs[f"d{length}"] = {"type": "integer"}
        return {"$defs": defs}

    assert value_json("5", {"$ref": "#/$defs/d1"}, chain(MAX_REF_HOPS)) == "5"
    # One hop more decides nothing: the value stays the text the model wrote.
    assert value_json("5", {"$ref": "#/$defs/d0"}, chain(MAX_REF_HOPS)) == '"5"'


# --- the bound on the call grammar -----------------------------------------------------------


def many_properties(count: int) -> dict[str, Any]:
    """One tool of ``count`` short properties, string and integer alternating."""
    schema = {
        f"p{index:05d}": {"type": "integer" if index % 2 else "string"} for index in range(count)
    }
    return function_tool("big", "A tool with many parameters.", schema)


def forced(tokenizer, tool: dict[str, Any], tool_choice: Any = "required", api="chat") -> Any:
    """The request after vLLM's serving-layer parser (and so spark25) adjusted it."""
    return forced_all(tokenizer, [tool], tool_choice, api)


@pytest.mark.skipif(not constrains_forced_calls(), reason="vLLM 0.23 refuses forced calls")
@pytest.mark.parametrize(
    ("api", "tool_choice"),
    [
        ("chat", "required"),
        ("chat", {"type": "function", "function": {"name": "big"}}),
        ("responses", "required"),
        ("responses", {"type": "function", "name": "big"}),
    ],
    ids=["chat-required", "chat-named", "responses-required", "responses-named"],
)
def test_a_forced_call_grammar_beyond_the_bound_is_a_400_naming_tool_size_and_limit(
    tokenizer, api, tool_choice
):
    """1,000 short properties (the docs' figure) compile; 1,100 are refused before
    vLLM compiles anything, with the tool, the grammar's size and the limit."""
    request = forced(tokenizer, many_properties(1000), tool_choice, api)
    assert len(request.structured_outputs.structural_tag) <= MAX_GRAMMAR_SCHEMA_CHARS
    unpinned = forced(tokenizer, many_properties(MAX_PINNED_PROPERTIES + 1), tool_choice, api)
    if "p00000" not in unpinned.structured_outputs.structural_tag:
        pytest.skip("this vLLM's forced-call grammar names no keys: it does not grow with them")
    with pytest.raises(Exception, match='the largest tool is function "big"') as refusal:
        forced(tokenizer, many_properties(1100), tool_choice, api)
    message = str(refusal.value)
    size = int(message.split("would be ", 1)[1].split(" characters", 1)[0].replace(",", ""))
    assert size > MAX_GRAMMAR_SCHEMA_CHARS
    assert f"more than the {MAX_GRAMMAR_SCHEMA_CHARS:,}" in message
    assert type(refusal.value).__name__ == "VLLMValidationError"


@pytest.mark.skipif(not constrains_forced_calls(), reason="vLLM 0.23 refuses forced calls")
def test_a_forced_call_pins_whole_schemas_only_up_to_the_property_bound(tokenizer):
    """Beyond ``MAX_PINNED_PROPERTIES`` a pinned grammar would take seconds to compile:
    the tools go as ``strict: false`` then, on every release (vLLM 0.24 would pin
    them whole by default)."""
    pinned = '"properties": {"p00000"'
    small = forced(tokenizer, many_properties(MAX_PINNED_PROPERTIES))
    assert pinned in small.structured_outputs.structural_tag
    large = forced(tokenizer, many_properties(MAX_PINNED_PROPERTIES + 1))
    assert pinned not in large.structured_outputs.structural_tag


STOCK_TOOL = function_tool(
    "get_stock_price",
    "A stock's closing prices.",
    {"symbol": {"type": "string"}, "days": {"type": "integer"}},
    required=("symbol", "days"),
)


@pytest.mark.skipif(not constrains_forced_calls(), reason="vLLM 0.23 refuses forced calls")
@pytest.mark.parametrize("api", ["chat", "responses"])
@pytest.mark.parametrize(
    ("tool_choice", "strict", "pinned"),
    [
        ("required", None, True),
        ("named", None, True),
        ("required", False, False),
        ("auto", None, False),
    ],
    ids=["required", "named", "required-strict-false", "auto"],
)
def test_a_forced_call_is_held_to_its_tools_schema(tokenizer, api, tool_choice, strict, pinned):
    """Required keys and value types are pinned in the call grammar of a forced call
    (vLLM's default pins the frame only); not for a tool that says strict: false, and
    not under "auto"."""
    if tool_choice == "named":
        name = STOCK_TOOL["function"]["name"]
        tool_choice = {
            "type": "function",
            **({"function": {"name": name}} if api == "chat" else {"name": name}),
        }
    tool = {**STOCK_TOOL, "function": {**STOCK_TOOL["function"], "strict": strict}}
    request = forced(tokenizer, tool, tool_choice, api)
    tag = getattr(request.structured_outputs, "structural_tag", None) or ""
    assert ('"required": ["symbol", "days"]' in tag) is pinned, tag


def strict(tool: dict[str, Any], name: str) -> dict[str, Any]:
    return {**tool, "function": {**tool["function"], "name": name, "strict": True}}


@pytest.mark.parametrize("api", ["chat", "responses"])
@pytest.mark.parametrize("tool_choice", ["auto", "required"])
def test_strict_tools_beyond_the_pinned_bound_are_a_400_naming_the_largest_and_the_limit(
    tokenizer, api, tool_choice
):
    """Every property of a ``"strict": true`` tool is pinned in the call grammar, which
    compiles for seconds beyond ``MAX_PINNED_PROPERTIES`` (19 s at 1,000, within the
    character bound): such tools are refused before anything compiles; at the bound
    (an agent's 50 tools of 6 properties) they pass."""
    if tool_choice == "required" and not constrains_forced_calls():
        pytest.skip("vLLM 0.23 refuses forced calls")
    at_bound = [strict(many_properties(MAX_PINNED_PROPERTIES // 2), f"half_{i}") for i in "ab"]
    assert forced_all(tokenizer, at_bound, tool_choice, api) is not None
    small = strict(many_properties(10), "small")
    large = strict(many_properties(MAX_PINNED_PROPERTIES - 5), "large")
    with pytest.raises(Exception, match='the largest is function "large"') as refusal:
        forced_all(tokenizer, [small, large], tool_choice, api)
    message = str(refusal.value)
    assert f"declare {MAX_PINNED_PROPERTIES + 5:,} properties in all" in message
    assert f"more than the {MAX_PINNED_PROPERTIES:,}" in message
    assert 'Fix: set "strict": false on the largest tools' in message
    assert type(refusal.value).__name__ == "VLLMValidationError"
    # The same tools without "strict" are not pinned under "auto": they pass.
    if tool_choice == "auto":
        plain = [many_properties(10), many_properties(MAX_PINNED_PROPERTIES - 5)]
        assert forced_all(tokenizer, plain, "auto", api) is not None


def forced_all(tokenizer, tools: list[dict[str, Any]], tool_choice: Any, api: str) -> Any:
    """:func:`forced` for several tools."""
    if api == "chat":
        request = chat_request(tools=tools, tool_choice=tool_choice)
    else:
        from vllm.entrypoints.openai.responses.protocol import ResponsesRequest

        listed = [{"type": "function", **tool["function"]} for tool in tools]
        request = ResponsesRequest(model="tiny", input="?", tools=listed, tool_choice=tool_choice)
    return serving_parser_cls(tokenizer)(tokenizer, request.tools).adjust_request(request)


def test_without_a_grammar_any_schema_size_passes(tokenizer):
    """Under ``"auto"`` with no strict tool nothing is compiled, so nothing is bounded."""
    request = forced(tokenizer, many_properties(1100), "auto")
    assert getattr(request.structured_outputs, "structural_tag", None) is None
