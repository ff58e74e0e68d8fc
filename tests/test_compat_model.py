"""The model-side helpers of ``compat``: each one against the installed vLLM and
against a stand-in with the API shape of an older release."""

from __future__ import annotations

import dataclasses
import types
from dataclasses import field

import pytest
import torch
from spark2_5_support import vllm_model_env
from torch import nn

from vllm_spark2_5_plugin import compat

__all__ = ["vllm_model_env"]  # the fixture, for pytest

HIDDEN, HEAD_DIM, HEADS, KV_HEADS, INTERMEDIATE = 64, 32, 2, 1, 96


# --- Attention import path ----------------------------------------------------------


def test_attention_comes_from_its_current_module():
    from vllm.model_executor.layers.attention import Attention

    assert compat.attention_cls() is Attention


# --- get_rope signature ---------------------------------------------------------------


def test_get_rope_with_rope_parameters_builds_a_partial_neox_cache():
    from vllm.config import VllmConfig, set_current_vllm_config

    with set_current_vllm_config(VllmConfig()):
        rope = compat.get_rope(
            HEAD_DIM, max_position=100, rope_theta=1e4, partial_rotary_factor=0.25
        )
    assert rope.rotary_dim == 8
    assert rope.is_neox_style
    assert rope.base == 1e4
    assert tuple(rope.cos_sin_cache.shape) == (100, 8)


# --- WeightsMapper / AutoWeightsLoader ------------------------------------------------


@dataclasses.dataclass
class WeightsMapperWithoutStacking:
    """vLLM 0.23's ``WeightsMapper``: renames only, no ``orig_to_new_stacked``."""

    orig_to_new_substr: dict = field(default_factory=dict)
    orig_to_new_prefix: dict = field(default_factory=dict)
    orig_to_new_suffix: dict = field(default_factory=dict)

    def apply(self, weights):
        yield from weights  # no renames are configured in these tests


class AutoWeightsLoaderWithSkipPrefixes:
    """The pre-0.29 ``AutoWeightsLoader`` shape: it takes ``skip_prefixes`` and calls
    each parameter's ``weight_loader(param, tensor)`` with no shard id."""

    def __init__(self, module, *, skip_prefixes=None):
        self.module = module
        self.skip_prefixes = skip_prefixes or []

    def load_weights(self, weights, *, mapper=None):
        from vllm.model_executor.model_loader.weight_utils import default_weight_loader

        params = dict(self.module.named_parameters())
        loaded = set()
        for name, tensor in mapper.apply(weights) if mapper else weights:
            if any(name.startswith(prefix) for prefix in self.skip_prefixes):
                continue
            if name not in params:
                raise ValueError(f"no parameter {name}")
            param = params[name]
            getattr(param, "weight_loader", default_weight_loader)(param, tensor)
            loaded.add(name)
        return loaded


def use_older_weight_loading(monkeypatch) -> None:
    """Make ``compat`` see vLLM 0.23's weight-loading classes."""
    from vllm.model_executor.models import utils

    monkeypatch.setattr(
        compat,
        "_model_utils",
        lambda: types.SimpleNamespace(
            WeightsMapper=WeightsMapperWithoutStacking,
            AutoWeightsLoader=AutoWeightsLoaderWithSkipPrefixes,
            is_pp_missing_parameter=utils.is_pp_missing_parameter,
        ),
    )


@pytest.fixture
def older_vllm(monkeypatch):
    """``compat`` sees vLLM 0.23's weight-loading classes."""
    use_older_weight_loading(monkeypatch)


@dataclasses.dataclass
class WeightsMapperWithStacking(WeightsMapperWithoutStacking):
    """vLLM 0.25's ``WeightsMapper`` fields."""

    orig_to_new_stacked: dict = field(default_factory=dict)


def test_weights_mapper_stacking_is_detected_by_its_field(older_vllm):
    assert compat.weights_mapper_stacks(WeightsMapperWithStacking)
    assert not compat.weights_mapper_stacks(WeightsMapperWithoutStacking)
    assert not compat.weights_mapper_stacks()  # what compat now sees


def test_stacked_mapper_tags_shards_and_keeps_fused_names():
    from vllm_spark2_5_plugin.spark2_5 import STACKED_PARAMS

    if not compat.weights_mapper_stacks():
        pytest.skip(
            "this vLLM's WeightsMapper cannot stack (0.23, 0.24): "
            "test_stacked_mapper_is_empty_without_stacking covers that shape"
        )
    mapper = compat.stacked_weights_mapper(STACKED_PARAMS)
    names = [
        "layers.0.mlp.gate_proj.weight",
        "layers.0.mlp.up_proj.weight",
        "layers.0.mlp.gate_up_proj.weight",
        "layers.0.self_attn.k_proj.weight",
        "layers.0.self_attn.q_k_v_proj.weight",
    ]
    mapped = [
        (name, getattr(tensor, "shard_id", None))
        for name, tensor in mapper.apply((n, torch.zeros(1)) for n in names)
    ]
    assert mapped == [
        ("layers.0.mlp.gate_up_proj.weight", 0),
        ("layers.0.mlp.gate_up_proj.weight", 1),
        ("layers.0.mlp.gate_up_proj.weight", None),
        ("layers.0.self_attn.q_k_v_proj.weight", "k"),
        ("layers.0.self_attn.q_k_v_proj.weight", None),
    ]


def test_stacked_mapper_is_empty_without_stacking(older_vllm):
    from vllm_spark2_5_plugin.spark2_5 import STACKED_PARAMS

    assert compat.stacked_weights_mapper(STACKED_PARAMS) == WeightsMapperWithoutStacking()


class Layer(nn.Module):
    """The packed projections of one Spark2_5 layer, as vLLM builds them."""

    def __init__(self) -> None:
        from vllm.model_executor.layers.layernorm import RMSNorm
        from vllm.model_executor.layers.linear import (
            MergedColumnParallelLinear,
            QKVParallelLinear,
        )

        super().__init__()
        self.self_attn = nn.Module()
        self.self_attn.q_k_v_proj = QKVParallelLinear(
            HIDDEN, HEAD_DIM, HEADS, KV_HEADS, bias=False, prefix="layer.self_attn.q_k_v_proj"
        )
        self.mlp = nn.Module()
        self.mlp.gate_up_proj = MergedColumnParallelLinear(
            HIDDEN, [INTERMEDIATE] * 2, bias=False, prefix="layer.mlp.gate_up_proj"
        )
        self.norm = RMSNorm(HIDDEN)


@pytest.fixture
def layer(vllm_model_env):
    from vllm.config import VllmConfig, set_current_vllm_config

    with set_current_vllm_config(VllmConfig()):
        return Layer()


def split_weights(seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return torch.randn(*shape, generator=generator)

    return {
        "self_attn.q_proj.weight": rand(HEADS * HEAD_DIM, HIDDEN),
        "self_attn.k_proj.weight": rand(KV_HEADS * HEAD_DIM, HIDDEN),
        "self_attn.v_proj.weight": rand(KV_HEADS * HEAD_DIM, HIDDEN),
        "mlp.gate_proj.weight": rand(INTERMEDIATE, HIDDEN),
        "mlp.up_proj.weight": rand(INTERMEDIATE, HIDDEN),
        "norm.weight": rand(HIDDEN),
    }


def expected_packed(weights):
    qkv = torch.cat([weights[f"self_attn.{p}_proj.weight"] for p in "qkv"])
    gate_up = torch.cat([weights["mlp.gate_proj.weight"], weights["mlp.up_proj.weight"]])
    return qkv, gate_up


LOADED = {"self_attn.q_k_v_proj.weight", "mlp.gate_up_proj.weight", "norm.weight"}


@pytest.mark.parametrize("api", ["installed", "older"])
def test_load_weights_fills_packed_shards_and_drops_skipped_names(layer, request, api):
    if api == "older":
        request.getfixturevalue("older_vllm")
    from vllm_spark2_5_plugin.spark2_5 import STACKED_PARAMS

    weights = split_weights(seed=0)
    stray = {"lm_head.weight": torch.zeros(3)}  # would fail to load if it reached the loader
    names = compat.load_weights(
        layer,
        iter({**weights, **stray}.items()),
        stacked=STACKED_PARAMS,
        skip_prefixes=["lm_head."],
    )
    assert names == LOADED
    qkv, gate_up = expected_packed(weights)
    torch.testing.assert_close(layer.self_attn.q_k_v_proj.weight.detach(), qkv, rtol=0, atol=0)
    torch.testing.assert_close(layer.mlp.gate_up_proj.weight.detach(), gate_up, rtol=0, atol=0)
    torch.testing.assert_close(layer.norm.weight.detach(), weights["norm.weight"], rtol=0, atol=0)


@pytest.mark.parametrize("api", ["installed", "older"])
def test_load_weights_loads_a_fused_qkv_with_no_shard_id(layer, request, api):
    if api == "older":
        request.getfixturevalue("older_vllm")
    from vllm_spark2_5_plugin.spark2_5 import STACKED_PARAMS

    weights = split_weights(seed=1)
    qkv, gate_up = expected_packed(weights)
    fused = {
        "self_attn.q_k_v_proj.weight": qkv,
        "mlp.gate_proj.weight": weights["mlp.gate_proj.weight"],
        "mlp.up_proj.weight": weights["mlp.up_proj.weight"],
        "norm.weight": weights["norm.weight"],
    }
    assert compat.load_weights(layer, iter(fused.items()), stacked=STACKED_PARAMS) == LOADED
    torch.testing.assert_close(layer.self_attn.q_k_v_proj.weight.detach(), qkv, rtol=0, atol=0)
    torch.testing.assert_close(layer.mlp.gate_up_proj.weight.detach(), gate_up, rtol=0, atol=0)
