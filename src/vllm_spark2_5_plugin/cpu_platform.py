# SPDX-License-Identifier: Apache-2.0
"""What differs on vLLM's CPU platform that the model chooses once, at construction:
each answer is true on vLLM's CPU build (0.23 to 0.33) and false elsewhere. GPU
backends were not run here; the CPU answers are measured (the tests and benchmarks
each docstring names)."""

from __future__ import annotations


def attention_reads_stale_kv_slots() -> bool:
    """Whether this platform's attention reads the stale slots of reused KV-cache
    blocks, weighted zero: vLLM's CPU attention (0.23 to 0.33). There 0 * NaN is
    NaN, so the NaN keys or values of one request whose activations overflow (a
    damaged LoRA adapter) would corrupt every later request that reuses its blocks,
    and the model writes only finite ones. Off on other platforms (GPU backends were
    not run here), where the guard would cost kernels per layer and hide NaNs."""
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


def gate_math_in_row_blocks() -> bool:
    """Whether eager elementwise math over a whole prefill is cheaper a block of
    rows at a time: on CPU an fp32 copy of every head's output (64 MiB for 4,096
    tokens of the 4B) is streamed through memory three times, and with glibc's
    allocator page-faulted in afresh; a block's copy stays in cache. GPU eager
    would launch three kernels per block instead of three in all."""
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


def linears_compute_with_copies() -> bool:
    """Whether vLLM's linear layers compute with copies of their weights made when
    loading finished: its CPU backend (0.23 to 0.33) packs each unquantized linear
    for oneDNN or its SGL kernel and empties the layer's ``weight``, and computes an
    LM head from a packed copy too. Other platforms' kernels read the parameters, so
    a weight written into them serves from the next step."""
    from vllm.platforms import current_platform

    return current_platform.is_cpu()
