"""In-place weight updates on real vLLM (CPU) against the plain-PyTorch reference.

One subprocess (``spark2_5_dev.weight_updates``) serves checkpoint A of a tied
(fused q/k/v) and an untied (split q/k/v) case, one engine each, and pushes B's
or A's weights through ``reload_weights`` (path, iterator) and the
weight-transfer lifecycle (per tensor, per bucket); each test asserts on its
part of the JSON that run writes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from packaging.version import Version

from carrier_harness import cpu_classes
from spark2_5_dev import kernel_choices, quantize, weight_updates
from spark2_5_dev.checkpoints import build_spark2_5_checkpoint
from spark2_5_dev.drivers import assert_matches_reference, run_driver
from spark2_5_dev.parity import ENGINE_ENV, FP32_LOGPROB_TOLERANCE, NEW_TOKENS

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "rl_loop.py"

CASES = [case.name for case in weight_updates.CASES]
RELOAD_STEPS = [
    "a_first_load",
    "b_reload_path",
    "a_reload_iterator",
    "a_after_wrong_shape_reload",
    "b_after_under_load",
]
# Through the weight-transfer lifecycle, where this vLLM's engines run it (0.32).
TRANSFER_STEPS = [
    "b_per_tensor",
    "a_per_bucket",
    "a_after_wrong_shape",
    "a_after_part_of_a_packed_parameter",
    "a_after_outside_session",
]

pytestmark = pytest.mark.slow
# The CPU class this process runs as, and the one the on_avx2 driver runs as.
IN_FORCE = cpu_classes.class_in_force()
AVX2 = cpu_classes.CLASSES[0]


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, str]:
    workdir = tmp_path_factory.mktemp("weight-updates")
    result = run_driver("spark2_5_dev.weight_updates", [], workdir, timeout=1500, name="updates")
    return result, (workdir / "updates.log").read_text(errors="replace")


def vllm_version() -> str:
    from importlib.metadata import version

    return version("vllm")


def transfer_steps(measured) -> None:
    if not measured[0]["transfer_steps"]:
        pytest.skip(f"vLLM {measured[0]['vllm']}: its weight-transfer engines have another API")


@pytest.mark.kernels
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("step", RELOAD_STEPS + TRANSFER_STEPS)
def test_after_each_update_the_engine_serves_exactly_the_pushed_weights(measured, case, step):
    """Greedy tokens equal to the reference on those weights, log-probs within the
    float32 tolerance; the step's name says which checkpoint (a or b) should serve."""
    if step in TRANSFER_STEPS:
        transfer_steps(measured)
    assert_matches_reference(measured[0]["cases"][case]["compared"][step])


@pytest.mark.kernels
@pytest.mark.parametrize("case", CASES)
def test_the_two_checkpoints_generate_differently(measured, case):
    """Else serving the previous weights would pass the tests above."""
    assert measured[0]["cases"][case]["a_and_b_differ"]


@pytest.mark.kernels
def test_the_tied_head_is_still_the_embedding_after_a_reload(measured):
    assert measured[0]["cases"]["tied-fused"]["b_head_still_tied"] is True


@pytest.mark.kernels
@pytest.mark.parametrize("case", CASES)
def test_a_wrong_shape_push_is_refused_by_name(measured, case):
    transfer_steps(measured)
    error = measured[0]["cases"][case]["wrong_shape_error"]
    assert error.startswith(
        "RefusedUpdate: Spark2_5 refused this weight update: Checkpoint tensor "
        "'model.layers.0.mlp.down_proj.weight' has shape [64, 127], but config.json "
        "implies [64, 128]"
    ), error
    # The rest of that update was taken and dropped (``a_after_wrong_shape`` serves A),
    # and the next update starts once vLLM's worker has finished this one.
    assert measured[0]["cases"][case]["second_finish_error"] is None


@pytest.mark.kernels
@pytest.mark.parametrize("case", CASES)
def test_a_reload_from_a_folder_with_a_wrong_shape_is_refused_by_name(measured, case):
    """Its last tensor by name (the one vLLM reads last) one row short; the engine
    keeps serving A, none of the folder's other tensors (``a_after_wrong_shape_reload``)."""
    error = measured[0]["cases"][case]["wrong_shape_reload_error"]
    assert error.startswith(
        "RefusedUpdate: Spark2_5 refused this weight update: Checkpoint tensor "
        "'model.norm.weight' has shape [63], but config.json implies [64]"
    ), error


@pytest.mark.kernels
@pytest.mark.parametrize("case", CASES)
def test_a_push_outside_an_update_session_is_refused(measured, case):
    transfer_steps(measured)
    error = measured[0]["cases"][case]["outside_session_error"]
    assert error.startswith(
        "Spark2_5CheckpointError: Spark2_5 weights were pushed with load_weights outside "
        "vLLM's layerwise reload"
    )
    assert "reload_weights" in error and "model.layers.0.mlp.gate_proj.weight" in error


@pytest.mark.kernels
def test_part_of_a_packed_parameter_is_held_back_and_named(measured):
    """The layer keeps its previous weights whole (the step above serves A) and the
    log names what arrived."""
    transfer_steps(measured)
    log = measured[1]
    assert "these layers got only some of their tensors and keep their previous" in log
    assert "model.layers.0.mlp.gate_up_proj (pushed only model.layers.0.mlp.gate_proj" in log


@pytest.mark.kernels
@pytest.mark.parametrize("case", CASES)
def test_requests_in_flight_during_a_reload_finish(measured, case):
    load = measured[0]["cases"][case]["under_load"]
    assert load["in_flight_at_reload"] == weight_updates.REQUESTS_UNDER_LOAD
    assert load["finished"] == weight_updates.REQUESTS_UNDER_LOAD
    assert load["new_tokens"] == [NEW_TOKENS]


LORA_STEPS = ["a_with_adapter", "b_with_adapter", "b_base", "a_with_adapter_after_per_tensor"]


@pytest.mark.kernels
@pytest.mark.parametrize("step", LORA_STEPS)
def test_a_lora_engine_serves_its_adapter_on_the_updated_base(measured, step):
    """Against the reference on the new base with the adapter merged into it (vLLM
    drops the loaded adapters after an update and loads them again when asked)."""
    if measured[0]["lora"] is None:
        pytest.skip(f"vLLM {measured[0]['vllm']} cannot reload weights into LoRA layers")
    if step == LORA_STEPS[-1]:
        transfer_steps(measured)
    assert_matches_reference(measured[0]["lora"][step])


@pytest.mark.kernels
@pytest.mark.parametrize("fmt", quantize.FORMATS)
def test_a_quantized_checkpoint_reloads_to_what_a_fresh_engine_serves(measured, fmt):
    """Tokens and log-probs identical, in both directions, from a folder and tensor by
    tensor, on every kernel path this CPU runs (``no-amx`` everywhere: vLLM's oneDNN
    int8 kernel and GPTQ as W4A16; ``amx`` too where the CPU has it)."""
    quantized = measured[0]["quantized"]
    assert "no-amx" in quantized["cpu_paths"]
    for path in quantized["cpu_paths"]:
        result = quantized[f"{fmt}/{path}"]
        if "refused" in result:  # an AVX2 CPU: vLLM has no GPTQ kernel for it
            assert_refused_for_its_missing_kernel(fmt, result["refused"], IN_FORCE)
            continue
        assert result["a_and_b_differ"], path
        assert result["reloaded_equals_fresh"] == {"a": True, "b": True}, (path, result)
        if measured[0]["transfer_steps"]:
            assert result["pushed_equals_fresh"] == {"a": True, "b": True}, (path, result)


def assert_refused_for_its_missing_kernel(fmt: str, refusal: str, cpu_class) -> None:
    """vLLM's kernel library for AVX2 CPUs lacks GPTQ's ``cpu_gemm_wna16`` (0.23 to
    0.33): the model refuses such a checkpoint naming the op and the fix, and only
    on a CPU class where that refusal is expected (``kernel_choices.EXPECTED``)."""
    assert kernel_choices.refuses(fmt, cpu_class.name), (cpu_class.name, refusal)
    assert "torch.ops._C.cpu_gemm_wna16" in refusal
    assert "Serve a bfloat16 or W8A8 int8 checkpoint" in refusal


# vLLM 0.23's AVX2 kernel library ends the process (SIGSEGV) at the first request
# that asks for log-probs, in-tree Llama's and float checkpoints' too (seen on 0.23.0;
# 0.32.0 and 0.33.0 do not).
AVX2_LOGPROBS_CRASH_BEFORE = Version("0.24")


@pytest.fixture(scope="module")
def on_avx2(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The quantized reloads again, in a process that runs as an AVX2 CPU (its vLLM
    kernels, torch dispatch and oneDNN primitives: ``carrier_harness.cpu_classes``)."""
    workdir = tmp_path_factory.mktemp("weight-updates-avx2")
    as_avx2 = cpu_classes.subprocess_env(AVX2.name)
    try:
        return run_driver(
            "spark2_5_dev.weight_updates", ["--quantized-only"], workdir, 900, "avx2", as_avx2
        )
    except AssertionError as failed:
        crashed = str(failed).startswith(f"exit code -{signal.SIGSEGV.value}\n")
        if crashed and Version(vllm_version()) < AVX2_LOGPROBS_CRASH_BEFORE:
            pytest.xfail(f"vLLM {vllm_version()}: its AVX2 kernel library crashes on log-probs")
        raise


@pytest.mark.kernels
@pytest.mark.parametrize("fmt", quantize.FORMATS)
def test_a_quantized_checkpoint_reloads_the_same_on_vllms_avx2_kernels(on_avx2, fmt):
    """Or, where vLLM's AVX2 kernel library lacks the format's op (GPTQ's
    ``cpu_gemm_wna16`` in 0.23 to 0.33), the model refuses it naming the op."""
    assert "_C_AVX2.abi3.so" in on_avx2["kernel_libraries"], on_avx2["kernel_libraries"]
    assert on_avx2["quantized"]["cpu_paths"] == ["no-amx"]
    result = on_avx2["quantized"][f"{fmt}/no-amx"]
    if "refused" in result:
        assert_refused_for_its_missing_kernel(fmt, result["refused"], AVX2)
        return
    assert result["a_and_b_differ"]
    assert result["reloaded_equals_fresh"] == {"a": True, "b": True}, result
    if on_avx2["transfer_steps"]:
        assert result["pushed_equals_fresh"] == {"a": True, "b": True}, result


@pytest.mark.kernels
def test_the_no_amx_path_runs_vllms_onednn_int8_kernel(measured):
    """The path whose reload needs ``host_hooks.keep_onednn_int8_scales`` really ran."""
    kernels = measured[0]["quantized"][f"{quantize.W8A8_INT8}/no-amx"]["kernels"]
    if not kernels:
        pytest.skip(f"vLLM {measured[0]['vllm']}: its int8 CPU kernel names no linear_method")
    assert kernels == ["_apply_weights_onednn"]


@pytest.mark.contract
def test_the_example_trainer_loop_changes_the_output(tmp_path):
    """The example the docs point at, run as a user runs it: its own engine process
    (vLLM's default), three pushes, each changing the greedy continuation."""
    checkpoint = build_spark2_5_checkpoint(tmp_path / "model", seed=8)
    env = {**os.environ, **ENGINE_ENV}
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING")
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), str(checkpoint)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        cwd=tmp_path,
        start_new_session=True,
    )
    assert done.returncode == 0, done.stderr[-6000:]
    steps = [line for line in done.stdout.splitlines() if line.startswith("step ")]
    outputs = [line.split(":", 1)[1] for line in steps]
    assert len(outputs) == 4, done.stdout
    assert len(set(outputs)) == 4, outputs


# Long enough that the requests still generate when the reload starts, although
# vLLM's API server may hand a lagging stream several tokens in one chunk.
IN_FLIGHT_TOKENS = 960


def _complete(
    base_url: str, model: str, prompt: list[int], max_tokens: int, streaming: Any = None
) -> dict:
    """One greedy completion (streamed); its token ids, log-probs and when it started and
    ended. ``streaming.set()`` is called once its first token has arrived."""
    import json
    import time
    import urllib.request

    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "logprobs": 0,
        "return_tokens_as_token_ids": True,
        "stream": True,
    }
    request = urllib.request.Request(
        f"{base_url}/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    tokens, logprobs = [], []
    started = time.monotonic()
    with urllib.request.urlopen(request, timeout=300) as response:
        for line in response:
            data = line.decode().strip().removeprefix("data: ")
            if not data or data == "[DONE]":
                continue
            chunk_logprobs = json.loads(data)["choices"][0]["logprobs"] or {}
            tokens += [int(t.removeprefix("token_id:")) for t in chunk_logprobs.get("tokens", [])]
            logprobs += chunk_logprobs.get("token_logprobs", [])
            if tokens and streaming is not None:
                streaming.set()
    return {"tokens": tokens, "logprobs": logprobs, "started": started, "ended": time.monotonic()}


@pytest.mark.serve
def test_requests_in_flight_over_http_finish_while_the_server_reloads(tmp_path):
    """``vllm serve`` (its engine in its own process) answering concurrent requests
    while ``/collective_rpc`` runs ``reload_weights``: every request finishes whole,
    and the next one is the reference's on the new weights."""
    import json
    import threading
    import time
    import urllib.request
    from concurrent.futures import ThreadPoolExecutor

    from carrier_harness.server import VllmServer
    from spark2_5_dev.parity import prompts
    from spark2_5_dev.reference import Spark2_5Reference

    a = build_spark2_5_checkpoint(tmp_path / "a", seed=8)
    b = build_spark2_5_checkpoint(tmp_path / "b", seed=9)
    prompt = prompts(8, 320)[1]
    env = {"SPARK2_5_PLUGIN_ENABLE": "1", "VLLM_SERVER_DEV_MODE": "1"}
    args = ("--dtype", "float32", "--max-model-len", str(len(prompt) + IN_FLIGHT_TOKENS))
    with VllmServer(a, args, env=env, log_path=tmp_path / "serve.log") as server:
        with ThreadPoolExecutor(8) as pool:
            streaming = [threading.Event() for _ in range(8)]
            loads = [
                pool.submit(_complete, server.base_url, str(a), prompt, IN_FLIGHT_TOKENS, event)
                for event in streaming
            ]
            deadline = time.monotonic() + 240
            for event, load in zip(streaming, loads, strict=True):
                # Every request is generating when the reload starts; one that ended
                # before its first token raises its error here.
                while not event.wait(timeout=1):
                    assert not load.done() or load.result() is None, "ended without tokens"
                    assert time.monotonic() < deadline, "no first token within 240 s"
            reload = urllib.request.Request(
                f"{server.base_url}/collective_rpc",
                data=json.dumps(
                    {"method": "reload_weights", "kwargs": {"weights_path": str(b)}}
                ).encode(),
                headers={"Content-Type": "application/json"},
            )
            reload_started = time.monotonic()
            with urllib.request.urlopen(reload, timeout=300) as response:
                assert response.status == 200
            finished = [load.result() for load in loads]
        after = _complete(server.base_url, str(a), prompt, NEW_TOKENS)
    assert [len(done["tokens"]) for done in finished] == [IN_FLIGHT_TOKENS] * len(finished)
    assert any(done["started"] < reload_started < done["ended"] for done in finished)
    reference_tokens, reference_logprobs = Spark2_5Reference.from_pretrained(b).generate(
        prompt, NEW_TOKENS
    )
    assert after["tokens"] == reference_tokens
    pairs = zip(after["logprobs"], reference_logprobs, strict=True)
    assert max(abs(served - expected) for served, expected in pairs) <= FP32_LOGPROB_TOLERANCE
