# SPDX-License-Identifier: Apache-2.0
"""How ``Spark2_5ForCausalLM`` takes its checkpoint: the first load, and the ledger
every later update shares (those are in :mod:`spark2_5_updates`).

The first load is one ``load_weights`` call with the whole checkpoint: a
:class:`CheckpointLedger` accounts for every tensor and refuses, naming it, a
tensor with no parameter, one loaded twice, a missing one, a wrong shape or
dtype and (when asked) NaN/Inf, before vLLM's loaders see it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch import nn
from vllm.model_executor.models.utils import is_pp_missing_parameter

from vllm_spark2_5_plugin import compat
from vllm_spark2_5_plugin.spark2_5_checkpoint import (
    Spark2_5CheckpointError,
    TensorChecks,
    checkpoint_folder,
    naming_damaged_files,
    quantized_g_proj_error,
)
from vllm_spark2_5_plugin.spark2_5_names import (
    G_PROJ,
    LORA_WRAPPED,
    STACKED_PARAMS,
    checkpoint_parts,
    module_of,
    packed_target,
)

# The shard key of a parameter a checkpoint tensor fills whole.
WHOLE = "whole tensor"
# Config keys with which vLLM's classify converter derives the classifier itself.
CLASSIFIER_FROM_LM_HEAD = ("method", "classifier_from_token")

Weights = Iterable[tuple[str, torch.Tensor]]


class CheckpointLedger:
    """Accounts for every checkpoint tensor of one pipeline stage.

    A tensor with no parameter to go to, a parameter (or one shard of a packed
    one) filled twice, and a parameter left unfilled are errors that name the
    checkpoint tensors involved; so are a tensor of the wrong shape or dtype
    (checked on every stage, whichever loads it) and one holding NaN/Inf.
    """

    def __init__(
        self, model: nn.Module, skip_prefixes: tuple[str, ...], checks: TensorChecks
    ) -> None:
        self.model = model
        self.skip_prefixes = skip_prefixes
        self.checks = checks
        self.params = {
            name.replace(LORA_WRAPPED, "."): param for name, param in model.named_parameters()
        }
        self.optional = self._optional_params()
        self.filled: dict[str, dict[str | int, str]] = defaultdict(dict)
        # Module -> the parameters vLLM waits for before it processes the module.
        self.module_params: dict[str, list[str]] = defaultdict(list)
        for name in self.params:
            if name not in self.optional:
                self.module_params[module_of(name)].append(name)

    def _optional_params(self) -> set[str]:
        # An attention layer's only parameters are KV-cache quantization scales,
        # which default to 1 when a checkpoint has none.
        attention = compat.attention_cls()
        optional = {
            f"{module_name}.{param_name}"
            for module_name, module in self.model.named_modules()
            if isinstance(module, attention)
            for param_name, _ in module.named_parameters(recurse=False)
        }
        # vLLM's classify converter fills the classifier from the LM head after the
        # checkpoint is in when the config names a method or classifier tokens (the
        # LLM-as-reranker recipe); otherwise a missing score.weight is an error.
        config = getattr(self.model, "config", None)
        if any(getattr(config, key, None) is not None for key in CLASSIFIER_FROM_LM_HEAD):
            optional.update(name for name in self.params if name.startswith("score."))
        return optional

    def track(self, weights: Weights) -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in weights:
            self.check(name, tensor)
            yield name, tensor

    def check(self, name: str, tensor: torch.Tensor) -> None:
        """Refuse ``name`` unless it fits a parameter not yet filled; record it."""
        if not isinstance(tensor, torch.Tensor):
            raise Spark2_5CheckpointError(
                f"Tensor {name!r} arrived as a {type(tensor).__name__}, not a torch.Tensor. "
                "A weights_iterator sent with collective_rpc to an engine in another process "
                "arrives as plain lists: reload from weights_path, or use a weight-transfer "
                "engine, instead"
            )
        if self.skip_prefixes and name.startswith(self.skip_prefixes):
            return
        target, shard_id = packed_target(name)
        if target not in self.params:
            if is_pp_missing_parameter(target, self.model):
                self.checks.check_layout(name, tensor)
                return  # another pipeline stage loads it
            if G_PROJ in name and not name.endswith((".weight", ".bias")):
                raise quantized_g_proj_error(name)
            raise Spark2_5CheckpointError(
                f"Unexpected tensor {name!r} in the Spark2_5 checkpoint: "
                f"{type(self.model).__name__} has no parameter {target!r} for it "
                "(check the checkpoint against config.json: bias, head and layer counts)"
            )
        self.checks.check_layout(name, tensor)
        self.checks.check_values(name, tensor)
        shard = WHOLE if shard_id is None else shard_id
        filled = self.filled[target]
        if filled and (shard == WHOLE or WHOLE in filled or shard in filled):
            clash = filled.get(shard) or filled.get(WHOLE) or next(iter(filled.values()))
            raise Spark2_5CheckpointError(
                f"Checkpoint tensors {clash!r} and {name!r} both load into {target!r}; "
                "keep either the fused tensor or its parts, once"
            )
        filled[shard] = name

    def missing(self) -> list[str]:
        """The parameters (or parts of packed ones) no tensor has filled."""
        missing = []
        for target in self.params:
            filled = self.filled.get(target, {})
            if WHOLE in filled or target in self.optional:
                continue
            parts = checkpoint_parts(target)
            if not parts:
                if not filled:
                    missing.append(target)
            elif not filled:
                names = ", ".join(parts.values())
                missing.append(f"{target} (or its parts {names})")
            else:
                missing.extend(part for shard, part in parts.items() if shard not in filled)
        return missing

    def verify(self) -> None:
        missing = self.missing()
        head = [name for name in missing if name.startswith("score.")]
        if head:
            raise Spark2_5CheckpointError(
                f"The Spark2_5 checkpoint lacks its classifier head {head[0]!r}, which "
                "--convert classify reads. Serve a checkpoint that has one (a reward or "
                "classifier model), or derive it from the LM head: hf_overrides "
                '{"classifier_from_token": [<no>, <yes>], "method": "from_2_way_softmax"}'
            )
        if missing:
            raise Spark2_5CheckpointError(
                "The Spark2_5 checkpoint lacks these tensors: "
                + "; ".join(missing)
                + ". Check that it matches its config.json (layers, tie_word_embeddings, "
                "headwise_attn_output_gate)"
            )


class CheckpointLoader:
    """One model's checkpoint: its first load, and what every later load shares (the
    names as the quantization method reads them, the checks, vLLM's loader).

    ``model_config`` and ``load_config`` are vLLM's; ``reload_weights(weights_path=...)``
    repoints ``model_config.model``, so the folder is looked up when needed.
    """

    def __init__(
        self, model: nn.Module, checks: TensorChecks, model_config: Any, load_config: Any
    ) -> None:
        self.model = model
        self.checks = checks
        self.model_config = model_config
        self.load_config = load_config
        # A tied checkpoint may still carry lm_head.weight; the head is the
        # embedding, so that copy is dropped rather than written over it.
        self.skip_prefixes = ("lm_head.",) if model.config.tie_word_embeddings else ()
        self.load = partial(
            compat.load_weights,
            model,
            mapper=type(model).hf_to_vllm_mapper,
            stacked=STACKED_PARAMS,
            skip_prefixes=self.skip_prefixes,
        )
        # The folder the weights now loaded came from; None before the first load.
        self.loaded_from: str | None = None

    def folder(self) -> Path | None:
        """Where vLLM reads the weights from now, to name a damaged file."""
        config = self.model_config
        return checkpoint_folder(config.model, config.revision, self.load_config.download_dir)

    def prepare(self, weights: Weights) -> Weights:
        """``weights`` as the model's quantization method reads them (GPTQ's ``g_idx``
        never reaches the ledger), a damaged file named should reading fail."""
        weights = naming_damaged_files(weights, self.folder)
        return compat.quantized_checkpoint_names(self.model.quant_config, weights)

    def ledger(self, checks: TensorChecks | None = None) -> CheckpointLedger:
        return CheckpointLedger(self.model, self.skip_prefixes, checks or self.checks)

    def checked(self, ledger: CheckpointLedger, weights: Weights) -> Weights:
        """``weights`` as they load, each checked by ``ledger``: a list (one bucket)
        whole before any of it loads, anything else tensor by tensor."""
        if isinstance(weights, (list, tuple)):
            weights = list(self.prepare(weights))
            for name, tensor in weights:
                ledger.check(name, tensor)
            return weights
        return ledger.track(self.prepare(weights))

    def load_first(self, weights: Weights) -> set[str]:
        """The first ``load_weights`` call: the whole checkpoint, every tensor accounted for."""
        ledger = self.ledger()
        loaded = self.load(ledger.track(self.prepare(weights)))
        ledger.verify()
        self.loaded_from = self.model_config.model
        return loaded
