"""Weight pushes as RL trainers send them, on real vLLM (CPU), against the reference.

:func:`run_direct` stands in a platform whose kernels read the parameters (a GPU):
vLLM's CPU linears take vLLM's own unpacked path, and the carrier decides its host
work as there (no head re-copy, no finite keys/values guard). On it,
the calls TRL, OpenRLHF and verl make in their worker extensions
(``model.load_weights`` on the worker's model, outside any update session):
one tensor per call as ``named_parameters()`` gives them (TRL), one per call as a
``state_dict()`` gives them, a tied head included (OpenRLHF), buckets (verl),
a whole state dict as one iterator; then a layerwise reload of the tied head, which
there needs no second copy.

:func:`run_broadcast` pushes over a gloo process group, the way vLLM's NCCL engine
receives: a sender process broadcasts every tensor of an update, the engine loads
them bucket by bucket. An update whose first bucket is refused is received to its
end (the sender finishes) and raises at ``finish_weight_update``; a good update
over the same group then serves.
"""

from __future__ import annotations

import gc
import json
import multiprocessing
import socket
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any

from spark2_5_dev.drivers import driver_main
from spark2_5_dev.parity import _compare_fp32, prompts
from spark2_5_dev.weight_updates import (
    CASES,
    WRONG_SHAPE,
    Served,
    _checkpoint_pair,
    _error_of,
    engines_own_the_session,
    layerwise_engine_base,
    offline_engine,
    run_all,
)

GLOO_BACKEND = "spark2_5_dev_gloo"
BUCKET = 4  # tensors per load_weights call
SENDER_TIMEOUT = timedelta(seconds=120)


def stand_in_a_gpu_host() -> None:
    """Make this process's vLLM compute its linears from their parameters (its own
    path for CPUs whose kernel library has neither oneDNN nor its SGL kernel), and
    let the carrier decide its host-specific work as on a GPU: no second copy of the
    weights, no finite keys/values guard; before the engine is built."""
    from vllm import _custom_ops
    from vllm.model_executor.layers import utils

    from vllm_spark2_5_plugin import cpu_platform

    _custom_ops._supports_onednn = False
    utils.check_cpu_sgl_kernel = lambda *_: False
    cpu_platform.linears_compute_with_copies = lambda: False
    cpu_platform.attention_reads_stale_kv_slots = lambda: False


def _direct(llm: Any, pairs: list[tuple[str, Any]], bucket: int) -> None:
    """``pairs`` pushed straight into the worker's model, ``bucket`` per call."""
    for start in range(0, len(pairs), bucket):
        chunk = pairs[start : start + bucket]
        llm.apply_model(lambda model, chunk=chunk: model.load_weights(chunk))


def _direct_steps(served: Served, tensors: dict[str, dict], tied: bool) -> dict[str, Any]:
    from torch import nn

    llm, steps = served.llm, {}
    steps["a_first_load"] = served.generate()
    steps["nothing_packed"] = llm.apply_model(
        lambda model: all(param.numel() for param in model.parameters())
    )[0]
    steps["finite_guard"] = llm.apply_model(
        lambda model: model.model.layers[0].self_attn.finite_kv_only
    )[0]
    # TRL: model.named_parameters() of the trainer's model, one per call (a tied
    # head is one parameter there, so it is not sent twice).
    _direct(llm, list(tensors["b"].items()), bucket=1)
    steps["b_trl_per_parameter"] = served.generate()
    # OpenRLHF: each state_dict() entry broadcast and loaded alone, lm_head.weight
    # included when tied.
    state_dict = dict(tensors["a"])
    if tied:
        state_dict["lm_head.weight"] = state_dict["model.embedding.weight"]
    _direct(llm, list(state_dict.items()), bucket=1)
    steps["a_openrlhf_per_tensor"] = served.generate()
    _direct(llm, list(tensors["b"].items()), bucket=BUCKET)  # verl: buckets
    steps["b_verl_buckets"] = served.generate()
    llm.apply_model(lambda model: model.load_weights(iter(tensors["a"].items())))
    steps["a_whole_state_dict"] = served.generate()
    wrong = [(WRONG_SHAPE, tensors["b"][WRONG_SHAPE][:, :-1].contiguous())]
    steps["wrong_shape_direct_error"] = _error_of(lambda: _direct(llm, wrong, bucket=1))
    steps["a_after_wrong_shape_direct"] = served.generate()
    llm.collective_rpc("reload_weights", kwargs={"weights_iterator": list(tensors["b"].items())})
    steps["b_reload_iterator"] = served.generate()
    steps["b_head_still_tied"] = llm.apply_model(
        lambda model: (
            isinstance(model.lm_head, nn.Module)
            and model.lm_head.weight is model.model.embedding.weight
        )
    )[0]
    return steps


def run_direct(workdir: Path) -> dict[str, Any]:
    """Each case of ``weight_updates.CASES`` on an engine that reads its parameters."""
    from spark2_5_dev.reference import Spark2_5Reference, checkpoint_tensors

    stand_in_a_gpu_host()
    results = {}
    for case in CASES:
        paths = _checkpoint_pair(case, workdir / "direct" / case.name)
        tensors = {label: checkpoint_tensors(path) for label, path in paths.items()}
        config = json.loads((paths["a"] / "config.json").read_text())
        batch = prompts(case.seeds[0], config["vocab_size"])
        llm = offline_engine(paths["a"])
        steps = _direct_steps(Served(llm, batch), tensors, config["tie_word_embeddings"])
        del llm
        gc.collect()
        references = {label: Spark2_5Reference.from_pretrained(p) for label, p in paths.items()}
        results[case.name] = {
            step: _compare_fp32(references[step[0]], batch, value)
            if isinstance(value, list)
            else value
            for step, value in steps.items()
        }
    return results


@dataclass(frozen=True)
class Rendezvous:
    host: str
    port: int


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _gloo_group(rendezvous: Rendezvous, rank: int) -> Any:
    """A two-rank gloo group of its own (the trainer is rank 0), beside vLLM's."""
    import torch.distributed as dist

    store = dist.TCPStore(
        rendezvous.host, rendezvous.port, 2, is_master=rank == 0, timeout=SENDER_TIMEOUT
    )
    return dist.ProcessGroupGloo(store, rank, 2, SENDER_TIMEOUT)


def broadcast(group: Any, tensor: Any) -> None:
    """``tensor`` from rank 0 to the other rank of ``group``."""
    import torch.distributed as dist

    options = dist.BroadcastOptions()
    options.rootRank = 0
    group.broadcast([tensor], options).wait()


def send(rendezvous: Rendezvous, updates: list[list[tuple[str, Any]]]) -> None:
    """The trainer: broadcast every tensor of each update, in order. Raises (and the
    process exits non-zero) when the engine stops receiving for SENDER_TIMEOUT."""
    group = _gloo_group(rendezvous, rank=0)
    for update in updates:
        for _, tensor in update:
            broadcast(group, tensor.contiguous())


def register_gloo_transfer() -> None:
    """Register, once, a weight-transfer engine that receives as vLLM's NCCL engine
    does (tensor by tensor from rank 0, ``load_weights`` per bucket), over gloo."""
    from dataclasses import dataclass as _dataclass

    import torch
    from vllm.distributed.weight_transfer.base import (
        WeightTransferInitInfo,
        WeightTransferUpdateInfo,
    )
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    if GLOO_BACKEND in WeightTransferEngineFactory._registry:
        return

    @_dataclass
    class GlooInitInfo(WeightTransferInitInfo):
        host: str
        port: int

    @_dataclass
    class GlooUpdateInfo(WeightTransferUpdateInfo):
        names: list[str]
        dtype_names: list[str]
        shapes: list[list[int]]

    class GlooWeightTransfer(layerwise_engine_base()):
        init_info_cls = GlooInitInfo
        update_info_cls = GlooUpdateInfo
        group: Any = None

        def init_transfer_engine(self, init_info: GlooInitInfo) -> None:
            self.group = _gloo_group(Rendezvous(init_info.host, init_info.port), rank=1)

        def receive_weights(self, update_info: GlooUpdateInfo) -> None:
            metadata = list(
                zip(update_info.names, update_info.dtype_names, update_info.shapes, strict=True)
            )
            for start in range(0, len(metadata), BUCKET):
                bucket = []
                for name, dtype_name, shape in metadata[start : start + BUCKET]:
                    tensor = torch.empty(shape, dtype=getattr(torch, dtype_name))
                    broadcast(self.group, tensor)
                    bucket.append((name, tensor))
                self.model.load_weights(bucket)

    WeightTransferEngineFactory.register_engine(GLOO_BACKEND, GlooWeightTransfer)


def _update_info(update: list[tuple[str, Any]]) -> dict[str, Any]:
    return {
        "update_info": {
            "names": [name for name, _ in update],
            "dtype_names": [str(tensor.dtype).removeprefix("torch.") for _, tensor in update],
            "shapes": [list(tensor.shape) for _, tensor in update],
        }
    }


def _pushed(llm: Any, update: list[tuple[str, Any]]) -> Callable[[], None]:
    def push() -> None:
        llm.start_weight_update()
        llm.update_weights(_update_info(update))
        llm.finish_weight_update()

    return push


def run_broadcast(workdir: Path) -> dict[str, Any]:
    """A refused update, then a good one, broadcast by a sender process over gloo."""
    from spark2_5_dev.reference import Spark2_5Reference, checkpoint_tensors

    register_gloo_transfer()
    case = CASES[0]
    paths = _checkpoint_pair(case, workdir / "broadcast")
    tensors = {label: checkpoint_tensors(path) for label, path in paths.items()}
    config = json.loads((paths["a"] / "config.json").read_text())
    batch = prompts(case.seeds[0], config["vocab_size"])
    # Refused in its first bucket: nothing of it may load, all of it must be received.
    refused = [(WRONG_SHAPE, tensors["b"][WRONG_SHAPE][:, :-1].contiguous())]
    refused += [(n, t) for n, t in tensors["b"].items() if n != WRONG_SHAPE]
    good = list(tensors["b"].items())
    llm = offline_engine(paths["a"], weight_transfer_config={"backend": GLOO_BACKEND})
    rendezvous = Rendezvous("127.0.0.1", _free_port())
    sender = multiprocessing.get_context("spawn").Process(
        target=send, args=(rendezvous, [refused, good])
    )
    sender.start()
    llm.init_weight_transfer_engine({"init_info": asdict(rendezvous)})
    served = Served(llm, batch)
    steps: dict[str, Any] = {"refused_error": _error_of(_pushed(llm, refused))}
    # vLLM's worker keeps an update open when its finish raised: one more ends it.
    steps["second_finish_error"] = _error_of(llm.finish_weight_update)
    steps["a_after_refused"] = served.generate()
    steps["good_error"] = _error_of(_pushed(llm, good))
    steps["b_after_good"] = served.generate()
    sender.join(SENDER_TIMEOUT.total_seconds())
    steps["sender_exit_code"] = sender.exitcode
    del llm, served
    gc.collect()
    references = {label: Spark2_5Reference.from_pretrained(p) for label, p in paths.items()}
    return {
        step: _compare_fp32(references[step[0]], batch, value) if isinstance(value, list) else value
        for step, value in steps.items()
    }


def pushes(workdir: Path) -> dict[str, Any]:
    """This driver's parts: the broadcast where vLLM's transfer engines run the update
    session, then the direct pushes."""
    result: dict[str, Any] = {"engines_own_the_session": engines_own_the_session()}
    if result["engines_own_the_session"]:
        result["broadcast"] = run_broadcast(workdir)
    result["direct"] = run_direct(workdir)  # last: it changes how this process's vLLM computes
    return result


def summary(result: dict[str, Any]) -> dict[str, Any]:
    """Each step's verdict: tokens equal to the reference, or the value it recorded."""

    def verdicts(steps: dict[str, Any]) -> dict[str, Any]:
        return {
            step: value["tokens_match"] if isinstance(value, dict) else value
            for step, value in steps.items()
        }

    return {
        "broadcast": verdicts(result.get("broadcast", {})),
        "direct": {case: verdicts(steps) for case, steps in result["direct"].items()},
    }


if __name__ == "__main__":
    driver_main(__spec__.name, __doc__.splitlines()[0], partial(run_all, parts=pushes), summary)
