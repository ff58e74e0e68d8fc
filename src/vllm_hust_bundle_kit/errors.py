# SPDX-License-Identifier: Apache-2.0
"""How the toolkit reports a problem: one line naming the file, the field, the value, the fix."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

MISSING = object()
# Values are quoted up to this many characters.
MAX_SHOWN_CHARS = 80
# Deeper than this, a manifest, state file or TOML source is refused before it is walked.
MAX_NESTING = 64


class BundleError(ValueError):
    """One line for the operator: the file, the field, the value and the fix."""


@dataclass(frozen=True)
class Problem:
    """What is wrong with one field: its path inside a document, its value, the fix."""

    path: tuple[str | int, ...]
    value: Any
    message: str


# Characters that end a line for str.splitlines() but that json.dumps(ensure_ascii=False)
# leaves as they are; an error line holding one would no longer be one line.
_LINE_BREAKS = ("\x85", "\u2028", "\u2029")


def encodable(text: str) -> bool:
    """Whether ``text`` can be written as UTF-8 (a lone surrogate cannot)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _plain(text: str) -> bool:
    """Whether ``text`` prints as it is within one line (no blanks, breaks or surrogates)."""
    if not text or not text.isprintable() or any(char.isspace() for char in text):
        return False
    return encodable(text)


def dotted(path: Sequence[str | int]) -> str:
    """A field's path: ``a.b[0]``; a key that is not plain text is quoted, ``a["x y"]``."""
    text = ""
    for part in path:
        if isinstance(part, int):
            text += f"[{part}]"
        elif not _plain(part):
            text += f"[{json.dumps(part)}]"
        else:
            text += f".{part}" if text else part
    return text or "(top level)"


def shown(value: Any) -> str:
    """``value`` as JSON, on one line, cut to a bounded length."""
    try:
        text = json.dumps(value, ensure_ascii=False, default=str)
        if any(char in text for char in _LINE_BREAKS) or not encodable(text):
            text = json.dumps(value, default=str)
    except (ValueError, RecursionError):
        text = repr(value)
    if len(text) <= MAX_SHOWN_CHARS:
        return text
    return text[: MAX_SHOWN_CHARS - 3] + "..."


def error(where: str | os.PathLike[str], problem: Problem) -> BundleError:
    field = dotted(problem.path)
    if problem.value is MISSING:
        return BundleError(f"{where}: {field}: {problem.message}")
    return BundleError(f"{where}: {field} = {shown(problem.value)}: {problem.message}")


def nesting_depth(document: Any) -> int:
    """How deeply lists and objects nest in ``document`` (walked without recursion)."""
    deepest = 0
    pending: list[tuple[Any, int]] = [(document, 0)]
    while pending:
        value, depth = pending.pop()
        if isinstance(value, dict):
            children = value.values()
        elif isinstance(value, list):
            children = value
        else:
            continue
        deepest = max(deepest, depth + 1)
        if deepest > MAX_NESTING:
            return deepest
        pending.extend((child, depth + 1) for child in children)
    return deepest


def check_nesting(where: str | os.PathLike[str], document: Any) -> None:
    if nesting_depth(document) > MAX_NESTING:
        raise BundleError(
            f"{where}: nested more than {MAX_NESTING} levels deep; no manifest or state file "
            "needs that, fix the file"
        )
