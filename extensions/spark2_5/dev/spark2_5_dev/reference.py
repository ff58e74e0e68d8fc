"""Spark2_5 in plain PyTorch: the Hugging Face forward pass, written to be read.

This is the independent reference the vLLM model is checked against, so it
imports nothing from vLLM or from the plugin's model code. It is an ordinary
differentiable ``nn.Module`` whose parameter names are the checkpoint's, so it
can also be trained and saved as a checkpoint.

What it implements (the semantics of the released remote code):

* the residual stream is kept in float32; each RMSNorm computes in float32,
  returns ``weight * x / rms(x)`` and casts to the weight dtype;
* attention is grouped-query with scale ``head_dim ** -0.5``; a sliding layer
  lets each token see itself and ``sliding_window - 1`` earlier tokens;
* RoPE is neox style (rotate-half) on the first
  ``int(head_dim * partial_rotary_factor)`` dims of each head, per layer type;
* each head's output is multiplied by ``act(g_proj(x))`` (fp32, ``act`` from
  ``gate_attn_act_mode``) before ``out_proj`` when ``headwise_attn_output_gate``;
* the MLP is ``down(gelu(gate(x)) * up(x))`` with exact (erf) GELU;
* logits come from the embedding matrix when ``tie_word_embeddings``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

GATE_ACTIVATIONS = {"sigmoid": torch.sigmoid, "silu": F.silu}
# Query rows attended at once: bounds the [heads, rows, T] score matrix.
QUERY_BLOCK = 1024


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(self.weight.dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


def apply_partial_rope(
    x: torch.Tensor, positions: torch.Tensor, theta: float, rotary_dim: int
) -> torch.Tensor:
    """Rotate the first ``rotary_dim`` dims of each head of ``x`` [..., T, heads, D]."""
    exponents = torch.arange(0, rotary_dim, 2, dtype=torch.float32, device=x.device) / rotary_dim
    inv_freq = 1.0 / (theta**exponents)
    freqs = positions.float()[:, None] * inv_freq[None, :]
    angles = torch.cat((freqs, freqs), dim=-1)[:, None, :]  # [T, 1, rotary_dim]
    rotated, passed = x[..., :rotary_dim], x[..., rotary_dim:]
    rotated = rotated.float() * angles.cos() + rotate_half(rotated.float()) * angles.sin()
    return torch.cat((rotated.to(x.dtype), passed), dim=-1)


class Attention(nn.Module):
    def __init__(self, config: dict[str, Any], layer_type: str) -> None:
        super().__init__()
        hidden = config["hidden_size"]
        self.num_heads = config["num_attention_heads"]
        self.num_kv_heads = config["num_key_value_heads"]
        self.head_dim = config["head_dim"]
        rope = config["rope_parameters"][layer_type]
        self.rope_theta = rope.get("rope_theta", 10_000)
        self.rotary_dim = int(self.head_dim * rope.get("partial_rotary_factor", 1.0))
        self.window = config["sliding_window"] if layer_type == "sliding_attention" else None
        self.q_k_v_proj = nn.Linear(
            hidden, (self.num_heads + 2 * self.num_kv_heads) * self.head_dim, bias=False
        )
        self.g_proj = (
            nn.Linear(hidden, self.num_heads, bias=False)
            if config["headwise_attn_output_gate"]
            else None
        )
        self.gate_act = GATE_ACTIVATIONS[config["gate_attn_act_mode"]]
        self.out_proj = nn.Linear(self.num_heads * self.head_dim, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` is [batch, T, hidden], every sequence starting at position 0."""
        batch, length, _ = x.shape
        positions = torch.arange(length, device=x.device)
        q, k, v = self.q_k_v_proj(x).split(
            [
                self.num_heads * self.head_dim,
                self.num_kv_heads * self.head_dim,
                self.num_kv_heads * self.head_dim,
            ],
            dim=-1,
        )
        q = q.view(batch, length, self.num_heads, self.head_dim)
        k = k.view(batch, length, self.num_kv_heads, self.head_dim)
        v = v.view(batch, length, self.num_kv_heads, self.head_dim)
        q = apply_partial_rope(q, positions, self.rope_theta, self.rotary_dim)
        k = apply_partial_rope(k, positions, self.rope_theta, self.rotary_dim)
        # Each KV head serves a consecutive group of query heads.
        group = self.num_heads // self.num_kv_heads
        k = k.repeat_interleave(group, dim=2)
        v = v.repeat_interleave(group, dim=2)

        # Queries in blocks, so that a 16K-token prompt's scores fit in memory. A
        # block skips the keys none of its queries may see (their weight is exactly 0).
        blocks = []
        for start in range(0, length, QUERY_BLOCK):
            stop = min(start + QUERY_BLOCK, length)
            first_key = 0 if self.window is None else max(0, start - self.window + 1)
            keys = slice(first_key, stop)
            blocks.append(
                self.attend(
                    q[:, start:stop], k[:, keys], v[:, keys], positions[start:stop], positions[keys]
                )
            )
        heads = torch.cat(blocks, dim=1)  # [batch, T, heads, D]

        if self.g_proj is not None:
            gate = self.gate_act(self.g_proj(x).float())  # [batch, T, heads]
            heads = (heads.float() * gate[..., None]).to(heads.dtype)
        return self.out_proj(heads.reshape(batch, length, -1))

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        query_pos: torch.Tensor,
        key_pos: torch.Tensor,
    ) -> torch.Tensor:
        """Causal (and windowed) attention of queries at ``query_pos`` over keys at ``key_pos``."""
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k).float() * self.head_dim**-0.5
        query_pos, key_pos = query_pos[:, None], key_pos[None, :]
        visible = key_pos <= query_pos
        if self.window is not None:
            visible &= key_pos > query_pos - self.window
        scores = scores.masked_fill(~visible, float("-inf"))
        probs = scores.softmax(dim=-1).to(v.dtype)
        return torch.einsum("bhqk,bkhd->bqhd", probs, v)


class MLP(nn.Module):
    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__()
        if config["hidden_act"] != "gelu":
            raise ValueError(f"hidden_act={config['hidden_act']!r}: Spark2_5 uses 'gelu'")
        hidden, intermediate = config["hidden_size"], config["intermediate_size"]
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.gelu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, config: dict[str, Any], layer_type: str) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config["hidden_size"], config["rms_norm_eps"])
        self.self_attn = Attention(config, layer_type)
        self.post_attention_layernorm = RMSNorm(config["hidden_size"], config["rms_norm_eps"])
        self.mlp = MLP(config)

    def forward(self, residual: torch.Tensor) -> torch.Tensor:
        residual = residual + self.self_attn(self.input_layernorm(residual)).float()
        return residual + self.mlp(self.post_attention_layernorm(residual)).float()


class Model(nn.Module):
    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__()
        self.embedding = nn.Embedding(config["vocab_size"], config["hidden_size"])
        self.layers = nn.ModuleList(DecoderLayer(config, t) for t in config["layer_types"])
        self.norm = RMSNorm(config["hidden_size"], config["rms_norm_eps"])

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        residual = self.embedding(input_ids).float()
        for layer in self.layers:
            residual = layer(residual)
        return self.norm(residual)


class Spark2_5Reference(nn.Module):
    """Spark2_5ForCausalLM; ``state_dict()`` keys are the checkpoint's tensor names."""

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__()
        self.config = config
        self.model = Model(config)
        self.lm_head = (
            None
            if config["tie_word_embeddings"]
            else nn.Linear(config["hidden_size"], config["vocab_size"], bias=False)
        )

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Float32 logits [batch, T, vocab] for ``input_ids`` [batch, T] (or [T])."""
        squeeze = input_ids.dim() == 1
        hidden = self.model(input_ids[None] if squeeze else input_ids)
        head = self.model.embedding.weight if self.lm_head is None else self.lm_head.weight
        logits = (hidden @ head.T).float()
        return logits[0] if squeeze else logits

    @classmethod
    def from_pretrained(
        cls, path: str | Path, dtype: torch.dtype = torch.float32
    ) -> Spark2_5Reference:
        """Load a checkpoint directory: ``config.json`` and its safetensors (one file or
        sharded with an index); separate ``q_proj/k_proj/v_proj`` are fused."""
        path = Path(path)
        config = json.loads((path / "config.json").read_text())
        tensors = checkpoint_tensors(path)
        if config["tie_word_embeddings"]:
            tensors.pop("lm_head.weight", None)
        model = cls(config)
        model.load_state_dict(fuse_qkv(tensors), strict=True)
        return model.to(dtype).eval()

    def as_input(self, tokens: list[int]) -> torch.Tensor:
        """Token ids as a tensor on the model's device."""
        return torch.tensor(tokens, device=self.model.embedding.weight.device)

    @torch.no_grad()
    def generate(self, prompt: list[int], max_new_tokens: int) -> tuple[list[int], list[float]]:
        """Greedy continuation of ``prompt``: the new tokens and their log-probabilities."""
        tokens = list(prompt)
        logprobs = []
        for _ in range(max_new_tokens):
            step = self(self.as_input(tokens))[-1].log_softmax(-1)
            token = int(step.argmax())
            tokens.append(token)
            logprobs.append(float(step[token]))
        return tokens[len(prompt) :], logprobs

    @torch.no_grad()
    def score(self, prompt: list[int], continuation: list[int]) -> torch.Tensor:
        """Log-probabilities [len(continuation), vocab] at each continuation step,
        teacher-forced on the given continuation."""
        tokens = self.as_input(prompt + continuation)
        logits = self(tokens)[len(prompt) - 1 : len(tokens) - 1]
        return logits.log_softmax(-1)


def fuse_qkv(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Replace separate ``q_proj/k_proj/v_proj`` weights by the fused ``q_k_v_proj``."""
    fused = dict(tensors)
    for name in [n for n in tensors if ".self_attn.q_proj." in n]:
        parts = [fused.pop(name.replace(".q_proj.", f".{p}_proj.")) for p in "qkv"]
        fused[name.replace(".q_proj.", ".q_k_v_proj.")] = torch.cat(parts, dim=0)
    return fused


def checkpoint_tensors(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a checkpoint directory, by name: ``model.safetensors`` or the
    shards its ``model.safetensors.index.json`` lists."""
    from safetensors.torch import load_file

    index = path / "model.safetensors.index.json"
    files = (
        sorted(set(json.loads(index.read_text())["weight_map"].values()))
        if index.exists()
        else ["model.safetensors"]
    )
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        tensors.update(load_file(str(path / file)))
    return tensors
