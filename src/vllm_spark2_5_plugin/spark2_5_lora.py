# SPDX-License-Identifier: Apache-2.0
"""What a LoRA adapter must be before vLLM puts it into a Spark2_5 model.

vLLM copies each adapter tensor into the leading rows and columns of its
per-slot LoRA buffers, so an adapter whose ``lora_A`` has fewer rows than its
``adapter_config.json`` rank, or whose fused ``q_k_v_proj`` ``lora_B`` lacks a
row, is applied silently to the wrong part of the projection; one holding NaN
or infinity makes its requests compute NaN. The carrier knows every module's
shape, so it refuses such an adapter when vLLM adds it, naming the tensor as
the adapter file holds it, its shape and the expected one.

Modules whose ``lora_B`` is all zeros add nothing to any output and are not
shape-checked: vLLM's own warm-up adapters are such, sized to each
tensor-parallel rank's part. Already packed weights (lists) come from vLLM,
not from a file.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from vllm_spark2_5_plugin.spark2_5_checkpoint import has_non_finite, non_finite_counts
from vllm_spark2_5_plugin.spark2_5_names import (
    CHECKPOINT_SHAPES,
    EMBEDDING,
    EMBEDDING_MODULE,
    LAYER_PREFIX,
    LM_HEAD,
    module_of,
)

if TYPE_CHECKING:
    from vllm_spark2_5_plugin.spark2_5_config import Spark2_5Config

PEFT_PREFIX = "base_model.model."
# vLLM module name -> the weight whose (out, in) shape the adapter's pair spans.
_WHOLE_MODEL_WEIGHTS = {module_of(weight): weight for weight in (EMBEDDING, LM_HEAD)}


class Spark2_5LoRAError(ValueError):
    """A LoRA adapter that does not fit the served Spark2_5 model; the message names
    the tensor."""


class AdapterChecks:
    """Shape and value checks of vLLM's ``LoRAModel`` objects against one config."""

    def __init__(self, config: Spark2_5Config) -> None:
        self.config = config

    def check(self, lora_model: Any) -> None:
        """Raise :class:`Spark2_5LoRAError` for the first module of ``lora_model`` (vLLM's
        ``LoRAModel``) whose tensors are mis-shaped or not finite."""
        for module, weights in lora_model.loras.items():
            if not (torch.is_tensor(weights.lora_a) and torch.is_tensor(weights.lora_b)):
                continue  # packed by vLLM itself
            self._check_values(module, weights)
            if weights.lora_b.any():
                self._check_shapes(module, weights)

    def _module_shape(self, module: str) -> tuple[list[int], str]:
        """The ``[out, in]`` of ``module``'s weight and how the config implies it."""
        weight = _WHOLE_MODEL_WEIGHTS.get(module)
        if weight is None:
            match = LAYER_PREFIX.match(module)
            if match is None:
                raise Spark2_5LoRAError(
                    f"LoRA adapter module {module!r} is not a module of Spark2_5"
                )
            layer = int(match.group(1))
            if layer >= self.config.num_hidden_layers:
                raise Spark2_5LoRAError(
                    f"LoRA adapter tensor {_tensor_name(module, 'A')!r} targets layer {layer}, "
                    f"but the model has num_hidden_layers={self.config.num_hidden_layers}: the "
                    "adapter was trained for another model"
                )
            weight = "layers." + module[match.end() :] + ".weight"
        dims = CHECKPOINT_SHAPES.get(weight)
        if dims is None:
            raise Spark2_5LoRAError(f"LoRA adapter module {module!r} is not a module of Spark2_5")
        if module == EMBEDDING_MODULE:  # PEFT's lora_embedding_A is [r, vocab], B [hidden, r]
            dims = dims[::-1]
        out_features, in_features = (dim.size(self.config) for dim in dims)
        return [out_features, in_features], ", ".join(dim.formula for dim in dims)

    def _check_shapes(self, module: str, weights: Any) -> None:
        (out_features, in_features), implied = self._module_shape(module)
        rank = weights.rank
        for side, tensor, expected in (
            ("A", weights.lora_a, [rank, in_features]),
            ("B", weights.lora_b, [out_features, rank]),
        ):
            if list(tensor.shape) != expected:
                raise Spark2_5LoRAError(
                    f"LoRA adapter tensor {_tensor_name(module, side)!r} has shape "
                    f"{list(tensor.shape)}, expected {expected}: rank {rank} (r or "
                    "rank_pattern in adapter_config.json) and the module's [out, in] = "
                    f"[{implied}] = [{out_features}, {in_features}]. The adapter does not "
                    "match its config or was trained for another model"
                )

    def _check_values(self, module: str, weights: Any) -> None:
        for side, tensor in (("A", weights.lora_a), ("B", weights.lora_b)):
            if has_non_finite(tensor):
                raise Spark2_5LoRAError(
                    f"LoRA adapter tensor {_tensor_name(module, side)!r} "
                    f"{non_finite_counts(tensor)}; every request through it would compute "
                    "NaN. The adapter is damaged: re-export it"
                )


def _tensor_name(module: str, side: str) -> str:
    """The PEFT name of ``module``'s ``lora_A``/``lora_B`` (``side`` "A" or "B")."""
    if module == EMBEDDING_MODULE:
        return f"{PEFT_PREFIX}{module}.lora_embedding_{side}"
    return f"{PEFT_PREFIX}{module}.lora_{side}.weight"
