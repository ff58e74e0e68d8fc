# SPDX-License-Identifier: Apache-2.0
"""How ``Spark2_5ForCausalLM`` takes its weights: the first load, then in-place updates.

**First load** (one ``load_weights`` call with the whole checkpoint): a
:class:`CheckpointLedger` accounts for every tensor and refuses, naming it, a
tensor with no parameter, one loaded twice, a missing one, a wrong shape or
dtype and (when asked) NaN/Inf.

**Updates** (every later call): vLLM updates weights in place inside a layerwise
reload session (``reload_weights``; the weight-transfer engines'
``start_weight_update`` / ``update_weights`` / ``finish_weight_update``). Such a
session may call ``load_weights`` once with everything or once per tensor or
bucket, so one ledger spans the session:

* every pushed tensor gets the first load's checks, and one pushed twice in a
  session is refused; a call whose tensors come as a list is checked whole
  before any of it loads, and so is a reload from another folder (from its
  files' headers), so a refused push or folder changes nothing;
* a layer's tensors (the parts of a packed parameter, a quantized layer's weight
  and scales) are held until all have arrived: vLLM would otherwise finish a
  layer pushed in part with uninitialised memory for the rest;
* where vLLM computes with copies of the weights (its CPU linears), a tied head
  is reloaded with the embedding, else its copy of the old embedding would keep
  computing the logits;
* when vLLM finishes the session, what it did not update is logged by name (it
  keeps its previous values);
* a refused tensor ends the session at once the way vLLM's own finish does
  (layers loaded before it serve the new weights, the others their previous
  ones). The rest of the session is received and dropped, so a trainer that
  broadcasts its buckets is never left waiting, and the error is raised when
  vLLM finishes the session.

Outside a session, a loaded model takes pushes directly, as vLLM's own models do
for TRL- or OpenRLHF-style worker extensions, where vLLM computes with the
parameters themselves (checked tensor by tensor, a refused list loading
nothing). Where it computes with copies made when loading finished (its CPU
linears, quantized layers), writing into the parameters would change nothing:
there a direct push is refused, naming the calls to use.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from functools import partial
from itertools import islice
from pathlib import Path
from typing import Any, TypeVar

import torch
from torch import nn
from vllm.model_executor.models.utils import is_pp_missing_parameter

from vllm_spark2_5_plugin import compat, host_hooks
from vllm_spark2_5_plugin.spark2_5_checkpoint import (
    Spark2_5CheckpointError,
    TensorChecks,
    described_tensors,
    naming_damaged_files,
    quantized_g_proj_error,
)
from vllm_spark2_5_plugin.spark2_5_names import (
    EMBEDDING,
    LORA_WRAPPED,
    STACKED_PARAMS,
    checkpoint_parts,
    packed_target,
)

_WHOLE = "whole tensor"
# Config keys with which vLLM's classify converter derives the classifier itself.
CLASSIFIER_FROM_LM_HEAD = ("method", "classifier_from_token")
NAMED = 8  # how many tensors an error or warning about a push names

logger = logging.getLogger("vllm.spark2_5_plugin")

Weights = Iterable[tuple[str, torch.Tensor]]
ModelT = TypeVar("ModelT", bound=nn.Module)


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
        # An attention layer's only parameters are KV-cache quantization scales,
        # which default to 1 when a checkpoint has none.
        attention = compat.attention_cls()
        self.optional = {
            f"{module_name}.{param_name}"
            for module_name, module in model.named_modules()
            if isinstance(module, attention)
            for param_name, _ in module.named_parameters(recurse=False)
        }
        # vLLM's classify converter fills the classifier from the LM head after the
        # checkpoint is in when the config names a method or classifier tokens (the
        # LLM-as-reranker recipe); otherwise a missing score.weight is an error.
        config = getattr(model, "config", None)
        if any(getattr(config, key, None) is not None for key in CLASSIFIER_FROM_LM_HEAD):
            self.optional.update(name for name in self.params if name.startswith("score."))
        self.filled: dict[str, dict[str | int, str]] = defaultdict(dict)
        # Module -> the parameters vLLM waits for before it processes the module.
        self.module_params: dict[str, list[str]] = defaultdict(list)
        for name in self.params:
            if name not in self.optional:
                self.module_params[module_of(name)].append(name)

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
            if ".g_proj." in name and not name.endswith((".weight", ".bias")):
                raise quantized_g_proj_error(name)
            raise Spark2_5CheckpointError(
                f"Unexpected tensor {name!r} in the Spark2_5 checkpoint: "
                f"{type(self.model).__name__} has no parameter {target!r} for it "
                "(check the checkpoint against config.json: bias, head and layer counts)"
            )
        self.checks.check_layout(name, tensor)
        self.checks.check_values(name, tensor)
        shard = _WHOLE if shard_id is None else shard_id
        filled = self.filled[target]
        if filled and (shard == _WHOLE or _WHOLE in filled or shard in filled):
            clash = filled.get(shard) or filled.get(_WHOLE) or next(iter(filled.values()))
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
            if _WHOLE in filled or target in self.optional:
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


OUTSIDE_SESSION = (
    "Spark2_5 weights were pushed with load_weights outside vLLM's layerwise reload, "
    "and this engine computes with copies of its weights made when loading finished "
    "({why}): writing into the parameters would not change them. Update it with vLLM's "
    "reload_weights (LLM.collective_rpc('reload_weights', kwargs={{'weights_path': ...}} "
    "or {{'weights_iterator': [...]}})), with a weight-transfer engine "
    "(start_weight_update, update_weights, finish_weight_update), or between "
    "initialize_layerwise_reload(model) and finalize_layerwise_reload(model, model_config) "
    "from vllm.model_executor.model_loader.reload. Tensors pushed: {names}"
)


class RefusedUpdate(Spark2_5CheckpointError):
    """A weight update that refused one of its tensors, raised when vLLM finishes it."""


class WeightIntake:
    """The weights one model takes: its first load, then every update session.

    ``folder`` is where vLLM reads them from now; ``model_config`` is what vLLM
    finishes a session with. The model's ``hf_to_vllm_mapper`` routes checkpoint
    names to parameters, as in vLLM's own models.
    """

    def __init__(
        self,
        model: nn.Module,
        checks: TensorChecks,
        folder: Callable[[], Path | None],
        model_config: Any,
        computes_with_copies: bool,
    ) -> None:
        self.model = model
        self.checks = checks
        self.folder = folder
        self.model_config = model_config
        # reload_weights(weights_path=...) repoints model_config.model before the
        # session starts: a session that finds it changed reads another folder.
        self.loaded_from: str | None = None
        self.folder_unchecked = False
        # A tied checkpoint may still carry lm_head.weight; the head is the
        # embedding, so that copy is dropped rather than written over it.
        self.skip_prefixes = ("lm_head.",) if model.config.tie_word_embeddings else ()
        # Where vLLM's layers compute with copies of their weights, a reloaded
        # embedding must reach the tied head's copy too, and a direct push cannot.
        self.reload_tied_head = computes_with_copies and bool(self.skip_prefixes)
        self.copies = (
            "vLLM's CPU linear layers"
            if computes_with_copies
            else "quantized layers"
            if checks.quantized
            else None
        )
        self.load: Callable[[Weights], set[str]] = partial(
            compat.load_weights,
            model,
            mapper=type(model).hf_to_vllm_mapper,
            stacked=STACKED_PARAMS,
            skip_prefixes=self.skip_prefixes,
        )
        self.first_load_done = False
        self.session: CheckpointLedger | None = None
        # The error of a session that refused a tensor, until vLLM finishes it.
        self.refused: RefusedUpdate | None = None
        # Else an int8 layer reloaded on a CPU without AMX computes with freed scales.
        host_hooks.keep_onednn_int8_scales(model)
        # Module -> parameter -> the tensors (shards) pushed so far in this session,
        # held back until the module is whole.
        self.held: dict[str, dict[str, dict[str | int, tuple[str, torch.Tensor]]]] = {}

    def prepare(self, weights: Weights) -> Weights:
        """``weights`` as the model's quantization method reads them (GPTQ's ``g_idx``
        never reaches the ledger), a damaged file named should reading fail."""
        weights = naming_damaged_files(weights, self.folder)
        return compat.quantized_checkpoint_names(self.model.quant_config, weights)

    def ledger(self) -> CheckpointLedger:
        return CheckpointLedger(self.model, self.skip_prefixes, self.checks)

    def take(self, weights: Weights) -> set[str]:
        """What the model's ``load_weights`` does with ``weights``."""
        if self.first_load_done:
            return self.update(weights)
        ledger = self.ledger()
        loaded = self.load(ledger.track(self.prepare(weights)))
        ledger.verify()
        self.first_load_done = True
        self.loaded_from = self.model_config.model
        return loaded

    def checked(self, ledger: CheckpointLedger, weights: Weights) -> Weights:
        """``weights`` as they load, each checked by ``ledger``: a list (one bucket)
        whole before any of it loads, anything else tensor by tensor."""
        if isinstance(weights, (list, tuple)):
            weights = list(self.prepare(weights))
            for name, tensor in weights:
                ledger.check(name, tensor)
            return weights
        return ledger.track(self.prepare(weights))

    def update(self, weights: Weights) -> set[str]:
        """One ``load_weights`` call after the first load."""
        if self.refused is not None:
            _drain(weights)  # the rest of a refused session: received, not loaded
            return set()
        if host_hooks.in_layerwise_reload(self.model):
            return self.session_push(weights)
        if self.copies is None:
            return self.load(self.checked(self.ledger(), weights))
        names = [name for name, _ in islice(weights, NAMED)]
        raise Spark2_5CheckpointError(
            OUTSIDE_SESSION.format(why=self.copies, names=", ".join(names))
        )

    def session_push(self, weights: Weights) -> set[str]:
        """One ``load_weights`` call of an update session."""
        if self.session is None:
            # Made at the session's first push, not when it starts: only now has
            # vLLM put every layer back in the form it loads in. A kernel may have
            # dropped a parameter after the first load (the oneDNN int8 kernel
            # vLLM picks on CPUs without AMX releases ``weight``; CPUWNA16 drops
            # symmetric GPTQ's ``qzeros``).
            self.session = self.ledger()
        try:
            if not isinstance(weights, (list, tuple)):
                self._check_new_folder()  # nothing of a refused folder is read
        except Spark2_5CheckpointError as error:
            self._refuse(error)
            return set()
        try:
            return self._load_update(self.checked(self.session, weights))
        except Exception as error:  # any failure ends the session; vLLM's finish raises it
            self._refuse(error)
            _drain(weights)
            return set()

    def _refuse(self, error: Exception) -> None:
        self.session = None
        self.held.clear()
        host_hooks.finalize_layerwise_reload(self.model, self.model_config)
        self.refused = RefusedUpdate(
            f"Spark2_5 refused this weight update: {error}. Layers loaded before the "
            "refusal serve the new weights, the others keep their previous ones; the rest "
            "of the update was received and dropped. Push the update again, corrected"
        )
        self.refused.__cause__ = error
        logger.error("%s", self.refused)

    def raise_refusal(self) -> None:
        """Raise the error of a refused session, once: vLLM is finishing it."""
        refused, self.refused = self.refused, None
        if refused is not None:
            raise refused

    def _load_update(self, weights: Weights) -> set[str]:
        embedding: list[torch.Tensor] = []
        loaded = self.load(self._whole_modules(weights, embedding))
        head = getattr(getattr(self.model, "lm_head", None), "weight", None)
        if embedding and self.reload_tied_head and head is not None:
            head.weight_loader(head, embedding[-1])
        return loaded

    def _whole_modules(
        self, weights: Weights, embedding: list[torch.Tensor]
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """``weights`` with each module's tensors held until all its parameters (every
        part of a packed one) have come: vLLM finishes an update's incomplete modules
        with uninitialised memory for the rest."""
        needs = self.session.module_params if self.session is not None else {}
        for name, tensor in weights:
            if name == EMBEDDING:
                embedding.append(tensor)
            target, shard_id = packed_target(name)
            module = module_of(target)
            params = needs.get(module, [])
            if shard_id is None and params in ([], [target]):
                yield name, tensor
                continue
            held = self.held.setdefault(module, {})
            held.setdefault(target, {})[_WHOLE if shard_id is None else shard_id] = (name, tensor)
            if all(_filled(param, held.get(param, {})) for param in params):
                del self.held[module]
                for parts in held.values():
                    yield from parts.values()

    def _check_new_folder(self) -> None:
        """In a reload from another folder, refuse a tensor the model would refuse
        (name, shape, dtype, twice) from the files' headers, before any tensor loads:
        the engine then keeps serving its previous weights, none of the folder's."""
        if not self.folder_unchecked:
            return
        self.folder_unchecked = False
        described = described_tensors(self.folder())
        if described is None:
            return
        layout = TensorChecks(self.checks.config, self.checks.quantized, check_finite=False)
        ledger = CheckpointLedger(self.model, self.skip_prefixes, layout)
        for name, tensor in self.prepare(described):
            ledger.check(name, tensor)

    def session_started(self) -> None:
        self.session = None
        self.held.clear()
        self.folder_unchecked = self.model_config.model != self.loaded_from

    def session_finishing(self) -> None:
        """vLLM is about to finish the session: say what it leaves as it was."""
        if self.session is None:
            return
        session, self.session = self.session, None
        self.loaded_from = self.model_config.model
        partial = [
            f"{module} (pushed only "
            f"{', '.join(name for parts in held.values() for name, _ in parts.values())})"
            for module, held in self.held.items()
        ]
        self.held.clear()
        if partial:
            logger.warning(
                "Spark2_5 weight update: these layers got only some of their tensors and "
                "keep their previous values whole: %s",
                "; ".join(partial),
            )
        # Not a warning: a partial update is allowed, and an engine may write some
        # tensors itself (NCCL M2N's direct entries) without load_weights.
        missing = session.missing()
        if missing:
            more = len(missing) - NAMED
            logger.info(
                "Spark2_5 weight update: %d tensors did not come through load_weights and "
                "keep their previous values unless the transfer engine wrote them: %s%s",
                len(missing),
                "; ".join(missing[:NAMED]),
                f" and {more} more" if more > 0 else "",
            )


def module_of(param: str) -> str:
    """The module a parameter (or checkpoint tensor) name belongs to."""
    return param.rpartition(".")[0]


def _filled(param: str, shards: dict[str | int, Any]) -> bool:
    """Whether ``shards`` fill ``param``: whole, or every part of a packed one."""
    parts = checkpoint_parts(param)
    return _WHOLE in shards or (bool(parts) and parts.keys() <= shards.keys())


def _drain(weights: Weights) -> None:
    """Take what is left of ``weights`` without loading it: a sender that streams
    them (a broadcast) finishes sending instead of waiting for a receiver."""
    if isinstance(weights, (list, tuple)):
        return
    try:
        for _ in weights:
            pass
    except Exception:  # a damaged source stops here; the refusal is what is reported
        logger.debug("Spark2_5: the rest of a refused update could not be read", exc_info=True)


def watch_update_sessions(model_cls: type[ModelT]) -> type[ModelT]:
    """Class decorator: tell each model's ``weight_intake`` when vLLM starts and
    finishes a layerwise reload of it, through the attribute both steps set on it."""
    stored = f"_spark2_5{host_hooks.LAYERWISE_RELOAD_ATTRIBUTE}"

    def get(model: nn.Module) -> Any:
        return model.__dict__.get(stored, False)

    def set_(model: nn.Module, value: Any) -> None:
        model.__dict__[stored] = value
        intake: WeightIntake = model.weight_intake
        if host_hooks.in_layerwise_reload(model):
            intake.session_finishing()
        elif intake.refused is not None:
            intake.raise_refusal()  # vLLM finishes the session the refusal ended
        else:
            intake.session_started()

    setattr(model_cls, host_hooks.LAYERWISE_RELOAD_ATTRIBUTE, property(get, set_))
    return model_cls
