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


def keeps_length_for_cut_streamed_calls() -> bool:
    """Whether a Chat stream that sent a call and was cut by ``max_tokens`` finishes
    with ``length``: vLLM 0.31 and later write ``tool_calls`` only over a ``stop``;
    0.23 to 0.30 finish every stream that sent a call with ``tool_calls``. Asked of
    vLLM 0.33's ``resolve_finish_reason``, else read in the streaming generator."""
    import inspect
    import re

    utils = "vllm.entrypoints.serve.utils.tool_calls_utils"
    if _module_has(utils, "resolve_finish_reason"):
        resolve = importlib.import_module(utils).resolve_finish_reason
        return resolve("length", None, True) == "length"
    serving = importlib.import_module("vllm.entrypoints.openai.chat_completion.serving")
    source = inspect.getsource(serving.OpenAIServingChat.chat_completion_stream_generator)
    kept = r"tools_streamed\[i\]\s+and not tool_choice_function_name\s+and output\.finish_reason"
    return re.search(kept, source) is not None


def streams_responses_through_parser() -> bool:
    """Whether the Responses API streams through vLLM's serving-layer parser and its
    ``SimpleStreamingEventProcessor`` (vLLM 0.32), the path the Responses tests and
    ``docs/tool-calling.md`` describe; earlier releases have other Responses code."""
    return _module_has(
        "vllm.entrypoints.openai.responses.streaming_events", "SimpleStreamingEventProcessor"
    )


def ends_incomplete_responses_with_their_own_event() -> bool:
    """Whether a Responses stream whose response is incomplete ends with a
    ``response.incomplete`` event (vLLM 0.33) instead of ``response.completed``
    carrying status ``incomplete`` (0.32); the openai SDK's stream helper then has
    no final response (``get_final_response()`` raises)."""
    return _module_has("vllm.entrypoints.openai.responses.protocol", "ResponseIncompleteEvent")


def final_response_is_the_streamed_items() -> bool:
    """Whether a streamed Responses request's final response holds the items its
    events sent (vLLM 0.32 and later) instead of the whole output parsed afresh,
    where a call the output cut is an item in the events and text in the final
    response. Read off ``SimpleContext.__init__``: no public name marks it."""
    try:
        context = importlib.import_module("vllm.entrypoints.openai.responses.context")
    except ImportError:
        return False
    init = getattr(getattr(context, "SimpleContext", None), "__init__", None)
    return "streamed_output_items" in getattr(getattr(init, "__code__", None), "co_names", ())


def cpu_lora_ops_skip_requests_without_an_adapter() -> bool:
    """Whether vLLM's CPU (torch) LoRA ops leave the rows of requests without an
    adapter (index -1) alone (vLLM 0.33); before, -1 indexed the last slot, so with
    every slot taken those requests got the last slot's adapter. Run, not read: one
    expand with index -1 into zeros."""
    import torch
    from vllm.lora.ops.torch_ops import bgmv_expand

    output = torch.zeros(1, 4)
    bgmv_expand(torch.ones(1, 2), torch.ones(1, 4, 2), output, torch.tensor([-1]))
    return bool((output == 0).all())


def reloads_weights_into_lora_layers() -> bool:
    """Whether vLLM's weight reload resolves checkpoint names through LoRA-wrapped
    layers (``.base_layer.``; 0.32's in-place reload). vLLM 0.23 has no such step: its
    loaders, in-tree models' too, meet ``model.embed_tokens.base_layer.weight`` where
    the checkpoint names ``model.embed_tokens.weight``, so an engine started with
    ``enable_lora`` cannot reload weights."""
    return _module_has(
        "vllm.model_executor.model_loader.reload.inplace", "get_parameter_for_reload"
    )


def takes_draft_tokens_by_local_argmax() -> bool:
    """Whether vLLM's models take a draft model's tokens from ``get_top_tokens``
    (``LocalArgmaxMixin``, vLLM 0.24 and later; 0.23 has the option, but its models
    do not have the hook)."""
    return _module_has("vllm.model_executor.models.interfaces", "LocalArgmaxMixin")


def _module_has(module_name: str, attribute: str) -> bool:
    try:
        return hasattr(importlib.import_module(module_name), attribute)
    except ImportError:
        return False


FORCED_CALL_REFUSAL = "this vLLM has no structural tag for Spark2_5's call format"


def adjusts_every_request_with_a_reasoning_parser() -> bool:
    """Whether vLLM hands every request to the tool parser's ``adjust_request`` once a
    reasoning parser is set (vLLM 0.32: ``vllm.renderers.online_renderer``), so that
    ``spark25`` keeps ``</think>``; vLLM 0.23 hands it only requests with tools, and a
    non-streamed answer without tools loses its split. Read in vLLM's source: no API
    says it."""
    import inspect

    try:
        module = importlib.import_module("vllm.renderers.online_renderer")
    except ImportError:
        return False
    return "reasoning_parser_cls is not None" in inspect.getsource(module)
