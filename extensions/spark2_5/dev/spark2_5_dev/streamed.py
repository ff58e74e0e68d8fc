"""A streamed chat answer folded chunk by chunk, the way a client sees it; shared
by the serve tests (sync ``openai`` client) and the soak (async)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


def reasoning_of(message: Any) -> str | None:
    """A chat message's or delta's reasoning, under either name vLLM has used."""
    return getattr(message, "reasoning", None) or getattr(message, "reasoning_content", None)


@dataclass
class _Call:
    name: str
    arguments: str = ""


@dataclass
class StreamedAnswer:
    """``finish_reason``, content and tool calls of a stream. A call must begin with
    its id and name; :meth:`add` raises ``AssertionError`` otherwise."""

    finish_reason: str | None = None
    content: str = ""
    reasoning: str = ""
    chunks: int = 0
    _calls: dict[int, _Call] = field(default_factory=dict)

    def add(self, chunk: Any) -> None:
        self.chunks += 1
        if not chunk.choices:
            return
        choice = chunk.choices[0]
        self.finish_reason = choice.finish_reason or self.finish_reason
        self.content += choice.delta.content or ""
        self.reasoning += reasoning_of(choice.delta) or ""
        for delta in choice.delta.tool_calls or []:
            if delta.index not in self._calls:
                if not (delta.id and delta.function and delta.function.name):
                    raise AssertionError(f"call {delta.index} began without id and name: {delta}")
                self._calls[delta.index] = _Call(delta.function.name)
            if delta.function and delta.function.arguments:
                self._calls[delta.index].arguments += delta.function.arguments

    def calls(self) -> tuple[tuple[str, str], ...]:
        """``(name, arguments)`` of each call, in index order."""
        return tuple((self._calls[i].name, self._calls[i].arguments) for i in sorted(self._calls))
