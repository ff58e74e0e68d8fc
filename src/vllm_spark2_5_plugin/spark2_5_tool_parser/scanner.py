# SPDX-License-Identifier: Apache-2.0
"""The incremental reader of Spark2_5 output: content, and complete calls.

Spark2_5 writes a call as::

    <tool_call>NAME<arg_key>KEY</arg_key><arg_value>VALUE</arg_value>...</tool_call>

The reader is fed the output in pieces of any size and reports, as it goes,
the content and each call as the model writes it: the name once it is complete,
then its arguments' JSON in pieces (a string value as its text arrives, any
other value when ``</arg_value>`` ends it), the closing brace at ``</tool_call>``
(or the next ``<tool_call>``). Nothing reported is ever taken back, so a call's
pieces joined are its arguments. Text inside a call that forms no key/value pair
is dropped: a call carries no text, and a streamed call cannot be interrupted.
Whether a call the output ends inside is a call is the owner's choice
(``finish``): as far as written, or its text verbatim as content.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from vllm_spark2_5_plugin.spark2_5_tool_parser.values import (
    compact_json,
    schema_types,
    value_json,
)

TOOL_CALL_START = "<tool_call>"
TOOL_CALL_END = "</tool_call>"
ARG_KEY_START = "<arg_key>"
ARG_KEY_END = "</arg_key>"
ARG_VALUE_START = "<arg_value>"
ARG_VALUE_END = "</arg_value>"
TAGS = frozenset(
    (TOOL_CALL_START, TOOL_CALL_END, ARG_KEY_START, ARG_KEY_END, ARG_VALUE_START, ARG_VALUE_END)
)
_LONGEST_TAG = max(map(len, TAGS))
_TAG_PREFIXES = frozenset(tag[:end] for tag in TAGS for end in range(1, len(tag)))
# A name or key longer than this is prose after a stray tag, not an identifier:
# release it as content instead of holding the stream back until the next tag.
# A declared tool's longer name raises the limit for names to its length.
MAX_IDENTIFIER_CHARS = 256
WHITESPACE = re.compile(r"\s")
# States in which a call is open: its name was a declared tool's.
_IN_CALL = frozenset(("body", "key", "gap", "value"))


class CallPiece(NamedTuple):
    """A piece of a call's arguments; a call's first piece names it."""

    index: int  # the call's place among the output's calls
    name: str | None
    arguments: str


class Scanner:
    """Incremental reader of Spark2_5 output.

    ``schemas`` maps each function tool the request lets the model call to its
    parameter schema. ``feed`` text in pieces, then ``finish``. ``output`` gathers,
    in the model's order, content (``str``) and ``CallPiece``s; ``calls`` gathers
    ``(name, arguments)`` of each closed call; the owner drains both. ``dropped``
    counts the characters inside calls that formed no key/value pair.
    """

    def __init__(self, schemas: Mapping[str, Any]) -> None:
        self.output: list[str | CallPiece] = []
        self.calls: list[tuple[str, str]] = []
        self.dropped = 0
        self._schemas = schemas
        # The longest name that may be a call. Streaming must give up on a name at
        # some length; refusing longer names everywhere makes both paths agree.
        self._name_limit = max([MAX_IDENTIFIER_CHARS, *map(len, self._schemas)])
        self._held = ""  # a tail that may be the start of a tag
        self._state = "content"
        # Raw pieces of the element being read: a block's "<tool_call>" and name, a
        # pair's tags, key, whitespace and value, or whitespace between a call's tags.
        self._pieces: list[str] = []
        # The open block's text as the model wrote it: the content of a call that
        # is never closed, when the owner wants it so.
        self._block: list[str] = []
        # Inside a call, text between two tags is dropped when it is whitespace only
        # or forms no pair; True once this run has shown it forms none.
        self._stray_run = False
        self._identifier_chars = 0
        self._key = ""
        self._value_start = 0
        self._calls_opened = 0
        self._name = ""
        self._root: Any = None
        self._properties: dict[str, Any] = {}
        self._keys: set[str] = set()  # the open call's keys, the first value kept
        self._pairs_written = 0
        self._arguments: list[str] = []  # the open call's pieces
        # The value being read belongs to a pair of the call; its text streams as
        # it arrives (a string value).
        self._value_kept = False
        self._value_streams = False

    # -- input ---------------------------------------------------------------

    def feed(self, text: str) -> None:
        if self._state == "content" and not self._held and "<" not in text:
            self.output.append(text)  # the common case, kept cheap: plain text
            return
        if self._held:
            text = self._held + text
            self._held = ""
        start = search = 0
        while (lt := text.find("<", search)) != -1:
            gt = text.find(">", lt + 1, lt + _LONGEST_TAG)
            if gt != -1 and text[lt : gt + 1] in TAGS:
                if lt > start:
                    self._read(self._text, text[start:lt])
                self._read(self._tag, text[lt : gt + 1])
                start = search = gt + 1
            elif gt == -1 and len(text) - lt < _LONGEST_TAG and text[lt:] in _TAG_PREFIXES:
                self._held = text[lt:]
                text = text[:lt]
                break
            else:
                search = lt + 1
        if start < len(text):
            self._read(self._text, text[start:])

    def finish(self, cut_call_is_content: bool) -> None:
        """The output ended. A call still open is left as far as written, or with
        ``cut_call_is_content`` dropped from ``calls``' view and given back as content."""
        held, self._held = self._held, ""
        if held and (cut_call_is_content or self._state not in _IN_CALL):
            # Left as far as written, a call does not take the start of a tag that
            # may have been its value's end.
            self._read(self._text, held)
        if self._state == "name":
            self._reject_block()
        elif self._state in _IN_CALL:
            if cut_call_is_content:
                self.output.append("".join(self._block))
            self._block = []
            self._state = "content"

    def _read(self, handle: Callable[[str], None], piece: str) -> None:
        """``handle(piece)``, keeping the open block's text."""
        handle(piece)
        if self._state != "content":
            self._block.append(piece)

    # -- dispatch by state ------------------------------------------------------

    def _text(self, text: str) -> None:
        state = self._state
        if state == "content":
            self.output.append(text)
        elif state == "value":
            self._value_text(text)
        elif state == "body":
            if self._stray_run:
                self.dropped += len(text)
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

    def _value_text(self, text: str) -> None:
        self._pieces.append(text)
        if self._value_streams:
            self._write(compact_json(text)[1:-1])

    def _name_text(self, text: str) -> None:
        """A name ends at whitespace (names have none) or at the next tag."""
        start = 0
        if not self._identifier_chars:  # skip whitespace before the name
            start = len(text) - len(text.lstrip())
        end = WHITESPACE.search(text, start) if start < len(text) else None
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
            if tag == TOOL_CALL_START and self._schemas:
                self._begin("name", tag)
                self._block = []
            else:
                self.output.append(tag)
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
                self.dropped += len(tag)
        elif state == "key" and tag == ARG_KEY_END:
            self._key = "".join(self._pieces[1:]).strip()
            self._pieces.append(tag)
            self._state = "gap"
        elif state == "gap" and tag == ARG_VALUE_START:
            self._begin_value(tag)
        elif state == "value" and tag in (ARG_VALUE_END, TOOL_CALL_END):
            # A value the model leaves open ends with its call.
            self._end_pair(tag)
            if tag == TOOL_CALL_END:
                self._tag(tag)
        elif state == "value":
            self._value_text(tag)  # values may contain other tags' text
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
        self.output.append("".join(self._pieces))
        self._pieces = []
        self._state = "content"

    def _open_call(self, name: str) -> bool:
        too_long = len(name) > self._name_limit
        if not name or too_long or name not in self._schemas:
            return False
        self._name = name
        self._root = self._schemas[name]
        properties = self._root.get("properties") if isinstance(self._root, dict) else None
        self._properties = properties if isinstance(properties, dict) else {}
        self._keys = set()
        self._pairs_written = 0
        self._arguments = []
        self.output.append(CallPiece(self._calls_opened, name, ""))
        self._calls_opened += 1
        self._pieces = []
        self._stray_run = False
        self._state = "body"
        return True

    def _write(self, arguments: str) -> None:
        """Report a piece of the open call's arguments."""
        self._arguments.append(arguments)
        self.output.append(CallPiece(self._calls_opened - 1, None, arguments))

    def _key_prefix(self) -> str:
        """``{"key":`` or ``,"key":``: the start of the next pair's JSON."""
        self._pairs_written += 1
        return ("{" if self._pairs_written == 1 else ",") + compact_json(self._key) + ":"

    def _begin_value(self, tag: str) -> None:
        """A value starts: it belongs to the call unless its key is empty or repeated
        (the first value stays); a string value's JSON streams from here."""
        self._pieces.append(tag)
        self._value_start = len(self._pieces)
        self._state = "value"
        key = self._key
        self._value_kept = bool(key) and key not in self._keys
        self._value_streams = False
        if self._value_kept:
            self._keys.add(key)
            self._value_streams = schema_types(self._properties.get(key), self._root) <= {"string"}
            if self._value_streams:
                self._write(self._key_prefix() + '"')

    def _end_pair(self, tag: str) -> None:
        if not self._value_kept:
            if tag == ARG_VALUE_END:  # a </tool_call> here still closes the call
                self._pieces.append(tag)
            self._abandon_pair(stray_run=False)
            return
        if self._value_streams:
            self._write('"')
        else:
            raw = "".join(self._pieces[self._value_start :])
            schema = self._properties.get(self._key)
            self._write(self._key_prefix() + value_json(raw, schema, self._root))
        self._pieces = []
        self._state = "body"

    def _abandon_pair(self, stray_run: bool) -> None:
        """What is being read inside a call is no pair: its text is dropped and the
        call goes on. ``stray_run``: text (not a tag) ended it, so the rest of the
        text up to the next tag is dropped too."""
        self.dropped += sum(map(len, self._pieces))
        self._pieces = []
        self._stray_run = stray_run
        self._state = "body"

    def _close_call(self) -> None:
        self._write("}" if self._pairs_written else "{}")
        self.calls.append((self._name, "".join(self._arguments)))
        self._block = []
        self._state = "content"
