"""What vLLM's compiled and CUDA-graph paths need of the model's forward, checked on
CPU with the real vLLM layers: TorchDynamo captures each decoder layer and the whole
model as one graph (vLLM compiles with ``fullgraph=True``, so a break would fail the
engine), and nothing in it copies to the host or waits on the device, which CUDA-graph
capture forbids. The compiled engine's tokens are in ``test_parity.py``."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spark2_5_dev.checkpoints import build_spark2_5_checkpoint
from spark2_5_dev.model_building import build_model_and_config, checkpoint_tensors, vllm_model_env

__all__ = ["vllm_model_env"]  # the fixture, for pytest

pytestmark = pytest.mark.usefixtures("vllm_model_env")

# Calls that read a tensor's values on the host or wait for the device.
HOST_SYNCS = {"item", "tolist", "cpu", "numpy", "nonzero", "masked_select", "unique", "synchronize"}
TOKENS = 7


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any]:
    from vllm.model_executor.model_loader.utils import process_weights_after_loading

    checkpoint = build_spark2_5_checkpoint(tmp_path_factory.mktemp("capture"), seed=6)
    model, vllm_config = build_model_and_config(checkpoint)
    model.load_weights(iter(checkpoint_tensors(checkpoint).items()))
    process_weights_after_loading(model, vllm_config.model_config, torch.device("cpu"))
    return model, vllm_config


@pytest.fixture(scope="module")
def bf16_attention(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any]:
    """Layer 0's attention of a bfloat16 model: its gate rounds fp32 math to bf16."""
    from vllm.model_executor.model_loader.utils import process_weights_after_loading

    checkpoint = build_spark2_5_checkpoint(tmp_path_factory.mktemp("gate"), seed=7)
    torch.set_default_dtype(torch.bfloat16)  # as vLLM's loader builds a bf16 model
    try:
        model, vllm_config = build_model_and_config(checkpoint, dtype="bfloat16")
    finally:
        torch.set_default_dtype(torch.float32)
    model.load_weights(iter(checkpoint_tensors(checkpoint).items()))
    process_weights_after_loading(model, vllm_config.model_config, torch.device("cpu"))
    return model.model.layers[0].self_attn, vllm_config


def explain(vllm_config: Any, module: torch.nn.Module, *args: Any) -> Any:
    """TorchDynamo's account of ``module(*args)``, in vLLM's forward context (the
    attention ops skip their work without attention metadata, as in vLLM's profile run)."""
    from vllm.config import set_current_vllm_config
    from vllm.forward_context import set_forward_context

    torch._dynamo.reset()
    with set_current_vllm_config(vllm_config), set_forward_context(None, vllm_config):
        return torch._dynamo.explain(module)(*args)


def called(graph: torch.fx.GraphModule) -> set[str]:
    """The last name of everything the graph calls."""
    return {
        str(getattr(node.target, "__name__", node.target)).rsplit(".", 1)[-1]
        for node in graph.graph.nodes
        if node.op in ("call_function", "call_method", "call_module")
    }


def capture_problems(explained: Any) -> list[str]:
    """Why vLLM's compiled or CUDA-graph path could not take this forward as is."""
    problems = [f"graph break: {reason}" for reason in explained.break_reasons]
    for graph in explained.graphs:
        problems += [f"host sync: {name}" for name in sorted(called(graph) & HOST_SYNCS)]
    return problems


def assert_one_capturable_graph(explained: Any) -> None:
    assert capture_problems(explained) == []
    assert explained.graph_count == 1
    assert "unified_attention_with_output" in called(explained.graphs[0])  # layers traced


@pytest.mark.parametrize("layer_type", ["sliding_attention", "full_attention"])
def test_a_decoder_layer_is_one_graph_with_no_host_sync(loaded, layer_type):
    model, vllm_config = loaded
    index = model.config.layer_types.index(layer_type)
    hidden = torch.randn(TOKENS, model.config.hidden_size)
    positions = torch.arange(TOKENS)
    explained = explain(vllm_config, model.model.layers[index], positions, hidden, None)
    assert_one_capturable_graph(explained)


def test_the_whole_forward_is_one_graph_with_no_host_sync(loaded):
    model, vllm_config = loaded
    input_ids = torch.randint(0, model.config.vocab_size, (TOKENS,))
    explained = explain(vllm_config, model, input_ids, torch.arange(TOKENS))
    assert_one_capturable_graph(explained)


@pytest.mark.parametrize(
    "sync", [lambda x: x.abs().max().item(), lambda x: x.cpu().sum()], ids=["item", "cpu"]
)
def test_a_host_sync_in_forward_would_be_found(loaded, monkeypatch, sync):
    """The check is not blind: a host read in the gate is reported."""
    model, vllm_config = loaded
    attention = model.model.layers[0].self_attn
    gate_act = attention.head_gate.act
    monkeypatch.setattr(attention.head_gate, "act", lambda x: gate_act(x) * sync(x))
    hidden = torch.randn(TOKENS, model.config.hidden_size)
    explained = explain(vllm_config, model.model.layers[0], torch.arange(TOKENS), hidden, None)
    assert capture_problems(explained)


# --- the head-wise gate: blocks in eager CPU, one expression when compiled -----------

SPECIALS = st.sampled_from([0.0, -0.0, 1e30, -1e30, float("inf"), float("-inf"), float("nan")])


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    blocks=st.floats(0, 3.5),
    seed=st.integers(0, 2**16),
    special=SPECIALS,
)
def test_the_gate_in_row_blocks_gives_the_bits_of_one_fp32_pass(
    bf16_attention, blocks, seed, special
):
    """Eager on CPU the gate runs a block of rows at a time, in place; every output bit
    (NaN, infinities and signed zeros too) is that of one fp32 pass over all rows."""
    from vllm.config import set_current_vllm_config

    from vllm_spark2_5_plugin.spark2_5_ops import GATE_BLOCK_ROWS

    attention, vllm_config = bf16_attention
    rows = max(1, int(blocks * GATE_BLOCK_ROWS))
    generator = torch.Generator().manual_seed(seed)
    heads_out = torch.randn(rows, attention.q_size, generator=generator).mul_(30).bfloat16()
    heads_out.view(-1)[torch.randint(0, heads_out.numel(), (8,), generator=generator)] = special
    hidden = torch.randn(rows, attention.g_proj.input_size, generator=generator).bfloat16()
    assert attention.head_gate.block_rows == GATE_BLOCK_ROWS  # CPU: blocks
    with set_current_vllm_config(vllm_config):
        blocked = attention.gate_heads(heads_out.clone(), hidden)
        attention.head_gate.block_rows = None
        try:
            whole = attention.gate_heads(heads_out.clone(), hidden)
        finally:
            attention.head_gate.block_rows = GATE_BLOCK_ROWS
    assert blocked.dtype == whole.dtype == torch.bfloat16
    torch.testing.assert_close(blocked, whole, rtol=0, atol=0, equal_nan=True)
    assert torch.equal(blocked.signbit(), whole.signbit())


@pytest.mark.kernels
def test_the_compiled_gate_is_one_expression_over_any_number_of_tokens(bf16_attention):
    """Under TorchDynamo, with the token count symbolic as vLLM compiles it, the gate
    is not split into blocks (no per-size loop, nothing written back in place)."""
    from vllm_spark2_5_plugin.spark2_5_ops import GATE_BLOCK_ROWS

    attention, vllm_config = bf16_attention
    tokens = 3 * GATE_BLOCK_ROWS + 5
    heads_out = torch.randn(tokens, attention.q_size).bfloat16()
    hidden = torch.randn(tokens, attention.g_proj.input_size).bfloat16()
    torch._dynamo.mark_dynamic(heads_out, 0)
    torch._dynamo.mark_dynamic(hidden, 0)

    class Gate(torch.nn.Module):
        def forward(self, heads_out: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
            return attention.gate_heads(heads_out, hidden)

    explained = explain(vllm_config, Gate(), heads_out, hidden)
    assert capture_problems(explained) == [] and explained.graph_count == 1
    assert not called(explained.graphs[0]) & {"split", "copy_"}


# --- the finite keys/values guard: nan_to_num eager, a select when compiled --------


def _hostile_bf16(seed: int, special: float, rows: int = 33) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    values = torch.randn(rows, 64, generator=generator).mul_(1e3).bfloat16()
    values.view(-1)[torch.randint(0, values.numel(), (16,), generator=generator)] = special
    return values


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(seed=st.integers(0, 2**16), special=SPECIALS)
def test_the_finite_guard_gives_the_same_bits_on_both_of_its_paths(seed, special, monkeypatch):
    """Eager and compiled code take different ops to zero NaN and infinities; every
    other value, signed zeros too, passes bit for bit on both."""
    from vllm_spark2_5_plugin.spark2_5_ops import finite

    values = _hostile_bf16(seed, special)
    eager = finite(values)
    with monkeypatch.context() as patched:
        patched.setattr(torch.compiler, "is_compiling", lambda: True)
        compiled_path = finite(values)
    assert torch.equal(eager.view(torch.int16), compiled_path.view(torch.int16))
    assert torch.isfinite(eager).all()
    finite = torch.isfinite(values)
    assert torch.equal(eager[finite].view(torch.int16), values[finite].view(torch.int16))


@pytest.mark.kernels
def test_the_compiled_finite_guard_is_the_select_and_keeps_the_bits(loaded):
    """Compiled, the guard is the select Inductor compiles well on CPU, not
    ``nan_to_num``, and Inductor's code gives the eager bits."""
    from vllm_spark2_5_plugin.spark2_5_ops import finite

    model, vllm_config = loaded
    layer = model.model.layers[0]
    assert layer.self_attn.finite_kv_only  # CPU: the guard is on
    hidden = torch.randn(TOKENS, model.config.hidden_size)
    explained = explain(vllm_config, layer, torch.arange(TOKENS), hidden, None)
    assert {"isfinite", "where"} <= called(explained.graphs[0])
    assert "nan_to_num" not in called(explained.graphs[0])
    values = _hostile_bf16(seed=1, special=float("nan"))
    values[0, :3] = torch.tensor([float("inf"), float("-inf"), -0.0])
    compiled = torch.compile(finite, dynamic=True)(values)
    assert torch.equal(compiled.view(torch.int16), finite(values).view(torch.int16))
