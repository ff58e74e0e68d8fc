# SPDX-License-Identifier: Apache-2.0
"""The math a Spark2_5 attention layer adds to a Llama-style one: the head-wise output
gate and the finite keys/values guard, each with its eager and its compiled form."""

import torch
import torch.nn.functional as F
from torch import nn

from vllm_spark2_5_plugin import cpu_platform

_GATE_ACTIVATIONS = {"sigmoid": torch.sigmoid, "silu": F.silu}
# Token rows per block of eager CPU gate math: 2 MiB of fp32 at the 4B's 16 heads of 256.
GATE_BLOCK_ROWS = 128


def finite(x: torch.Tensor) -> torch.Tensor:
    """``x`` with NaN and infinities as 0, the same bits either way: eager, one
    ``nan_to_num`` kernel; compiled, the select that Inductor turns into faster CPU
    code than it makes of ``nan_to_num``."""
    if torch.compiler.is_compiling():
        return torch.where(torch.isfinite(x), x, 0.0)
    return torch.nan_to_num(x, nan=0.0, posinf=0.0, neginf=0.0)


class Spark2_5HeadGate(nn.Module):
    """Scales each head's attention output by ``act(gate_logits)`` for that head, in
    fp32 as in the reference, rounded once to the output's dtype.

    ``forward_native`` scales one fp32 copy in place (compiled, Inductor fuses it
    into one loop). ``forward_cpu``, chosen at construction where eager math over
    a whole prefill is cheaper a block of rows at a time (``cpu_platform``), scales
    a block's fp32 copy at a time and writes it back into the output; compiled, the
    native form runs there too.
    """

    def __init__(self, num_heads: int, head_dim: int, act_mode: str) -> None:
        super().__init__()
        self.num_heads, self.head_dim = num_heads, head_dim
        self.act = _GATE_ACTIVATIONS[act_mode]
        in_row_blocks = cpu_platform.gate_math_in_row_blocks()
        self.block_rows = GATE_BLOCK_ROWS if in_row_blocks else None

    def forward(self, attn_output: torch.Tensor, gate_logits: torch.Tensor) -> torch.Tensor:
        if self.block_rows is None or torch.compiler.is_compiling():
            return self.forward_native(attn_output, gate_logits)
        return self.forward_cpu(attn_output, gate_logits)

    def forward_native(self, attn_output: torch.Tensor, gate_logits: torch.Tensor) -> torch.Tensor:
        gate = self.act(gate_logits.float()).unsqueeze(-1)
        heads = attn_output.view(-1, self.num_heads, self.head_dim)
        return heads.float().mul_(gate).view_as(attn_output).to(attn_output.dtype)

    def forward_cpu(self, attn_output: torch.Tensor, gate_logits: torch.Tensor) -> torch.Tensor:
        gate = self.act(gate_logits.float()).unsqueeze(-1)
        heads = attn_output.view(-1, self.num_heads, self.head_dim)
        rows = self.block_rows
        for block, block_gate in zip(heads.split(rows), gate.split(rows), strict=True):
            block.copy_(block.float().mul_(block_gate))
        return attn_output
