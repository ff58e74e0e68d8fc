# SPDX-License-Identifier: Apache-2.0
"""Values as the model writes them, turned into the JSON of a call's arguments.

A value is converted by the JSON-schema types its parameter declares (local
``$ref``s followed), never rounded; what cannot be carried exactly stays the
text the model wrote (``extensions/spark2_5/docs/tool-calling.md`` has the rules for users).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, NamedTuple

# How values are converted, in the order a union type tries its members.
_TYPE_ORDER = ("null", "integer", "number", "boolean", "object", "array")
_JSON_TYPE_NAMES = {
    type(None): "null",
    bool: "boolean",
    int: "integer",
    float: "number",
    str: "string",
    list: "array",
    dict: "object",
}
# A number as models write it: a sign, ASCII digits with at most one ".", an
# exponent. Each part ends at a character it cannot contain, so a failed match
# backtracks in time linear in the text's length, not quadratic.
_NUMBER = re.compile(r"([-+]?)([0-9]*)(?:\.([0-9]*))?([eE][-+]?[0-9]+)?")
# Python reads integers of at most this many digits (its default int-string
# limit): longer ones in the arguments would break json.loads in clients, and in
# vLLM itself when the call comes back in the conversation.
MAX_INTEGER_DIGITS = 4300
# Writing a number as an integer may append this many zeros, enough for every
# float (1e308): more would turn a short value into a long one.
MAX_EXPONENT_ZEROS = 308
# Objects and arrays nest at most this deep, far inside the recursion limits of
# the JSON readers and writers that handle the arguments after the parser.
MAX_JSON_DEPTH = 128
# An exponent beyond this decides nothing more: the number is far outside every
# bound above either way.
_EXPONENT_CLAMP = 10**9
_SURROGATE = re.compile("[\ud800-\udfff]")
_NO_MATCH = object()


class _Number(NamedTuple):
    """A number literal: its JSON spelling, and its exact value ±``digits`` × 10**``scale``."""

    spelling: str
    negative: bool
    digits: str  # no leading zeros; empty for zero
    scale: int


def _read_number(text: str) -> _Number | None:
    """The number ``text`` spells (see ``_NUMBER``), or None."""
    match = _NUMBER.fullmatch(text)
    if match is None or not (match[2] or match[3]):
        return None
    sign, whole, fraction, exponent = match.groups(default="")
    magnitude = exponent[1:].lstrip("+-").lstrip("0") or "0"
    exponent_value = min(int(magnitude[:10]), _EXPONENT_CLAMP)
    if exponent[1:2] == "-":
        exponent_value = -exponent_value
    digits = (whole + fraction).lstrip("0")
    spelling = (
        ("-" if sign == "-" else "")
        + (whole.lstrip("0") or "0")
        + ("." + fraction if fraction else "")
        + exponent
    )
    return _Number(spelling, sign == "-" and bool(digits), digits, exponent_value - len(fraction))


def _exact_value(number: _Number) -> tuple[bool, str, int]:
    """The number's value in one canonical form, for exact comparison."""
    significant = number.digits.rstrip("0")
    if not significant:
        return (False, "", 0)
    return (number.negative, significant, number.scale + len(number.digits) - len(significant))


def _integer_json(number: _Number) -> str | None:
    """The number written out as a JSON integer, or None when it has a fraction or
    would take more zeros or digits than allowed."""
    if not number.digits:
        return "0"
    if number.scale > MAX_EXPONENT_ZEROS:
        return None
    if number.scale >= 0:
        written = number.digits + "0" * number.scale
    elif number.digits[number.scale :].strip("0"):
        return None  # a fraction remains
    else:
        written = number.digits[: number.scale]
    if len(written) > MAX_INTEGER_DIGITS:
        return None
    return "-" + written if number.negative else written


def _shortest_exact(number: _Number, value: float) -> str | None:
    """``repr`` of ``value`` (the finite ``float`` of the number's text) if it reads
    back as exactly the value the model wrote, else None."""
    shortest = repr(value)
    return shortest if _exact_value(_read_number(shortest)) == _exact_value(number) else None


def _exact_float(text: str) -> float:
    """``parse_float`` for JSON values: a float only where it is exact. Most floats
    are written as Python writes them, which is checked first because it is cheap."""
    value = float(text)
    if repr(value) != text and (
        not math.isfinite(value) or _shortest_exact(_read_number(text), value) is None
    ):
        raise ValueError(f"{text} is not exactly a float")
    return value


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INTEGER_DIGITS:
        raise ValueError(f"an integer of more than {MAX_INTEGER_DIGITS} digits")
    return int(text)


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def nests_deeper_than(value: Any, depth: int) -> bool:
    """Whether arrays and objects nest more than ``depth`` levels, counted level by
    level: recursion is what the limit guards against."""
    level = [value]
    for _ in range(depth + 1):
        level = [item for item in level if isinstance(item, (dict, list))]
        if not level:
            return False
        level = [
            child for item in level for child in (item.values() if isinstance(item, dict) else item)
        ]
    return True


def _json_text(text: str, kinds: type | tuple[type, ...] = object) -> Any:
    """The compact JSON of ``text`` if it is strict JSON for a value of ``kinds``, else
    ``_NO_MATCH``: not JSON, NaN or Infinity, a float that would round, an integer of
    more than ``MAX_INTEGER_DIGITS`` digits, nesting deeper than ``MAX_JSON_DEPTH``,
    or an unpaired surrogate escape ("\\ud800"), which JSON reads as a code point no
    response can encode."""
    try:
        value = json.loads(
            text,
            parse_float=_exact_float,
            parse_int=_bounded_int,
            parse_constant=_reject_constant,
        )
    except (ValueError, RecursionError):
        return _NO_MATCH
    if not isinstance(value, kinds) or nests_deeper_than(value, MAX_JSON_DEPTH):
        return _NO_MATCH
    written = compact_json(value)
    return _NO_MATCH if _SURROGATE.search(written) else written


def compact_json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _as_null(text: str) -> Any:
    return "null" if text.lower() == "null" else _NO_MATCH


def _as_integer(text: str) -> Any:
    number = _read_number(text)
    written = None if number is None else _integer_json(number)
    return _NO_MATCH if written is None else written


def _as_number(text: str) -> Any:
    number = _read_number(text)
    if number is None:
        return _NO_MATCH
    written = _integer_json(number)
    if written is not None:
        return written
    value = float(text)
    if math.isinf(value):
        return _NO_MATCH
    return _shortest_exact(number, value) or number.spelling


def _as_boolean(text: str) -> Any:
    return {"true": "true", "1": "true", "false": "false", "0": "false"}.get(
        text.lower(), _NO_MATCH
    )


def _as_object(text: str) -> Any:
    return _json_text(text, dict)


def _as_array(text: str) -> Any:
    return _json_text(text, list)


_CONVERTERS = {
    "null": _as_null,
    "integer": _as_integer,
    "number": _as_number,
    "boolean": _as_boolean,
    "object": _as_object,
    "array": _as_array,
}

# A parameter's schema is followed through at most this many local "$ref"s (each
# at most once, so a cycle ends): more decides nothing for any real schema.
MAX_REF_HOPS = 64


def resolve_local_ref(root: Any, ref: Any) -> Any:
    """The subschema of ``root`` a local ``$ref`` (``#``, ``#/$defs/Query``,
    ``#/definitions/a~1b``: a JSON Pointer) points at, or None: refs to other
    documents are not fetched."""
    if not isinstance(ref, str) or not (ref == "#" or ref.startswith("#/")):
        return None
    node = root
    for token in ref[2:].split("/") if ref != "#" else ():
        token = token.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and token in node:
            node = node[token]
        elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
            node = node[int(token)]
        else:
            return None
    return node


def schema_types(schema: Any, root: Any = None) -> set[str]:
    """JSON types a parameter schema admits: ``type`` (one or a list),
    ``nullable``, the types of ``enum``/``const`` values, and the same for the
    branches of ``anyOf``/``oneOf``/``allOf`` and for what a local ``$ref`` into
    ``root`` (the tool's whole parameter schema) points at, however deep (read
    without recursion, each ref once, at most ``MAX_REF_HOPS``). Empty when the
    schema says nothing."""
    types: set[str] = set()
    pending = [schema]
    followed: set[str] = set()
    while pending:
        schema = pending.pop()
        if not isinstance(schema, dict):
            continue
        declared = schema.get("type")
        if isinstance(declared, str):
            types.add(declared)
        elif isinstance(declared, list):
            types.update(name for name in declared if isinstance(name, str))
        if schema.get("nullable") is True:
            types.add("null")
        enum = schema.get("enum")
        values = list(enum) if isinstance(enum, list) else []
        if "const" in schema:
            values.append(schema["const"])
        types.update(_JSON_TYPE_NAMES.get(type(value), "string") for value in values)
        for keyword in ("anyOf", "oneOf", "allOf"):
            branches = schema.get(keyword)
            pending.extend(branches if isinstance(branches, list) else ())
        ref = schema.get("$ref")
        if isinstance(ref, str) and ref not in followed and len(followed) < MAX_REF_HOPS:
            followed.add(ref)
            pending.append(resolve_local_ref(root, ref))
    return types


def value_json(raw: str, schema: Any, root: Any = None) -> str:
    """The JSON text of the value between ``<arg_value>`` and ``</arg_value>``.

    A string parameter (or one without type information) gets the text verbatim,
    so a string parameter's ``null`` is the string "null"; a parameter whose
    schema also admits null gets ``null``. Otherwise the declared types (local
    ``$ref``s into ``root`` followed) are tried in the order null, integer,
    number, boolean, object, array (the surrounding whitespace ignored), then
    string; when none accepts the text, it is kept as the JSON it spells or else
    as the string. Numbers are never rounded: an integer is written out exactly,
    a float only where it reads back as the literal's value, else the literal
    stays (``extensions/spark2_5/docs/tool-calling.md``). Time is linear in the text's length.
    """
    types = schema_types(schema, root)
    if types <= {"string"}:
        return compact_json(raw)
    text = raw.strip()
    for type_name in _TYPE_ORDER:
        if type_name in types:
            value = _CONVERTERS[type_name](text)
            if value is not _NO_MATCH:
                return value
    if "string" in types:
        return compact_json(raw)
    written = _json_text(text)
    return compact_json(raw) if written is _NO_MATCH else written
