# SPDX-License-Identifier: Apache-2.0
"""``Spark25ToolParser``: the scanner behind vLLM's tool-parser interface.

One scanner serves both entry points. ``extract_tool_calls`` feeds it the whole
output and finishes it; streaming feeds it each delta and vLLM finishes it
through ``finish_streaming``. A streamed call is announced (id and name) once its
name is complete and its arguments follow as the model writes them, so the
pieces of every closed call join to the non-streamed arguments. A call the
output ends inside stays, streamed, as far as written (the finish reason says
the output was cut); not streamed, its text is content, because vLLM reports
``tool_calls`` as the finish reason of any response with a call.

The adapter is where vLLM's request types meet the parser: it resolves a request's
tools once to ``(name, parameters)`` pairs and hands the scanner and the checks
that plain data.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from typing import Any

from vllm_spark2_5_plugin import compat
from vllm_spark2_5_plugin.spark2_5_tool_parser import schema
from vllm_spark2_5_plugin.spark2_5_tool_parser.scanner import CallPiece, Scanner

ToolParser = compat.tool_parser_base()
_protocol = compat.tool_call_protocol()
DeltaFunctionCall = _protocol.DeltaFunctionCall
DeltaMessage = _protocol.DeltaMessage
DeltaToolCall = _protocol.DeltaToolCall
ExtractedToolCallInformation = _protocol.ExtractedToolCallInformation
FunctionCall = _protocol.FunctionCall
ToolCall = _protocol.ToolCall
make_tool_call_id = compat.tool_call_id_factory()
logger = logging.getLogger("vllm.spark2_5_plugin")

# GLM-4.7's structural tag writes <tool_call>NAME<arg_key>K</arg_key><arg_value>V
# </arg_value></tool_call> with string values raw and other values as JSON: byte
# for byte the compact form Spark2_5's chat template renders.
_STRUCTURAL_TAG_FORMAT = "glm_4_7"


def _callable_tools(request: Any, declared: Sequence[Any]) -> dict[str, Any]:
    """Name -> parameter schema of each function tool the model may call (the first
    of a repeated name, as vLLM's own lookup): the request's tools unless it says
    ``tool_choice="none"``; for a request without tools (whose ``tool_choice``
    defaults to "none"), those the parser was made with, which vLLM's serving layer
    makes it with from the request, so none there."""
    tools = getattr(request, "tools", None)
    if tools and getattr(request, "tool_choice", None) == "none":
        return {}
    schemas: dict[str, Any] = {}
    for name, parameters in compat.function_tools(tools or declared):
        schemas.setdefault(name, parameters)
    return schemas


def _as_400(check: Callable[..., None], *args: Any) -> None:
    try:
        check(*args)
    except schema.ToolsRefused as refused:
        raise compat.request_validation_error(
            str(refused), parameter=refused.parameter, value=refused.value
        ) from None


def check_tools(tools: Sequence[Any] | None) -> None:
    """``schema.check_tools`` on a request's ``tools``; a refusal is vLLM's 400."""
    _as_400(schema.check_tools, compat.function_tools(tools))


def _strict_tools(tools: Sequence[Any] | None) -> list[tuple[str, Any]]:
    """``(name, parameters)`` of the request's tools that say ``"strict": true``
    (Chat tools on ``function``, Responses tools on the tool)."""
    strict = [
        tool
        for tool in tools or []
        if getattr(getattr(tool, "function", None) or tool, "strict", None) is True
    ]
    return compat.function_tools(strict)


def _forces_call(tool_choice: Any) -> bool:
    """``tool_choice="required"``, a named tool, or allowed tools in required mode."""
    if tool_choice == "required":
        return True
    choice_type = getattr(tool_choice, "type", None)
    if choice_type in ("function", "custom"):
        return True
    return choice_type == "allowed_tools" and getattr(tool_choice, "mode", None) == "required"


def _with_strict(tool: Any, strict: bool) -> Any:
    """``tool`` with ``strict`` set unless it says ``strict`` itself (Chat tools
    carry it on ``function``, Responses tools on the tool)."""
    function = getattr(tool, "function", None)
    if function is not None and getattr(function, "strict", False) is None:
        return tool.model_copy(update={"function": function.model_copy(update={"strict": strict})})
    if function is None and getattr(tool, "strict", False) is None:
        return tool.model_copy(update={"strict": strict})
    return tool


def _describe_choice(tool_choice: Any) -> str:
    if isinstance(tool_choice, str):
        return repr(tool_choice)
    name = getattr(tool_choice, "name", None) or getattr(
        getattr(tool_choice, "function", None), "name", None
    )
    return f"{{named tool {name!r}}}" if name else repr(tool_choice)


def _unconstrained_forced_call_error(parser: Any, tool_choice: Any) -> Exception:
    if parser.structural_tag_model is None:
        reason = "this vLLM has no structural tag for Spark2_5's call format"
        fix = "upgrade vLLM to a release with tool-call structural tags"
    else:
        reason = "VLLM_ENFORCE_STRICT_TOOL_CALLING=0 turns structural tags off"
        fix = "restart the server without VLLM_ENFORCE_STRICT_TOOL_CALLING=0"
    return compat.request_validation_error(
        f"tool_choice={_describe_choice(tool_choice)} needs the output "
        f"constrained to a Spark2_5 tool call, but {reason}, so the model could "
        f'answer in plain text. Fix: {fix}, or send tool_choice="auto".',
        parameter="tool_choice",
        value=_describe_choice(tool_choice),
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
        self._stream: Scanner | None = None
        # The request the stream serves: vLLM passes the same one with every delta of
        # a stream, so another one starts another stream (vLLM's own parser tests
        # stream several outputs through one parser).
        self._stream_request: Any = None
        # Whether the caller passes the text so far as previous_text (vLLM 0.23's
        # serving, vLLM's own parser tests) or only each delta (vLLM's engine-based
        # streaming, which ends each stream with finish_streaming); None until the
        # second delta of a stream says.
        self._caller_accumulates: bool | None = None

    def adjust_request(self, request: Any) -> Any:
        # Before the base: on vLLM 0.23 it moves a forced request's "$defs" out of
        # the tools it turns into a JSON grammar, and they would go unchecked.
        tools = compat.function_tools(request.tools)
        _as_400(schema.check_tools, tools)
        if request.tool_choice != "none":
            _as_400(schema.check_strict_properties, _strict_tools(request.tools))
        request = super().adjust_request(request)
        # The call tags and </think> are special tokens: skipping them would hide
        # every call and, with a reasoning parser, where the thinking ends. vLLM
        # asks this parser on every request a reasoning parser reads.
        request.skip_special_tokens = False
        if not request.tools or request.tool_choice == "none":
            return request
        structured_outputs = getattr(request, "structured_outputs", None)
        structural_tag = getattr(structured_outputs, "structural_tag", None)
        if structural_tag is not None:
            _as_400(schema.check_grammar_size, tools, structural_tag)
        elif _forces_call(request.tool_choice):
            raise _unconstrained_forced_call_error(self, request.tool_choice)
        return request

    def get_structural_tag(self, request: Any, **options: Any) -> Any:
        # A forced call is held to each tool's schema (every required key, values of
        # their types) as if the tool said strict: true; vLLM's default pins only the
        # call's frame, so a call may come with no arguments. A tool that says
        # strict: false keeps free arguments; "auto" stays unconstrained. Tools too
        # large to pin cheaply are sent as strict: false, so that no release pins
        # them whole (vLLM 0.24's default for a forced call does).
        tools = compat.function_tools(request.tools)
        if request.tools and _forces_call(request.tool_choice):
            strict = schema.declared_properties(tools) <= schema.MAX_PINNED_PROPERTIES
            sent = [_with_strict(tool, strict) for tool in request.tools]
            request = request.model_copy(update={"tools": sent})
        tag = super().get_structural_tag(request, **options)
        if tag is not None:  # measured as vLLM hands it to the compiler
            _as_400(schema.check_grammar_size, tools, json.dumps(tag.model_dump()))
        return tag

    def extract_tool_calls(self, model_output: str, request: Any) -> Any:
        scanner = Scanner(_callable_tools(request, self.tools))
        scanner.feed(model_output)
        scanner.finish(cut_call_is_content=True)
        _report_dropped(scanner)
        tool_calls = [
            ToolCall(id=make_tool_call_id(), function=FunctionCall(name=name, arguments=arguments))
            for name, arguments in scanner.calls
        ]
        content = "".join(piece for piece in scanner.output if isinstance(piece, str))
        return ExtractedToolCallInformation(
            tools_called=bool(tool_calls), tool_calls=tool_calls, content=content or None
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
        if self._stream is None or request is not self._stream_request:
            self._stream = Scanner(_callable_tools(request, self.tools))
            self._stream_request = request
            self._caller_accumulates = None
        elif self._caller_accumulates is None:
            self._caller_accumulates = bool(previous_text)
        if delta_text:
            self._stream.feed(delta_text)
        # Only a caller that streams deltas alone ends the stream with finish_streaming:
        # there content after a call's piece can wait for the next delta.
        return self._drain(everything=self._caller_accumulates is not False)

    def finish_streaming(self) -> Any:
        """Release what the stream still holds: a partial tag, content held back."""
        if self._stream is None:
            return None
        stream, self._stream = self._stream, None
        stream.finish(cut_call_is_content=False)
        _report_dropped(stream)
        return _delta_message(stream.output, everything=True)

    def _drain(self, everything: bool) -> Any:
        return _delta_message(self._stream.output, everything)


def _delta_message(output: list[Any], everything: bool) -> Any:
    """What a scanner reported since the last delta, as one ``DeltaMessage``.

    A message carries its content before its calls (vLLM's Responses stream emits
    it in that order, closing an open call at content), so content the model wrote
    after a call's piece waits for the next delta, unless ``everything`` must go
    now."""
    taken = len(output)
    if not everything:
        taken = next(
            (
                position
                for position in range(1, len(output))
                if isinstance(output[position], str) and isinstance(output[position - 1], CallPiece)
            ),
            taken,
        )
    pieces, output[:taken] = output[:taken], []
    content = "".join(piece for piece in pieces if isinstance(piece, str))
    tool_calls = _delta_tool_calls([piece for piece in pieces if isinstance(piece, CallPiece)])
    if not content and not tool_calls:
        return None
    return DeltaMessage(content=content or None, tool_calls=tool_calls)


def _delta_tool_calls(pieces: Sequence[CallPiece]) -> list[Any]:
    """One ``DeltaToolCall`` per run of a call's pieces; a call's first carries its
    id and name."""
    tool_calls: list[Any] = []
    for piece in pieces:
        if tool_calls and tool_calls[-1].index == piece.index and piece.name is None:
            tool_calls[-1].function.arguments += piece.arguments
        elif piece.name is not None:
            function = DeltaFunctionCall(name=piece.name, arguments=piece.arguments)
            tool_calls.append(
                DeltaToolCall(
                    index=piece.index, id=make_tool_call_id(), type="function", function=function
                )
            )
        else:
            function = DeltaFunctionCall(arguments=piece.arguments)
            tool_calls.append(DeltaToolCall(index=piece.index, function=function))
    return tool_calls


def _report_dropped(scanner: Scanner) -> None:
    if scanner.dropped:
        logger.warning(
            "spark25: dropped %d characters the model wrote inside tool calls that form "
            "no key/value pair (stray text, a repeated or empty key)",
            scanner.dropped,
        )
