"""The Chat Completions request the serve tests send the trained fixture: greedy, to
the served model unless one is named, of a fixture conversation picked by name."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from spark2_5_dev import fixture


def conversation(name: str) -> fixture.Conversation:
    """The fixture conversation called ``name``."""
    return next(c for c in fixture.CONVERSATIONS if c.name == name)


def chat(
    client: Any,
    messages: Sequence[dict[str, Any]],
    tools: Sequence[dict[str, Any]] | None = None,
    *,
    model: str | None = None,
    max_tokens: int = 120,
    **request: Any,
) -> Any:
    """The first choice of a greedy request of ``messages`` with ``tools`` (none when
    empty) to ``model`` (the first model the server lists when not named), with
    ``max_tokens`` and any further ``request`` fields (``tool_choice``, ``extra_body``)."""
    import openai

    return client.chat.completions.create(
        model=model or client.models.list().data[0].id,
        messages=messages,
        tools=tools or openai.omit,
        temperature=0,
        max_tokens=max_tokens,
        **request,
    ).choices[0]
