# SPDX-License-Identifier: Apache-2.0
"""In-place weight updates of a loaded ``Spark2_5ForCausalLM``: every ``load_weights``
call after the first load (:mod:`spark2_5_loading`).

vLLM updates weights in place inside a layerwise reload session
(``reload_weights``; the weight-transfer engines' ``start_weight_update`` /
``update_weights`` / ``finish_weight_update``). Such a session may call
``load_weights`` once with everything or once per tensor or bucket, so one ledger
spans the session:

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
there a direct push is refused, naming the calls to use. :mod:`host_hooks` tells
this module when vLLM starts and finishes a session.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from itertools import islice
from typing import Any

import torch

from vllm_spark2_5_plugin import host_hooks
from vllm_spark2_5_plugin.spark2_5_checkpoint import (
    Spark2_5CheckpointError,
    TensorChecks,
    described_tensors,
)
from vllm_spark2_5_plugin.spark2_5_loading import (
    WHOLE,
    CheckpointLedger,
    CheckpointLoader,
    Weights,
)
from vllm_spark2_5_plugin.spark2_5_names import (
    EMBEDDING,
    checkpoint_parts,
    module_of,
    packed_target,
)

NAMED = 8  # how many tensors an error or warning about a push names
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

logger = logging.getLogger("vllm.spark2_5_plugin")


class RefusedUpdate(Spark2_5CheckpointError):
    """A weight update that refused one of its tensors, raised when vLLM finishes it."""


class WeightUpdates:
    """Every ``load_weights`` call after ``checkpoint``'s first load.

    ``computes_with_copies``: vLLM's layers compute with copies of their weights
    made when loading finished (its CPU linears), so a reloaded embedding must
    reach the tied head's copy too, and a direct push cannot work.
    """

    def __init__(self, checkpoint: CheckpointLoader, computes_with_copies: bool) -> None:
        self.checkpoint = checkpoint
        self.model = checkpoint.model
        self.reload_tied_head = computes_with_copies and bool(checkpoint.skip_prefixes)
        self.copies = (
            "vLLM's CPU linear layers"
            if computes_with_copies
            else "quantized layers"
            if checkpoint.checks.quantized
            else None
        )
        self.session: CheckpointLedger | None = None
        # A reload from another folder (reload_weights(weights_path=...)) is checked
        # from its headers before any of it loads.
        self.folder_unchecked = False
        # The error of a session that refused a tensor, until vLLM finishes it.
        self.refused: RefusedUpdate | None = None
        # Module -> parameter -> the tensors (shards) pushed so far in this session,
        # held back until the module is whole.
        self.held: dict[str, dict[str, dict[str | int, tuple[str, torch.Tensor]]]] = {}

    def take(self, weights: Weights) -> set[str]:
        """One ``load_weights`` call after the first load."""
        if self.refused is not None:
            _drain(weights)  # the rest of a refused session: received, not loaded
            return set()
        if host_hooks.in_layerwise_reload(self.model):
            return self._session_push(weights)
        if self.copies is None:
            return self.checkpoint.load(self.checkpoint.checked(self.checkpoint.ledger(), weights))
        names = [name for name, _ in islice(weights, NAMED)]
        raise Spark2_5CheckpointError(
            OUTSIDE_SESSION.format(why=self.copies, names=", ".join(names))
        )

    def layerwise_reload_step(self, inside: bool) -> None:
        """vLLM is starting (``inside`` False) or finishing (True) a layerwise reload
        of the model; a session this carrier refused is finishing once vLLM, after
        the refusal's own finish, finishes it again."""
        if inside:
            self._session_finishing()
        elif self.refused is not None:
            refused, self.refused = self.refused, None
            raise refused
        else:
            self._session_started()

    def _session_push(self, weights: Weights) -> set[str]:
        if self.session is None:
            # Made at the session's first push, not when it starts: only now has
            # vLLM put every layer back in the form it loads in. A kernel may have
            # dropped a parameter after the first load (the oneDNN int8 kernel
            # vLLM picks on CPUs without AMX releases ``weight``; CPUWNA16 drops
            # symmetric GPTQ's ``qzeros``).
            self.session = self.checkpoint.ledger()
        try:
            if not isinstance(weights, (list, tuple)):
                self._check_new_folder()  # nothing of a refused folder is read
        except Spark2_5CheckpointError as error:
            self._refuse(error)
            return set()
        try:
            return self._load(self.checkpoint.checked(self.session, weights))
        except Exception as error:  # any failure ends the session; vLLM's finish raises it
            self._refuse(error)
            _drain(weights)
            return set()

    def _refuse(self, error: Exception) -> None:
        self.session = None
        self.held.clear()
        host_hooks.finalize_layerwise_reload(self.model, self.checkpoint.model_config)
        self.refused = RefusedUpdate(
            f"Spark2_5 refused this weight update: {error}. Layers loaded before the "
            "refusal serve the new weights, the others keep their previous ones; the rest "
            "of the update was received and dropped. Push the update again, corrected"
        )
        self.refused.__cause__ = error
        logger.error("%s", self.refused)

    def _load(self, weights: Weights) -> set[str]:
        embedding: list[torch.Tensor] = []
        loaded = self.checkpoint.load(self._whole_modules(weights, embedding))
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
            held.setdefault(target, {})[WHOLE if shard_id is None else shard_id] = (name, tensor)
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
        described = described_tensors(self.checkpoint.folder())
        if described is None:
            return
        checks = self.checkpoint.checks
        layout_only = TensorChecks(checks.config, checks.quantized, check_finite=False)
        ledger = self.checkpoint.ledger(layout_only)
        for name, tensor in self.checkpoint.prepare(described):
            ledger.check(name, tensor)

    def _session_started(self) -> None:
        self.session = None
        self.held.clear()
        self.folder_unchecked = self.checkpoint.model_config.model != self.checkpoint.loaded_from

    def _session_finishing(self) -> None:
        """vLLM is about to finish the session: say what it leaves as it was."""
        if self.session is None:
            return
        session, self.session = self.session, None
        self.checkpoint.loaded_from = self.checkpoint.model_config.model
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


def _filled(param: str, shards: dict[str | int, Any]) -> bool:
    """Whether ``shards`` fill ``param``: whole, or every part of a packed one."""
    parts = checkpoint_parts(param)
    return WHOLE in shards or (bool(parts) and parts.keys() <= shards.keys())


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
