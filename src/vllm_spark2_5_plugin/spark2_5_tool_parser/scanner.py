# SPDX-License-Identifier: Apache-2.0
"""The incremental reader of Spark2_5 output: content, and complete calls.

Spark2_5 writes a call as::

    <tool_call>NAME<arg_key>KEY</arg_key><arg_value>VALUE</arg_value>...</tool_call>

The reader is fed the output in pieces of any size and reports, as it goes,
the content and each call the moment the call is closed (``</tool_call>`` or
the next ``<tool_call>``). A call still open when the output ends is no call:
its text, verbatim, is content. Until a call closes, nothing of it is reported,
so what a consumer receives never has to be taken back or completed.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from vllm_spark2_5_plugin.spark2_5_tool_parser.values import compact_json, value_json

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


class Scanner:
    """Incremental reader of Spark2_5 output.

    ``schemas`` maps each function tool the request lets the model call to its
    parameter schema. ``feed`` text in pieces, then ``finish``. Output accumulates in ``content``
    (text pieces) and ``calls`` (``(name, arguments)`` of each closed call); the
    owner drains both. Markup inside a call that forms no key/value pair is
    content, reported together with its call when the call closes.
    """

    def __init__(self, schemas: Mapping[str, Any]) -> None:
        self.content: list[str] = []
        self.calls: list[tuple[str, str]] = []
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
        # is never closed.
        self._block: list[str] = []
        # Inside a call, text between two tags is dropped when it is whitespace only
        # and otherwise returned as content; True once this run has shown it is not.
        self._stray_run = False
        self._identifier_chars = 0
        self._key = ""
        self._value_start = 0
        self._name = ""
        self._root: Any = None
        self._properties: dict[str, Any] = {}
        self._pairs: dict[str, str] = {}  # the open call's key -> value JSON
        # Where content goes: ``content``, or while a call is open, the call's own
        # list, reported when it closes.
        self._out = self.content
        self._call_content: list[str] = []

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

    def finish(self) -> None:
        held, self._held = self._held, ""
        if held:
            self._read(self._text, held)
        if self._state == "name":
            self._reject_block()
        elif self._state in _IN_CALL:
            # Cut off (max_tokens, a stop string, EOS): the call may lack pairs or the
            # end of a value, so it is not presented as a call; its text is content.
            self._out = self.content
            self.content.append("".join(self._block))
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
            self.content.append(text)
        elif state == "value":
            self._pieces.append(text)
        elif state == "body":
            if self._stray_run:
                self._out.append(text)
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
                self._out.append(tag)
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
        if not name or too_long or name not in self._schemas:
            return False
        self._name = name
        self._root = self._schemas[name]
        properties = self._root.get("properties") if isinstance(self._root, dict) else None
        self._properties = properties if isinstance(properties, dict) else {}
        self._pairs = {}
        self._call_content = []
        self._out = self._call_content
        self._pieces = []
        self._stray_run = False
        self._state = "body"
        return True

    def _end_pair(self, tag: str) -> None:
        key = self._key
        if not key or key in self._pairs:
            self._pieces.append(tag)
            self._abandon_pair(stray_run=False)
            return
        raw = "".join(self._pieces[self._value_start :])
        self._pairs[key] = value_json(raw, self._properties.get(key), self._root)
        self._pieces = []
        self._state = "body"

    def _abandon_pair(self, stray_run: bool) -> None:
        """What is being read inside a call is no pair: its text is content and the
        call goes on. ``stray_run``: text (not a tag) ended it, so the rest of the
        text up to the next tag is content too."""
        self._out.append("".join(self._pieces))
        self._pieces = []
        self._stray_run = stray_run
        self._state = "body"

    def _close_call(self) -> None:
        pairs = ",".join(compact_json(key) + ":" + value for key, value in self._pairs.items())
        self.calls.append((self._name, "{" + pairs + "}"))
        self.content.extend(self._call_content)
        self._out = self.content
        self._block = []
        self._state = "content"
