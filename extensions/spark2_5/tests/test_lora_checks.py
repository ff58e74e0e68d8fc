"""The carrier's LoRA adapter checks on vLLM's own ``LoRAModel``, read from PEFT
adapters as vLLM reads them: a good adapter passes; any one tensor of another
shape, holding NaN/Inf, or aimed at a layer the model lacks is refused naming it.
The serving side (vLLM calling the checks, the other requests unchanged) is
``test_lora_faults_serve.py``."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from spark2_5_dev import lora
from spark2_5_dev.checkpoints import spark2_5_config_dict
from vllm_spark2_5_plugin.spark2_5_config import Spark2_5Config
from vllm_spark2_5_plugin.spark2_5_lora import AdapterChecks, Spark2_5LoRAError

CONFIG = spark2_5_config_dict()
RANK = 4


def good_tensors(seed: int = 0) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    shapes = lora.linear_shapes(CONFIG)
    tensors = {}
    for layer in range(CONFIG["num_hidden_layers"]):
        for target in lora.LINEAR_TARGETS:
            out_features, in_features = shapes[target]
            name = lora.PEFT_PREFIX + lora.module_name(layer, target)
            tensors[f"{name}.lora_A.weight"] = torch.randn(RANK, in_features, generator=generator)
            tensors[f"{name}.lora_B.weight"] = torch.randn(out_features, RANK, generator=generator)
    embedding = lora.PEFT_PREFIX + lora.EMBEDDING
    tensors[f"{embedding}.lora_embedding_A"] = torch.randn(RANK, CONFIG["vocab_size"])
    tensors[f"{embedding}.lora_embedding_B"] = torch.randn(CONFIG["hidden_size"], RANK)
    return tensors


def vllm_lora_model(tensors: dict[str, torch.Tensor]):
    """The ``LoRAModel`` vLLM builds from these PEFT tensors (rank RANK, alpha 8)."""
    from vllm.lora.lora_model import LoRAModel
    from vllm.lora.peft_helper import PEFTHelper

    helper = PEFTHelper.from_dict({"r": RANK, "lora_alpha": 8, "target_modules": ["q_k_v_proj"]})
    return LoRAModel.from_lora_tensors(1, tensors, helper, device="cpu")


@pytest.fixture(scope="module")
def checks() -> AdapterChecks:
    return AdapterChecks(Spark2_5Config(**CONFIG))


NAMES = sorted(good_tensors())


def test_a_good_adapter_passes(checks):
    checks.check(vllm_lora_model(good_tensors()))


@settings(max_examples=40, deadline=None)
@given(name=st.sampled_from(NAMES), dim=st.integers(0, 1), delta=st.sampled_from([-1, 1, 3]))
def test_any_tensor_of_another_shape_is_refused_naming_it(checks, name, dim, delta):
    tensors = good_tensors()
    shape = list(tensors[name].shape)
    shape[dim] += delta
    tensors[name] = torch.ones(shape)
    with pytest.raises(Spark2_5LoRAError) as error:
        checks.check(vllm_lora_model(tensors))
    assert f"tensor {name!r} has shape {shape}, expected" in str(error.value)


@settings(max_examples=20, deadline=None)
@given(name=st.sampled_from(NAMES), value=st.sampled_from([float("nan"), float("inf")]))
def test_a_tensor_holding_nan_or_inf_is_refused_naming_it(checks, name, value):
    tensors = good_tensors()
    tensors[name].view(-1)[7] = value
    with pytest.raises(Spark2_5LoRAError) as error:
        checks.check(vllm_lora_model(tensors))
    assert f"tensor {name!r} holds" in str(error.value)


def test_an_adapter_for_a_deeper_model_is_refused_naming_the_layer(checks):
    tensors = good_tensors()
    for name in [n for n in tensors if ".layers.0." in n]:
        tensors[name.replace(".layers.0.", ".layers.9.")] = tensors[name]
    with pytest.raises(Spark2_5LoRAError, match=r"targets layer 9, but .* num_hidden_layers=4"):
        checks.check(vllm_lora_model(tensors))


def test_zero_lora_b_of_another_shape_passes_as_it_changes_nothing(checks):
    """vLLM's warm-up adapters: zeros, sized to one tensor-parallel rank's part."""
    tensors = {n: t for n, t in good_tensors().items() if ".layers.0.self_attn.q_k_v" in n}
    for name in tensors:
        tensors[name] = torch.zeros(tensors[name].shape[0] // 2, tensors[name].shape[1])
    checks.check(vllm_lora_model(tensors))


def test_a_lora_manager_without_add_adapter_gets_no_checks():
    """A vLLM whose manager lacks ``_add_adapter``: nothing to wrap, and the model warns."""
    from vllm_spark2_5_plugin import host_hooks

    assert host_hooks.check_lora_adapters(object(), AdapterChecks.check) is False
