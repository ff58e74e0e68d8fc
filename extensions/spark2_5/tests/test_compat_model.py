"""The model-side helpers of ``compat``: each one against the installed vLLM and
against a stand-in with the API shape of an older release."""

from __future__ import annotations

import dataclasses
import types
from dataclasses import field

import pytest
import torch

from spark2_5_dev.model_building import vllm_model_env
from spark2_5_dev.older_vllm import WeightsMapperWithoutStacking, use_older_weight_loading
from spark2_5_dev.packed_layer import HEAD_DIM, LOADED, Layer, expected_packed, split_weights
from vllm_spark2_5_plugin import compat, cpu_platform

__all__ = ["vllm_model_env"]  # the fixture, for pytest


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
    from vllm_spark2_5_plugin.spark2_5_names import STACKED_PARAMS

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
    from vllm_spark2_5_plugin.spark2_5_names import STACKED_PARAMS

    assert compat.stacked_weights_mapper(STACKED_PARAMS) == WeightsMapperWithoutStacking()


@pytest.fixture
def layer(vllm_model_env):
    from vllm.config import VllmConfig, set_current_vllm_config

    with set_current_vllm_config(VllmConfig()):
        return Layer()


@pytest.mark.parametrize("api", ["installed", "older"])
def test_load_weights_fills_packed_shards_and_drops_skipped_names(layer, request, api):
    if api == "older":
        request.getfixturevalue("older_vllm")
    from vllm_spark2_5_plugin.spark2_5_names import STACKED_PARAMS

    weights = split_weights(seed=0)
    stray = {"lm_head.weight": torch.zeros(3)}  # would fail to load if it reached the loader
    names = compat.load_weights(
        layer,
        iter({**weights, **stray}.items()),
        mapper=compat.stacked_weights_mapper(STACKED_PARAMS),
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
    from vllm_spark2_5_plugin.spark2_5_names import STACKED_PARAMS

    weights = split_weights(seed=1)
    qkv, gate_up = expected_packed(weights)
    fused = {
        "self_attn.q_k_v_proj.weight": qkv,
        "mlp.gate_proj.weight": weights["mlp.gate_proj.weight"],
        "mlp.up_proj.weight": weights["mlp.up_proj.weight"],
        "norm.weight": weights["norm.weight"],
    }
    assert (
        compat.load_weights(
            layer,
            iter(fused.items()),
            mapper=compat.stacked_weights_mapper(STACKED_PARAMS),
            stacked=STACKED_PARAMS,
        )
        == LOADED
    )
    torch.testing.assert_close(layer.self_attn.q_k_v_proj.weight.detach(), qkv, rtol=0, atol=0)
    torch.testing.assert_close(layer.mlp.gate_up_proj.weight.detach(), gate_up, rtol=0, atol=0)


# --- LoRA and quantization hooks ------------------------------------------------------


def test_vllm_sees_the_model_as_supporting_lora_and_pipeline_parallelism():
    from vllm.model_executor.models.interfaces import supports_lora, supports_pp

    from vllm_spark2_5_plugin.spark2_5 import Spark2_5ForCausalLM

    assert supports_lora(Spark2_5ForCausalLM) and supports_pp(Spark2_5ForCausalLM)


def test_quantized_checkpoint_names_follow_the_quantization_methods_mapper():
    weights = [("a.qweight", 1), ("a.g_idx", 2)]

    class DropsGIdx:
        def get_checkpoint_weight_mapper(self):
            return types.SimpleNamespace(
                apply=lambda items: ((n, t) for n, t in items if not n.endswith(".g_idx"))
            )

    assert list(compat.quantized_checkpoint_names(DropsGIdx(), iter(weights))) == weights[:1]
    # Without quantization, or a method without the hook (older releases): unchanged.
    assert list(compat.quantized_checkpoint_names(None, iter(weights))) == weights
    assert list(compat.quantized_checkpoint_names(object(), iter(weights))) == weights


def test_the_finite_kv_guard_is_on_exactly_where_the_attention_reads_stale_slots():
    """On vLLM's CPU build (these tests) the guard is on; cpu_platform decides."""
    from vllm.platforms import current_platform

    assert current_platform.is_cpu()
    assert cpu_platform.attention_reads_stale_kv_slots() is True


# --- the weight-update mode (VLLM_RELOAD_MODE, 0.34) ----------------------------------


@pytest.mark.parametrize("mode", ["layerwise", "direct"])
def test_the_mode_is_the_one_vllms_own_reload_runs(mode, monkeypatch):
    """The carrier refuses exactly when vLLM's reload lifecycle would reload directly
    (read in vLLM's own ``direct_reload_enabled``, no engine needed, so engine-free runs
    check it on a release whose engine cannot start here); before 0.34 the variable is
    ignored, as vLLM ignores it."""
    monkeypatch.setenv("VLLM_RELOAD_MODE", mode)
    try:
        from vllm.model_executor.model_loader.reload.direct import direct_reload_enabled
    except ImportError:  # 0.23 to 0.33: layerwise only
        assert compat.weight_update_mode() == "layerwise"
        return
    assert compat.weight_update_mode() == ("direct" if direct_reload_enabled() else "layerwise")
    assert compat.weight_update_mode() == mode


@pytest.mark.parametrize("mode", ["layerwise", "direct"])
def test_only_the_direct_mode_is_refused(mode):
    from vllm_spark2_5_plugin.spark2_5_engine_checks import refuse_direct_weight_updates

    if mode == "layerwise":
        refuse_direct_weight_updates(mode)
        return
    with pytest.raises(ValueError, match="use_load_plan needs it"):
        refuse_direct_weight_updates(mode)
