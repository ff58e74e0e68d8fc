"""Stand-ins for the weight-loading API of vLLM releases before 0.25, for compat tests."""

from __future__ import annotations

import dataclasses
import types
from dataclasses import field

from vllm_spark2_5_plugin import compat


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
