"""The trained fixture, quantized in each format the project writes, served by
``vllm serve`` (carrier enabled, the fixture's serve arguments, bfloat16) and
driven by the ``openai`` client: it answers like the float model and its tool
calls still parse with ``spark25``."""

from __future__ import annotations

import json

import pytest
from transformers import PreTrainedTokenizerFast

from carrier_harness import cpu_classes
from carrier_harness.server import ServerFailed
from spark2_5_dev import fixture, kernel_choices, quantize
from spark2_5_dev.chat import chat, conversation
from spark2_5_dev.drivers import common_prefix

pytestmark = [pytest.mark.serve, pytest.mark.slow]

# Greedy agreement with the float model: the share of the float model's reply
# tokens, over every fixture conversation, that the quantized model reproduces
# before its first differing token. Measured on vLLM 0.32 CPU: 1.0 for both
# formats (every reply identical); the threshold leaves a margin of 10 points
# for other CPUs' kernels, and a change that breaks a format falls far below it.
MIN_GREEDY_AGREEMENT = 0.9
# The op GPTQ's CPU kernel calls, absent from vLLM's kernel library for AVX2 CPUs.
MISSING_OP = "has no cpu_gemm_wna16"
# What vLLM logs when it picks each format's CPU kernel.
KERNEL_LOG_LINES = {
    quantize.W8A8_INT8: "Selected CPUInt8ScaledMMLinearKernel for CompressedTensorsW8A8Int8",
    quantize.GPTQ_INT4: "Using CPUWNA16LinearKernel for AutoGPTQLinearMethod",
}


@pytest.fixture(scope="module", params=quantize.FORMATS)
def server(request, spark_chat_model, tmp_path_factory, carrier_enabled_server):
    root = tmp_path_factory.mktemp(f"quantized-{request.param}")
    checkpoint = quantize.quantize_checkpoint(spark_chat_model, root / "model", request.param)
    quantized = carrier_enabled_server(checkpoint, fixture.SERVE_ARGS)
    try:
        with quantized as running:
            running.format = request.param
            yield running
    except ServerFailed:
        # vLLM's kernel library for AVX2 CPUs has no GPTQ kernel: where the CPU class
        # expects it, the carrier must have refused the checkpoint, naming the op and the fix.
        refusal = next((line for line in quantized.log().splitlines() if MISSING_OP in line), "")
        expected = kernel_choices.refuses(request.param, cpu_classes.class_in_force().name)
        if not expected or "Serve a bfloat16" not in refusal:
            raise
        pytest.skip(f"this CPU's vLLM kernels cannot run GPTQ, refused: {refusal[-300:]}")


def chat_with_token_ids(client, case: fixture.Conversation):
    """A fixture conversation as the fixture learnt it (its template arguments), the
    reply's token ids returned."""
    extra_body = {"return_token_ids": True, "chat_template_kwargs": case.chat_template_kwargs}
    return chat(client, case.messages, case.tools, extra_body=extra_body)


def test_served_with_the_formats_cpu_kernel(server):
    log = server.log()
    assert "Resolved architecture: Spark2_5ForCausalLM" in log
    assert KERNEL_LOG_LINES[server.format] in log


def test_greedy_agreement_with_the_float_model(client, server, spark_chat_model, record_property):
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(spark_chat_model))
    agreed = total = 0
    for case in fixture.CONVERSATIONS:
        _, float_reply = fixture._encode(tokenizer, case)
        reply = chat_with_token_ids(client, case).token_ids
        agreed += common_prefix(list(reply), float_reply)
        total += len(float_reply)
    agreement = agreed / total
    record_property("greedy_agreement", agreement)
    print(
        f"{server.format}: greedy agreement with the float model {agreement:.4f} ({total} tokens)"
    )
    assert agreement >= MIN_GREEDY_AGREEMENT


@pytest.mark.parametrize(
    ("name", "function", "arguments"),
    [
        ("weather-call", "get_weather", fixture.PARIS_CALL),
        ("weather-call-unicode", "get_weather", fixture.HEFEI_CALL),
        ("time-call", "get_time", fixture.TOKYO_CALL),
    ],
)
def test_tool_calls_still_parse(client, name, function, arguments):
    choice = chat_with_token_ids(client, conversation(name))
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.function.name == function
    assert json.loads(call.function.arguments) == arguments
    assert not choice.message.content
