"""Loading Spark2_5 checkpoints into the real vLLM model: every tensor accounted
for, each layout, each tensor/pipeline parallel rank, and one real ``vllm serve``."""

from __future__ import annotations

import json

import pytest
import torch

from spark2_5_dev.checkpoints import build_spark2_5_checkpoint
from spark2_5_dev.model_building import (
    build_model,
    checkpoint_tensors,
    parallel_rank,
    vllm_model_env,
)

__all__ = ["vllm_model_env"]  # the fixture, for pytest

pytestmark = [pytest.mark.usefixtures("vllm_model_env"), pytest.mark.kernels]

NUM_HEADS, HEAD_DIM = 4, 32


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory: pytest.TempPathFactory):
    """The same random weights in each layout, plus tied/untied and KV-head variants."""
    root = tmp_path_factory.mktemp("spark2_5-loading")
    return {
        "fused": build_spark2_5_checkpoint(root / "fused", seed=7),
        "split": build_spark2_5_checkpoint(root / "split", seed=7, qkv="split", shards=2),
        "untied": build_spark2_5_checkpoint(root / "untied", seed=8, tie_word_embeddings=False),
        "one-kv-head": build_spark2_5_checkpoint(
            root / "one-kv-head", seed=9, num_key_value_heads=1, tie_word_embeddings=False
        ),
        "no-gate": build_spark2_5_checkpoint(
            root / "no-gate", seed=10, headwise_attn_output_gate=False
        ),
    }


def loaded(checkpoint, weights=None):
    """The model for ``checkpoint`` with ``weights`` (default: the checkpoint's) loaded,
    and the names ``load_weights`` reported."""
    model = build_model(checkpoint)
    tensors = checkpoint_tensors(checkpoint) if weights is None else weights
    return model, model.load_weights(iter(tensors.items()))


def params(model) -> dict[str, torch.Tensor]:
    return {name: p.detach() for name, p in model.named_parameters()}


def fused_qkv(tensors, layer):
    prefix = f"model.layers.{layer}.self_attn"
    if f"{prefix}.q_k_v_proj.weight" in tensors:
        return tensors[f"{prefix}.q_k_v_proj.weight"]
    return torch.cat([tensors[f"{prefix}.{p}_proj.weight"] for p in "qkv"])


# --- layouts ---------------------------------------------------------------------


def test_fused_checkpoint_fills_every_parameter_with_its_tensor(checkpoints):
    tensors = checkpoint_tensors(checkpoints["fused"])
    model, names = loaded(checkpoints["fused"])
    got = params(model)
    assert names == set(got)
    for layer in range(4):
        prefix = f"model.layers.{layer}"
        torch.testing.assert_close(
            got[f"{prefix}.self_attn.q_k_v_proj.weight"], fused_qkv(tensors, layer), rtol=0, atol=0
        )
        torch.testing.assert_close(
            got[f"{prefix}.mlp.gate_up_proj.weight"],
            torch.cat(
                [tensors[f"{prefix}.mlp.gate_proj.weight"], tensors[f"{prefix}.mlp.up_proj.weight"]]
            ),
            rtol=0,
            atol=0,
        )
    unpacked = [n for n in got if "q_k_v_proj" not in n and "gate_up_proj" not in n]
    for name in unpacked:
        torch.testing.assert_close(got[name], tensors[name], rtol=0, atol=0)


def test_split_qkv_sharded_checkpoint_loads_like_the_fused_one(checkpoints):
    assert (checkpoints["split"] / "model.safetensors.index.json").exists()
    split_names = checkpoint_tensors(checkpoints["split"])
    assert "model.layers.0.self_attn.k_proj.weight" in split_names
    fused, _ = loaded(checkpoints["fused"])
    split, _ = loaded(checkpoints["split"])
    for name, value in params(fused).items():
        torch.testing.assert_close(params(split)[name], value, rtol=0, atol=0)


def test_tied_head_is_the_embedding_and_a_stray_lm_head_is_ignored(checkpoints):
    tensors = checkpoint_tensors(checkpoints["fused"])
    assert "lm_head.weight" not in tensors
    stray = {**tensors, "lm_head.weight": torch.full_like(tensors["model.embedding.weight"], 7.0)}
    model, names = loaded(checkpoints["fused"], stray)
    assert model.lm_head.weight is model.model.embedding.weight
    assert "lm_head.weight" not in names
    torch.testing.assert_close(
        model.model.embedding.weight.detach(), tensors["model.embedding.weight"], rtol=0, atol=0
    )


def test_untied_head_loads_lm_head(checkpoints):
    tensors = checkpoint_tensors(checkpoints["untied"])
    model, names = loaded(checkpoints["untied"])
    assert "lm_head.weight" in names
    assert model.lm_head.weight is not model.model.embedding.weight
    torch.testing.assert_close(
        model.lm_head.weight.detach(), tensors["lm_head.weight"], rtol=0, atol=0
    )


def test_without_gate_there_is_no_g_proj(checkpoints):
    tensors = checkpoint_tensors(checkpoints["no-gate"])
    assert not any("g_proj" in name for name in tensors)
    model, _ = loaded(checkpoints["no-gate"])
    assert all(layer.self_attn.g_proj is None for layer in model.model.layers)


# --- every tensor accounted for ---------------------------------------------------------


@pytest.mark.parametrize(
    ("layout", "dropped", "named"),
    [
        (
            "fused",
            "model.layers.1.self_attn.g_proj.weight",
            "model.layers.1.self_attn.g_proj.weight",
        ),
        ("fused", "model.norm.weight", "model.norm.weight"),
        (
            "fused",
            "model.layers.2.self_attn.q_k_v_proj.weight",
            "model.layers.2.self_attn.q_k_v_proj.weight (or its parts",
        ),
        (
            "split",
            "model.layers.3.self_attn.v_proj.weight",
            "model.layers.3.self_attn.v_proj.weight",
        ),
        ("fused", "model.layers.0.mlp.up_proj.weight", "model.layers.0.mlp.up_proj.weight"),
        ("untied", "lm_head.weight", "lm_head.weight"),
    ],
)
def test_a_missing_tensor_is_an_error_that_names_it(checkpoints, layout, dropped, named):
    tensors = checkpoint_tensors(checkpoints[layout])
    del tensors[dropped]
    with pytest.raises(ValueError, match="lacks these tensors") as error:
        loaded(checkpoints[layout], tensors)
    assert named in str(error.value)


@pytest.mark.parametrize(
    "unexpected",
    [
        "model.layers.0.self_attn.q_k_v_proj.bias",
        "model.layers.4.mlp.down_proj.weight",
        "model.layers.0.self_attn.rotary_emb.inv_freq",
    ],
)
def test_an_unexpected_tensor_is_an_error_that_names_it(checkpoints, unexpected):
    tensors = checkpoint_tensors(checkpoints["fused"])
    tensors[unexpected] = torch.zeros(4)
    with pytest.raises(ValueError, match="Unexpected tensor") as error:
        loaded(checkpoints["fused"], tensors)
    assert repr(unexpected) in str(error.value)


def test_fused_and_split_qkv_together_is_an_error(checkpoints):
    tensors = checkpoint_tensors(checkpoints["fused"])
    tensors["model.layers.0.self_attn.k_proj.weight"] = torch.zeros(2 * HEAD_DIM, 64)
    with pytest.raises(ValueError, match="both load into") as error:
        loaded(checkpoints["fused"], tensors)
    assert "model.layers.0.self_attn.k_proj.weight" in str(error.value)


# --- tensor and pipeline parallel ranks ---------------------------------------------


def expected_tp_shard(name: str, full: torch.Tensor, rank: int, tp: int, num_kv: int):
    """What rank ``rank`` of ``tp`` should hold of checkpoint parameter ``name``."""

    def rows(t: torch.Tensor) -> torch.Tensor:
        return t.chunk(tp, dim=0)[rank]

    def cols(t: torch.Tensor) -> torch.Tensor:
        return t.chunk(tp, dim=1)[rank]

    if name.endswith("q_k_v_proj.weight"):
        q, k, v = full.split([NUM_HEADS * HEAD_DIM, num_kv * HEAD_DIM, num_kv * HEAD_DIM])
        if num_kv >= tp:  # partitioned
            kv_heads = slice(rank * num_kv // tp * HEAD_DIM, (rank + 1) * num_kv // tp * HEAD_DIM)
        else:  # replicated: ranks sharing a KV head hold a full copy of it
            head = rank * num_kv // tp
            kv_heads = slice(head * HEAD_DIM, (head + 1) * HEAD_DIM)
        return torch.cat([rows(q), k[kv_heads], v[kv_heads]])
    if name.endswith("gate_up_proj.weight"):
        gate, up = full.chunk(2)
        return torch.cat([rows(gate), rows(up)])
    if name.endswith(("out_proj.weight", "down_proj.weight")):
        return cols(full)
    if name.endswith(("g_proj.weight", "embedding.weight", "lm_head.weight")):
        return rows(full)
    return full  # norms are replicated


def full_parameters(checkpoint) -> dict[str, torch.Tensor]:
    model, _ = loaded(checkpoint)
    return params(model)


@pytest.mark.parametrize(
    ("layout", "num_kv"),
    [("fused", 2), ("one-kv-head", 1)],
    ids=["kv-heads-partitioned", "kv-heads-replicated"],
)
def test_each_tensor_parallel_rank_loads_its_shard(checkpoints, monkeypatch, layout, num_kv):
    tp = 2
    full = full_parameters(checkpoints[layout])
    for rank in range(tp):
        with parallel_rank(monkeypatch, tp=(rank, tp)):
            model, _ = loaded(checkpoints[layout])
            attn = model.model.layers[0].self_attn
            assert (attn.num_heads, attn.num_kv_heads) == (NUM_HEADS // tp, max(1, num_kv // tp))
            for name, shard in params(model).items():
                expected = expected_tp_shard(name, full[name], rank, tp, num_kv)
                torch.testing.assert_close(shard, expected, rtol=0, atol=0, msg=name)


@pytest.mark.parametrize(
    ("overrides", "tp", "named"),
    [
        ({}, 8, "num_attention_heads=4"),
        ({"num_attention_heads": 6, "num_key_value_heads": 3}, 2, "num_key_value_heads=3"),
    ],
    ids=["query-heads", "kv-heads"],
)
def test_heads_that_do_not_divide_across_ranks_fail_with_a_clear_error(
    tmp_path, monkeypatch, overrides, tp, named
):
    checkpoint = build_spark2_5_checkpoint(tmp_path, **overrides)
    with parallel_rank(monkeypatch, tp=(0, tp)), pytest.raises(ValueError) as error:
        build_model(checkpoint)
    assert named in str(error.value)
    assert f"tensor_parallel_size={tp}" in str(error.value)


@pytest.mark.parametrize("layout", ["fused", "untied"])
def test_each_pipeline_stage_loads_only_its_layers(checkpoints, monkeypatch, layout):
    tensors = checkpoint_tensors(checkpoints[layout])
    tied = "lm_head.weight" not in tensors
    stage_layers = {0: {0, 1}, 1: {2, 3}}
    for stage in (0, 1):
        with parallel_rank(monkeypatch, pp=(stage, 2)):
            model, names = loaded(checkpoints[layout])
        got = params(model)
        assert names == set(got)
        layers = {int(n.split(".")[2]) for n in got if n.startswith("model.layers.")}
        assert layers == stage_layers[stage]
        has_embedding = stage == 0 or tied  # a tied head needs it on the last stage
        assert ("model.embedding.weight" in got) == has_embedding
        assert ("model.norm.weight" in got) == (stage == 1)
        assert ("lm_head.weight" in got) == (stage == 1 and not tied)
        for name, value in got.items():
            if "q_k_v_proj" not in name and "gate_up_proj" not in name:
                torch.testing.assert_close(value, tensors[name], rtol=0, atol=0, msg=name)


# --- RoPE caches -----------------------------------------------------------------------


def test_rope_caches_follow_max_model_len_not_max_position_embeddings(checkpoints):
    config = json.loads((checkpoints["fused"] / "config.json").read_text())
    assert config["max_position_embeddings"] == 1_048_576
    for max_model_len in (64, 200):
        model = build_model(checkpoints["fused"], max_model_len=max_model_len)
        for layer_type, layer in zip(config["layer_types"], model.model.layers, strict=True):
            rope = config["rope_parameters"][layer_type]
            rotary_dim = int(HEAD_DIM * rope["partial_rotary_factor"])
            cache = layer.self_attn.rotary_emb.cos_sin_cache
            assert tuple(cache.shape) == (max_model_len, rotary_dim)
