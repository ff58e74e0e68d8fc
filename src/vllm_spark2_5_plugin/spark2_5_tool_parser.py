"""``spark25``: vLLM tool-call parser for Spark2_5's XML/KV call format.

Spark2_5 writes a call as::

    <tool_call>NAME<arg_key>KEY</arg_key><arg_value>VALUE</arg_value>...</tool_call>

The chat template renders this compact form; models also put newlines or other
whitespace between the tags. The tags are special tokens of the real tokenizer,
but the parser reads text, so tags spelled out character by character parse the
same way.

One incremental scanner serves both entry points. ``extract_tool_calls`` feeds it
the whole output and finishes it; streaming feeds it each delta and vLLM
finishes it through ``finish_streaming``. Both therefore report the same content
and calls however the output was split. A streamed call is announced (id and
name) as soon as its name is complete and then grows by one JSON fragment per
completed key/value pair; the fragments concatenate to exactly the
non-streaming ``arguments``. The scanner holds back at most a partial tag and
the element it is reading, and reads each character a bounded number of times,
so a stream costs time linear in its length.

A request whose function tool has a name no call can carry (empty, whitespace,
a call tag) or parameters that are not a usable JSON Schema is refused with a
400 naming the tool, before vLLM builds a grammar for it (``check_tools``).

What becomes of unusual output (``docs/tool-calling.md`` has it for users):

* Nothing is a call when the request declares no tools or ``tool_choice`` is
  ``"none"``; the output is content, verbatim.
* A name ends at whitespace or at the next tag. A block whose name is empty or
  not a declared tool is returned verbatim as content. A name longer than both
  256 characters and every declared name is refused the moment it grows that
  long, by both paths alike, so a stream need not hold it to the next tag.
* Values are converted by the declared type and never rounded; what cannot be
  carried exactly (a float would round it, an integer of more than 4,300
  digits, JSON nested deeper than 128 levels) stays the text the model wrote.
  Conversion takes time linear in the value's length.
* Markup that does not form a complete key/value pair inside a call (an
  unterminated pair, a key that repeats, stray text between tags) is returned
  as content, and the call keeps its complete pairs. A call that is never
  closed ends with the output.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from typing import Any, NamedTuple

from vllm_spark2_5_plugin import compat

ToolParser = compat.tool_parser_base()
_protocol = compat.tool_call_protocol()
DeltaFunctionCall = _protocol.DeltaFunctionCall
DeltaMessage = _protocol.DeltaMessage
DeltaToolCall = _protocol.DeltaToolCall
ExtractedToolCallInformation = _protocol.ExtractedToolCallInformation
FunctionCall = _protocol.FunctionCall
ToolCall = _protocol.ToolCall
make_tool_call_id = compat.tool_call_id_factory()

TOOL_CALL_START = "<tool_call>"
TOOL_CALL_END = "</tool_call>"
ARG_KEY_START = "<arg_key>"
ARG_KEY_END = "</arg_key>"
ARG_VALUE_START = "<arg_value>"
ARG_VALUE_END = "</arg_value>"
_TAGS = frozenset(
    (TOOL_CALL_START, TOOL_CALL_END, ARG_KEY_START, ARG_KEY_END, ARG_VALUE_START, ARG_VALUE_END)
)
_LONGEST_TAG = max(map(len, _TAGS))
_TAG_PREFIXES = frozenset(tag[:end] for tag in _TAGS for end in range(1, len(tag)))
# A name or key longer than this is prose after a stray tag, not an identifier:
# release it as content instead of holding the stream back until the next tag.
# A declared tool's longer name raises the limit for names to its length.
MAX_IDENTIFIER_CHARS = 256

# GLM-4.7's structural tag writes <tool_call>NAME<arg_key>K</arg_key><arg_value>V
# </arg_value></tool_call> with string values raw and other values as JSON: byte
# for byte the compact form Spark2_5's chat template renders.
_STRUCTURAL_TAG_FORMAT = "glm_4_7"

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
_WHITESPACE = re.compile(r"\s")
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


def _nests_deeper_than(value: Any, depth: int) -> bool:
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
    if not isinstance(value, kinds) or _nests_deeper_than(value, MAX_JSON_DEPTH):
        return _NO_MATCH
    written = _compact_json(value)
    return _NO_MATCH if _SURROGATE.search(written) else written


def _compact_json(value: Any) -> str:
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


def schema_types(schema: Any) -> set[str]:
    """JSON types a parameter schema admits: ``type`` (one or a list),
    ``nullable``, the types of ``enum``/``const`` values, and the same for the
    branches of ``anyOf``/``oneOf``/``allOf``, however deep (read without
    recursion). Empty when the schema says nothing."""
    types: set[str] = set()
    pending = [schema]
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
    return types


def value_json(raw: str, schema: Any) -> str:
    """The JSON text of the value between ``<arg_value>`` and ``</arg_value>``.

    A string parameter (or one without type information) gets the text verbatim,
    so a string parameter's ``null`` is the string "null"; a parameter whose
    schema also admits null gets ``null``. Otherwise the declared types are
    tried in the order null, integer, number, boolean, object, array (the
    surrounding whitespace ignored), then string; when none accepts the text,
    it is kept as the JSON it spells or else as the string. Numbers are never
    rounded: an integer is written out exactly, a float only where it reads back
    as the literal's value, else the literal stays (``docs/tool-calling.md``).
    Time is linear in the text's length.
    """
    types = schema_types(schema)
    if types <= {"string"}:
        return _compact_json(raw)
    text = raw.strip()
    for type_name in _TYPE_ORDER:
        if type_name in types:
            value = _CONVERTERS[type_name](text)
            if value is not _NO_MATCH:
                return value
    if "string" in types:
        return _compact_json(raw)
    written = _json_text(text)
    return _compact_json(raw) if written is _NO_MATCH else written


class _Scanner:
    """Incremental reader of Spark2_5 output: content, and calls as JSON fragments.

    ``feed`` text in pieces, then ``finish``. Output accumulates in ``content``
    (text pieces) and ``events``: ``(call_index, name, fragment)`` where a call's
    first event carries its name and an empty fragment and later ones carry
    ``None`` and the next piece of its arguments. The owner drains both.
    """

    def __init__(self, tools: Sequence[Any] | None) -> None:
        self.content: list[str] = []
        self.events: list[tuple[int, str | None, str]] = []
        self._tools = tools
        # The longest name that may be a call. Streaming must give up on a name at
        # some length; refusing longer names everywhere makes both paths agree.
        self._name_limit = max([MAX_IDENTIFIER_CHARS, *map(len, compat.function_tool_names(tools))])
        self._held = ""  # a tail that may be the start of a tag
        self._state = "content"
        # Raw pieces of the element being read: a block's "<tool_call>" and name, a
        # pair's tags, key, whitespace and value, or whitespace between a call's tags.
        self._pieces: list[str] = []
        # Inside a call, text between two tags is dropped when it is whitespace only
        # and otherwise returned as content; True once this run has shown it is not.
        self._stray_run = False
        self._identifier_chars = 0
        self._key = ""
        self._value_start = 0
        self._calls = 0
        self._properties: dict[str, Any] = {}
        self._call_keys: set[str] = set()

    # -- input ---------------------------------------------------------------

    def feed(self, text: str) -> None:
        if self._state == "content" and not self._held and "<" not in text:
            self.content.append(text)  # the common case, kept cheap: plain text
            return
        if self._held:
            text = self._held + text
            self._held = ""
        start = search = 0
        while (lt := text.find("<", search)) != -1:
            gt = text.find(">", lt + 1, lt + _LONGEST_TAG)
            if gt != -1 and text[lt : gt + 1] in _TAGS:
                if lt > start:
                    self._text(text[start:lt])
                self._tag(text[lt : gt + 1])
                start = search = gt + 1
            elif gt == -1 and len(text) - lt < _LONGEST_TAG and text[lt:] in _TAG_PREFIXES:
                self._held = text[lt:]
                text = text[:lt]
                break
            else:
                search = lt + 1
        if start < len(text):
            self._text(text[start:])

    def finish(self) -> None:
        held, self._held = self._held, ""
        if held:
            self._text(held)
        if self._state == "name":
            self._reject_block()
        elif self._state != "content":
            if self._state != "body":
                self._abandon_pair(stray_run=False)
            self._close_call()

    # -- dispatch by state ------------------------------------------------------

    def _text(self, text: str) -> None:
        state = self._state
        if state == "content":
            self.content.append(text)
        elif state == "value":
            self._pieces.append(text)
        elif state == "body":
            if self._stray_run:
                self.content.append(text)
            elif text.isspace():
                self._pieces.append(text)
            else:
                self._pieces.append(text)
                self._abandon_pair(stray_run=True)
        elif state == "gap":
            self._pieces.append(text)
            if not text.isspace():
                self._abandon_pair(stray_run=True)
        elif state == "name":
            self._name_text(text)
        else:  # "key"
            self._pieces.append(text)
            self._identifier_chars += len(text)
            if self._identifier_chars > MAX_IDENTIFIER_CHARS:
                self._abandon_pair(stray_run=True)

    def _name_text(self, text: str) -> None:
        """A name ends at whitespace (names have none) or at the next tag, so the
        newline form announces its call one character after the name."""
        start = 0
        if not self._identifier_chars:  # skip whitespace before the name
            start = len(text) - len(text.lstrip())
        end = _WHITESPACE.search(text, start) if start < len(text) else None
        if end is None:
            self._pieces.append(text)
            self._identifier_chars += len(text) - start
            if self._identifier_chars > self._name_limit:
                self._reject_block()
            return
        self._pieces.append(text[: end.start()])
        if not self._open_call("".join(self._pieces[1:]).strip()):
            self._reject_block()
        self._text(text[end.start() :])

    def _tag(self, tag: str) -> None:
        state = self._state
        if state == "content":
            if tag == TOOL_CALL_START and self._tools:
                self._begin("name", tag)
            else:
                self.content.append(tag)
        elif state == "name":
            name = "".join(self._pieces[1:]).strip()
            if tag in (ARG_KEY_START, TOOL_CALL_END) and self._open_call(name):
                self._tag(tag)
            else:
                self._reject_block()
                self._tag(tag)
        elif state == "body":
            self._pieces = []  # whitespace between tags
            self._stray_run = False
            if tag == ARG_KEY_START:
                self._begin("key", tag)
            elif tag in (TOOL_CALL_END, TOOL_CALL_START):
                self._close_call()
                if tag == TOOL_CALL_START:
                    self._tag(tag)
            else:
                self.content.append(tag)
        elif state == "key" and tag == ARG_KEY_END:
            self._key = "".join(self._pieces[1:]).strip()
            self._pieces.append(tag)
            self._state = "gap"
        elif state == "gap" and tag == ARG_VALUE_START:
            self._pieces.append(tag)
            self._value_start = len(self._pieces)
            self._state = "value"
        elif state == "value" and tag == ARG_VALUE_END:
            self._end_pair(tag)
        elif state == "value" and tag != TOOL_CALL_END:
            self._pieces.append(tag)  # values may contain other tags' text
        else:
            self._abandon_pair(stray_run=False)
            self._tag(tag)

    # -- transitions --------------------------------------------------------------

    def _begin(self, state: str, tag: str) -> None:
        self._state = state
        self._pieces = [tag]
        self._identifier_chars = 0

    def _reject_block(self) -> None:
        """The block after ``<tool_call>`` is no call: give its text back as content."""
        self.content.append("".join(self._pieces))
        self._pieces = []
        self._state = "content"

    def _open_call(self, name: str) -> bool:
        too_long = len(name) > self._name_limit
        if not name or too_long or not compat.find_tool_name(self._tools, name):
            return False
        self.events.append((self._calls, name, ""))
        self._calls += 1
        properties = compat.find_tool_properties(self._tools, name)
        self._properties = properties if isinstance(properties, dict) else {}
        self._call_keys = set()
        self._pieces = []
        self._stray_run = False
        self._state = "body"
        return True

    def _end_pair(self, tag: str) -> None:
        key = self._key
        if not key or key in self._call_keys:
            self._pieces.append(tag)
            self._abandon_pair(stray_run=False)
            return
        raw = "".join(self._pieces[self._value_start :])
        value = value_json(raw, self._properties.get(key))
        separator = "," if self._call_keys else "{"
        self._call_keys.add(key)
        self.events.append((self._calls - 1, None, separator + _compact_json(key) + ":" + value))
        self._pieces = []
        self._state = "body"

    def _abandon_pair(self, stray_run: bool) -> None:
        """What is being read inside a call is no pair: its text goes to content and
        the call goes on. ``stray_run``: text (not a tag) ended it, so the rest of
        the text up to the next tag is content too."""
        self.content.append("".join(self._pieces))
        self._pieces = []
        self._stray_run = stray_run
        self._state = "body"

    def _close_call(self) -> None:
        self.events.append((self._calls - 1, None, "}" if self._call_keys else "{}"))
        self._state = "content"


def _callable_tools(request: Any) -> Sequence[Any] | None:
    if request is None or getattr(request, "tool_choice", None) == "none":
        return None
    return request.tools or None


def _forces_call(tool_choice: Any) -> bool:
    """``tool_choice="required"``, a named tool, or allowed tools in required mode."""
    if tool_choice == "required":
        return True
    choice_type = getattr(tool_choice, "type", None)
    if choice_type in ("function", "custom"):
        return True
    return choice_type == "allowed_tools" and getattr(tool_choice, "mode", None) == "required"


def _describe_choice(tool_choice: Any) -> str:
    if isinstance(tool_choice, str):
        return repr(tool_choice)
    name = getattr(tool_choice, "name", None) or getattr(
        getattr(tool_choice, "function", None), "name", None
    )
    return f"{{named tool {name!r}}}" if name else repr(tool_choice)


def _name_problem(name: str) -> str | None:
    """Why no Spark2_5 call can name a tool called ``name``, or None."""
    if not name:
        return "is empty"
    if _WHITESPACE.search(name):
        return "contains whitespace, where a Spark2_5 call's tool name ends"
    if any(tag in name for tag in _TAGS):
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
    if _nests_deeper_than(schema, MAX_SCHEMA_DEPTH):
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


def check_tools(tools: Sequence[Any] | None) -> None:
    """Refuse, with a 400 naming the tool, a function tool no Spark2_5 call can
    name or whose parameters are not a usable JSON Schema. vLLM takes both: the
    model is shown a tool it cannot call, ``tool_choice="required"`` ends
    without a call, and a forced call's broken schema fails later as a grammar
    error that names nothing, in a stream only after the response has begun."""
    for name, parameters in compat.function_tools(tools):
        if problem := _name_problem(name):
            raise compat.request_validation_error(
                f"tools: the function name {_shown(name)} {problem}, so the model could "
                "never call it. Fix: name the tool with letters, digits, '_' and '-' only.",
                parameter="tools",
                value=_shown(name),
            )
        if isinstance(parameters, dict) and (problem := _schema_problem(parameters)):
            raise compat.request_validation_error(
                f"tools: the parameters of function {_shown(name)} are not a usable JSON "
                f"Schema: {problem}. Fix: correct the schema there (https://json-schema.org).",
                parameter="tools",
                value=_shown(name),
            )


class Spark25ToolParser(ToolParser):
    """Tool-call parser for Spark2_5 (``--tool-call-parser spark25``)."""

    # Required and named calls are written in Spark's XML, never as vLLM's JSON.
    supports_required_and_named = False
    structural_tag_model = (
        _STRUCTURAL_TAG_FORMAT if _STRUCTURAL_TAG_FORMAT in compat.structural_tag_models() else None
    )
    # The scanner keeps its own state, so vLLM may pass bare deltas, and it must
    # be told when the stream ends (``finish_streaming``) to release what it holds.
    engine_based_streaming = True

    def __init__(self, tokenizer: Any, tools: list[Any] | None = None) -> None:
        # Calls are checked against each request's tools, whatever the base keeps.
        super().__init__(tokenizer, tools)
        self._stream: _Scanner | None = None

    def adjust_request(self, request: Any) -> Any:
        # Before the base: on vLLM 0.23 it moves a forced request's "$defs" out of
        # the tools it turns into a JSON grammar, and they would go unchecked.
        check_tools(request.tools)
        request = super().adjust_request(request)
        if not request.tools or request.tool_choice == "none":
            return request
        # The call tags are special tokens: skipping them would hide every call.
        request.skip_special_tokens = False
        structured_outputs = getattr(request, "structured_outputs", None)
        if _forces_call(request.tool_choice) and (
            structured_outputs is None or structured_outputs.structural_tag is None
        ):
            if self.structural_tag_model is None:
                reason = "this vLLM has no structural tag for Spark2_5's call format"
                fix = "upgrade vLLM to a release with tool-call structural tags"
            else:
                reason = "VLLM_ENFORCE_STRICT_TOOL_CALLING=0 turns structural tags off"
                fix = "restart the server without VLLM_ENFORCE_STRICT_TOOL_CALLING=0"
            raise compat.request_validation_error(
                f"tool_choice={_describe_choice(request.tool_choice)} needs the output "
                f"constrained to a Spark2_5 tool call, but {reason}, so the model could "
                f'answer in plain text. Fix: {fix}, or send tool_choice="auto".',
                parameter="tool_choice",
                value=_describe_choice(request.tool_choice),
            )
        return request

    def extract_tool_calls(self, model_output: str, request: Any) -> Any:
        scanner = _Scanner(_callable_tools(request))
        scanner.feed(model_output)
        scanner.finish()
        calls: list[tuple[str, list[str]]] = []
        for index, name, fragment in scanner.events:
            if name is not None:
                calls.append((name, []))
            calls[index][1].append(fragment)
        tool_calls = [
            ToolCall(
                id=make_tool_call_id(),
                function=FunctionCall(name=name, arguments="".join(fragments)),
            )
            for name, fragments in calls
        ]
        return ExtractedToolCallInformation(
            tools_called=bool(tool_calls),
            tool_calls=tool_calls,
            content="".join(scanner.content) or None,
        )

    def extract_tool_calls_streaming(
        self,
        previous_text: str,
        current_text: str,
        delta_text: str,
        previous_token_ids: Sequence[int],
        current_token_ids: Sequence[int],
        delta_token_ids: Sequence[int],
        request: Any,
    ) -> Any:
        if self._stream is None:
            self._stream = _Scanner(_callable_tools(request))
        if not delta_text:
            return None
        self._stream.feed(delta_text)
        return self._drain()

    def finish_streaming(self) -> Any:
        """Release what the stream still holds: a partial tag, an unclosed call."""
        if self._stream is None:
            return None
        self._stream.finish()
        return self._drain()

    def _drain(self) -> Any:
        scanner = self._stream
        if not scanner.content and not scanner.events:
            return None  # inside a call, between pairs
        content = "".join(scanner.content)
        scanner.content.clear()
        if not scanner.events:
            return DeltaMessage(content=content) if content else None
        names: dict[int, str | None] = {}
        arguments: dict[int, list[str]] = {}
        for index, name, fragment in scanner.events:
            if name is not None:
                names[index] = name
            arguments.setdefault(index, []).append(fragment)
        scanner.events.clear()
        tool_calls = []
        for index, fragments in arguments.items():
            name = names.get(index)
            if name is None:
                function = DeltaFunctionCall(arguments="".join(fragments))
                tool_calls.append(DeltaToolCall(index=index, function=function))
            else:
                function = DeltaFunctionCall(name=name, arguments="".join(fragments))
                tool_calls.append(
                    DeltaToolCall(
                        index=index, id=make_tool_call_id(), type="function", function=function
                    )
                )
        return DeltaMessage(content=content or None, tool_calls=tool_calls)
