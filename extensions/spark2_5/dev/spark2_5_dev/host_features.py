"""What the installed vLLM offers that some tests' expectations depend on.

The verified range spans releases with different serving layers (what each
release has: ``RELEASE_SHAPES`` in ``test_vllm_drift.py``, which also fails if a
release loses a feature it should have). Tests that exercise one of these
features ask here, and assert the documented behaviour of a release without it
instead of the feature's.
"""

from __future__ import annotations

import importlib

from vllm_spark2_5_plugin import compat


def constrains_forced_calls() -> bool:
    """Whether ``tool_choice="required"``/named calls are constrained to Spark2_5's
    call syntax (vLLM 0.24 and later). Without it the parser answers them with a
    400 that names ``tool_choice``."""
    from vllm_spark2_5_plugin.spark2_5_tool_parser import Spark25ToolParser

    return Spark25ToolParser.structural_tag_model in compat.structural_tag_models()


def flushes_stream_end() -> bool:
    """Whether vLLM tells the tool parser that a stream ended (``engine_based_streaming``
    and ``finish_streaming``, vLLM 0.24 and later). Without it what the parser still
    holds at the end (a partial tag, an unfinished argument pair) is not sent."""
    return hasattr(compat.tool_parser_base(), "engine_based_streaming")


def streams_responses_through_parser() -> bool:
    """Whether the Responses API streams through vLLM's serving-layer parser and its
    ``SimpleStreamingEventProcessor`` (vLLM 0.32), the path the Responses tests and
    ``docs/tool-calling.md`` describe; earlier releases have other Responses code."""
    try:
        events = importlib.import_module("vllm.entrypoints.openai.responses.streaming_events")
    except ImportError:
        return False
    return hasattr(events, "SimpleStreamingEventProcessor")


FORCED_CALL_REFUSAL = "this vLLM has no structural tag for Spark2_5's call format"
