# SPDX-License-Identifier: Apache-2.0
"""Loading packed parameters on vLLM 0.23 and 0.24, whose ``WeightsMapper`` cannot
route a checkpoint name into one shard of a packed parameter: each stacked tensor
goes to ``param.weight_loader(param, tensor, shard_id)`` here, those releases' idiom.

Delete this module, and its call in ``compat.load_weights``, when the verified
range starts at 0.25.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any


def load_weights(
    loader: Any,
    module: Any,
    weights: Iterable[tuple[str, Any]],
    mapper: Any,
    stacked: Mapping[str, tuple[str, str | int]],
) -> set[str]:
    """Load the stacked ``weights`` shard by shard into ``module``'s packed parameters,
    the rest through ``loader`` (vLLM's ``AutoWeightsLoader``) with ``mapper``; tensors
    that are not stacked (a fused ``q_k_v_proj``) load with no shard id."""
    from vllm.model_executor.models.utils import is_pp_missing_parameter

    params = dict(module.named_parameters())
    stacked_loaded: set[str] = set()

    def load_stacked_yield_rest() -> Iterable[tuple[str, Any]]:
        for name, tensor in weights:
            for part, (packed_part, shard_id) in stacked.items():
                if part in name:
                    target = name.replace(part, packed_part, 1)
                    if not is_pp_missing_parameter(target, module):
                        param = params[target]
                        param.weight_loader(param, tensor, shard_id)
                        stacked_loaded.add(target)
                    break
            else:
                yield name, tensor

    rest_loaded = loader.load_weights(load_stacked_yield_rest(), mapper=mapper)
    return stacked_loaded | set(rest_loaded)
