"""In-place weight updates of a running Spark2_5 engine, against the reference.

:func:`run_case` serves checkpoint A of one :data:`CASES` entry with an offline
``vllm.LLM`` (in this process, see ``spark2_5_dev.parity``), then pushes
checkpoint B's (or A's again) weights through each of vLLM's update paths and
records, after each, the greedy tokens and log-probs next to the plain-PyTorch
reference on the weights that should now serve:

* ``reload_weights`` from a path and from an iterator (``collective_rpc``);
* the weight-transfer engines' lifecycle (``start_weight_update``,
  ``update_weights``, ``finish_weight_update``) with one ``load_weights`` call per
  tensor and per bucket; the NCCL and CUDA IPC engines need a GPU, so this runs
  :class:`InMemoryWeightTransfer`, an engine registered with vLLM's factory that
  hands the trainer's tensors to ``load_weights`` the same way;
* a wrong-shape push, a push of only part of a packed parameter, a push outside
  any update, and a reload while requests are being generated;
* on a LoRA engine, the adapter on the updated base (:func:`run_lora_case`), and
  ``reload_weights`` of quantized checkpoints against a fresh engine on them
  (:func:`run_quantized`).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from spark2_5_dev.engines import in_process_llm
from spark2_5_dev.host_features import reloads_weights_into_lora_layers
from spark2_5_dev.parity import (
    ENGINE_ENV,
    MAX_MODEL_LEN,
    NEW_TOKENS,
    _compare_fp32,
    completion_record,
    prompts,
)

IN_MEMORY_BACKEND = "spark2_5_dev_in_memory"
BUCKET_SIZE = 4  # tensors per update_weights call in the per-bucket path
REQUESTS_UNDER_LOAD = 6
STEPS_BEFORE_RELOAD = 4
WRONG_SHAPE = "model.layers.0.mlp.down_proj.weight"
PART_OF_PACKED = "model.layers.0.mlp.gate_proj.weight"


@dataclass(frozen=True)
class UpdateCase:
    name: str
    overrides: dict[str, Any] = field(default_factory=dict)
    qkv: str = "fused"
    seeds: tuple[int, int] = (8, 9)


CASES = (
    # The released layout: tied head, fused q_k_v_proj (gate/up are always parts).
    UpdateCase("tied-fused", seeds=(8, 9)),
    # Re-exported layout: untied head, separate q/k/v_proj.
    UpdateCase("untied-split", {"tie_word_embeddings": False}, qkv="split", seeds=(2, 3)),
)


def engines_own_the_session() -> bool:
    """Whether this vLLM's weight-transfer engines run the layerwise reload themselves
    (``WeightTransferEngine.start_weight_update``: 0.32). Read, not run: in 0.23 the
    worker runs it and engines hand a ``load_weights`` callback their tensors, an API
    :class:`InMemoryWeightTransfer` does not implement, so the transfer steps are
    skipped there."""
    from vllm.distributed.weight_transfer.base import WeightTransferEngine

    return hasattr(WeightTransferEngine, "start_weight_update")


def layerwise_engine_base() -> type:
    """A vLLM ``WeightTransferEngine`` that runs one layerwise reload per update, as
    vLLM's NCCL engine does, for CPU stand-ins that only say how tensors arrive
    (``receive_weights``)."""
    from vllm.distributed.weight_transfer.base import WeightTransferEngine
    from vllm.model_executor.model_loader.reload import (
        finalize_layerwise_reload,
        initialize_layerwise_reload,
    )

    class LayerwiseTestEngine(WeightTransferEngine):
        def start_weight_update(self) -> None:
            initialize_layerwise_reload(self.model)

        def finish_weight_update(self) -> None:
            finalize_layerwise_reload(self.model, self.model_config)

        def update_weights(self, update_info: dict[str, Any]) -> None:
            self.receive_weights(self.parse_update_info(update_info))  # CPU: nothing to sync

        @staticmethod
        def trainer_send_weights(iterator: Any, trainer_args: Any) -> None:
            """Abstract in vLLM 0.25's base class; these tests' trainers are their own."""
            raise NotImplementedError

        def shutdown(self) -> None:
            pass

    return LayerwiseTestEngine


def register_in_memory_transfer() -> None:
    """Register :class:`InMemoryWeightTransfer` with vLLM's weight-transfer factory
    (once per process; the in-process engine's worker looks it up there)."""
    from dataclasses import dataclass as _dataclass

    import torch
    from vllm.distributed.weight_transfer.base import (
        WeightTransferInitInfo,
        WeightTransferUpdateInfo,
    )
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    if IN_MEMORY_BACKEND in WeightTransferEngineFactory._registry:
        return

    @_dataclass
    class InMemoryInitInfo(WeightTransferInitInfo):
        pass

    @_dataclass
    class InMemoryUpdateInfo(WeightTransferUpdateInfo):
        names: list[str]
        tensors: list[torch.Tensor]
        per_tensor: bool = True

    class InMemoryWeightTransfer(layerwise_engine_base()):
        """The NCCL engine's worker side without NCCL: the "received" tensors come in
        the update info; each goes to ``load_weights`` alone (``per_tensor``) or with
        its bucket, inside one layerwise reload per update."""

        init_info_cls = InMemoryInitInfo
        update_info_cls = InMemoryUpdateInfo

        def init_transfer_engine(self, init_info: InMemoryInitInfo) -> None:
            pass

        def receive_weights(self, update_info: InMemoryUpdateInfo) -> None:
            pairs = list(zip(update_info.names, update_info.tensors, strict=True))
            if update_info.per_tensor:
                for pair in pairs:
                    self.model.load_weights([pair])
            else:
                self.model.load_weights(pairs)

    WeightTransferEngineFactory.register_engine(IN_MEMORY_BACKEND, InMemoryWeightTransfer)


def push(llm: Any, tensors: dict[str, Any], per_tensor: bool, bucket: int = BUCKET_SIZE) -> None:
    """One weight update of ``tensors`` through the weight-transfer lifecycle."""
    names = list(tensors)
    llm.start_weight_update()
    for start in range(0, len(names), bucket):
        chunk = names[start : start + bucket]
        llm.update_weights(
            {
                "update_info": {
                    "names": chunk,
                    "tensors": [tensors[n] for n in chunk],
                    "per_tensor": per_tensor,
                }
            }
        )
    llm.finish_weight_update()


def _error_of(call: Any) -> str | None:
    try:
        call()
    except Exception as exc:  # the message is what is compared
        return f"{type(exc).__name__}: {exc}"
    return None


class Served:
    """The engine under test and the prompts every step is generated on."""

    def __init__(self, llm: Any, batch: list[list[int]]) -> None:
        from vllm import SamplingParams

        self.llm = llm
        self.batch = batch
        self.params = SamplingParams(
            temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True, logprobs=1, detokenize=False
        )

    def generate(self, lora_request: Any = None) -> list[dict[str, list]]:
        outputs = self.llm.generate(
            [{"prompt_token_ids": p} for p in self.batch],
            self.params,
            lora_request=lora_request,
            use_tqdm=False,
        )
        return [completion_record(output) for output in outputs]

    def head_tied(self) -> bool:
        return self.llm.apply_model(lambda m: m.lm_head.weight is m.model.embedding.weight)[0]

    def under_load(self, weights_path: Path) -> dict[str, Any]:
        """Requests in flight while ``reload_weights`` runs between two engine steps,
        as vLLM's engine core runs it between steps when serving."""
        engine = self.llm.llm_engine
        for index in range(REQUESTS_UNDER_LOAD):
            prompt = self.batch[index % len(self.batch)]
            engine.add_request(f"load-{index}", {"prompt_token_ids": prompt}, self.params)
        finished: dict[str, Any] = {}
        for _ in range(STEPS_BEFORE_RELOAD):
            finished.update({o.request_id: o for o in engine.step() if o.finished})
        in_flight = REQUESTS_UNDER_LOAD - len(finished)
        self.llm.collective_rpc("reload_weights", kwargs={"weights_path": str(weights_path)})
        while engine.has_unfinished_requests():
            finished.update({o.request_id: o for o in engine.step() if o.finished})
        return {
            "in_flight_at_reload": in_flight,
            "finished": len(finished),
            "new_tokens": sorted({len(o.outputs[0].token_ids) for o in finished.values()}),
        }


def _wrong_last_tensor(checkpoint: Path, tensors: dict[str, Any]) -> Path:
    """A folder with ``checkpoint``'s config and ``tensors``, the last one vLLM reads
    (by name) one row short: refused from the headers before any tensor loads, where
    reading the rest first would leave the engine on a mix of the two checkpoints."""
    from safetensors.torch import save_file

    folder = checkpoint.with_name(checkpoint.name + "-wrong-shape")
    folder.mkdir(exist_ok=True)
    shutil.copy(checkpoint / "config.json", folder)
    last = max(tensors)
    save_file({**tensors, last: tensors[last][:-1].contiguous()}, folder / "model.safetensors")
    return folder


def _steps(served: Served, a: Path, b: Path, tensors: dict[str, dict]) -> dict[str, Any]:
    """Each update path in turn; the name says which weights should serve after it."""
    llm, steps = served.llm, {}
    steps["a_first_load"] = served.generate()
    llm.collective_rpc("reload_weights", kwargs={"weights_path": str(b)})
    steps["b_reload_path"] = served.generate()
    steps["b_head_still_tied"] = served.head_tied()
    llm.collective_rpc("reload_weights", kwargs={"weights_iterator": list(tensors["a"].items())})
    steps["a_reload_iterator"] = served.generate()
    steps["wrong_shape_reload_error"] = _error_of(
        lambda: llm.collective_rpc(
            "reload_weights", kwargs={"weights_path": str(_wrong_last_tensor(b, tensors["b"]))}
        )
    )
    steps["a_after_wrong_shape_reload"] = served.generate()
    if not engines_own_the_session():
        return {**steps, **_under_load(served, b)}
    push(llm, tensors["b"], per_tensor=True)
    steps["b_per_tensor"] = served.generate()
    push(llm, tensors["a"], per_tensor=False)
    steps["a_per_bucket"] = served.generate()

    # First in the update, so that nothing before it loads.
    wrong = {WRONG_SHAPE: tensors["b"][WRONG_SHAPE][:, :-1].contiguous()}
    wrong.update((n, t) for n, t in tensors["b"].items() if n != WRONG_SHAPE)
    steps["wrong_shape_error"] = _error_of(lambda: push(llm, wrong, per_tensor=True))
    # vLLM's worker keeps an update open when its finish raised: one more ends it.
    steps["second_finish_error"] = _error_of(llm.finish_weight_update)
    steps["a_after_wrong_shape"] = served.generate()
    part = PART_OF_PACKED
    push(llm, {part: tensors["b"][part]}, per_tensor=True)
    steps["a_after_part_of_a_packed_parameter"] = served.generate()
    steps["outside_session_error"] = _error_of(
        lambda: llm.apply_model(lambda m: m.load_weights([(part, tensors["b"][part])]))
    )
    steps["a_after_outside_session"] = served.generate()
    return {**steps, **_under_load(served, b)}


def _under_load(served: Served, b: Path) -> dict[str, Any]:
    return {"under_load": served.under_load(b), "b_after_under_load": served.generate()}


def _checkpoint_pair(case: UpdateCase, root: Path) -> dict[str, Path]:
    """``case``'s checkpoints A and B under ``root``."""
    from spark2_5_dev.checkpoints import build_spark2_5_checkpoint

    return {
        label: build_spark2_5_checkpoint(root / label, seed=seed, qkv=case.qkv, **case.overrides)
        for label, seed in zip("ab", case.seeds, strict=True)
    }


def offline_engine(path: Path, dtype: str = "float32", **settings: Any) -> Any:
    """An offline engine on ``path`` as the weight-update drivers serve it (greedy
    runs of :data:`MAX_MODEL_LEN`, eager, seed 0), with ``settings``."""
    return in_process_llm(
        model=str(path),
        dtype=dtype,
        max_model_len=MAX_MODEL_LEN,
        enforce_eager=True,
        seed=0,
        **settings,
    )


def in_memory_transfer() -> dict[str, Any]:
    """The engine setting that receives pushes through :class:`InMemoryWeightTransfer`,
    where vLLM's weight-transfer engines run the update session (none elsewhere)."""
    if not engines_own_the_session():
        return {}
    return {"weight_transfer_config": {"backend": IN_MEMORY_BACKEND}}


def run_case(case: UpdateCase, workdir: Path) -> dict[str, Any]:
    """Build ``case``'s checkpoints A and B, run :func:`_steps` on one engine, and
    compare each step with the reference on the weights that should serve."""
    from spark2_5_dev.reference import Spark2_5Reference, checkpoint_tensors

    paths = _checkpoint_pair(case, workdir / case.name)
    tensors = {label: checkpoint_tensors(path) for label, path in paths.items()}
    config = json.loads((paths["a"] / "config.json").read_text())
    batch = prompts(case.seeds[0], config["vocab_size"])
    llm = offline_engine(paths["a"], **in_memory_transfer())
    steps = _steps(Served(llm, batch), paths["a"], paths["b"], tensors)
    del llm
    gc.collect()
    references = {label: Spark2_5Reference.from_pretrained(p) for label, p in paths.items()}
    compared = {
        step: _compare_fp32(references[step[0]], batch, served)
        for step, served in steps.items()
        if step[:2] in ("a_", "b_") and isinstance(served, list)
    }
    return {
        "case": asdict(case),
        "compared": compared,
        "a_and_b_differ": compared["a_first_load"]["prompts"][0]["reference_tokens"]
        != references["b"].generate(batch[0], NEW_TOKENS)[0],
        **{step: value for step, value in steps.items() if not isinstance(value, list)},
    }


def run_lora_case(workdir: Path) -> dict[str, Any]:
    """A LoRA engine on A with one adapter; B's base weights pushed by ``reload_weights``
    and A's again per tensor. vLLM drops the loaded adapters after each update and
    loads the adapter again, onto the new base, for the next request naming it."""
    from vllm.lora.request import LoRARequest

    from spark2_5_dev import lora
    from spark2_5_dev.checkpoints import read_config
    from spark2_5_dev.reference import Spark2_5Reference, checkpoint_tensors

    case = CASES[0]
    root = workdir / "lora"
    paths = _checkpoint_pair(case, root)
    config = read_config(paths["a"])
    adapter = lora.random_adapter(config, root / "adapter", seed=11, rank=8)
    batch = prompts(case.seeds[0], config["vocab_size"])
    llm = offline_engine(
        paths["a"], enable_lora=True, max_loras=2, max_lora_rank=8, **in_memory_transfer()
    )
    served = Served(llm, batch)
    request = LoRARequest("adapter", 1, str(adapter))
    steps = {"a_with_adapter": served.generate(request)}
    llm.collective_rpc("reload_weights", kwargs={"weights_path": str(paths["b"])})
    steps["b_with_adapter"] = served.generate(request)
    steps["b_base"] = served.generate()
    if engines_own_the_session():
        push(llm, checkpoint_tensors(paths["a"]), per_tensor=True)
        steps["a_with_adapter_after_per_tensor"] = served.generate(request)
    del llm, served
    gc.collect()
    references = {
        **{label: Spark2_5Reference.from_pretrained(p) for label, p in paths.items()},
        **{
            f"{label}_with_adapter": Spark2_5Reference.from_pretrained(
                lora.merge_adapter(p, adapter, root / f"{label}-merged")
            )
            for label, p in paths.items()
        },
    }
    return {
        step: _compare_fp32(
            references[step[0] + ("_with_adapter" if "adapter" in step else "")], batch, out
        )
        for step, out in steps.items()
    }


def cpu_paths() -> tuple[str, ...]:
    """The x86 kernel paths this CPU can run vLLM's quantized CPU layers on: ``amx``
    (int8 through the SGL kernel, GPTQ as W4A8) where the CPU has AMX, and always
    ``no-amx`` (int8 through oneDNN, GPTQ as W4A16: AVX2 and AVX-512 CPUs), which an
    AMX CPU runs too when vLLM is told it has none."""
    import torch

    return ("amx", "no-amx") if torch.cpu._is_amx_tile_supported() else ("no-amx",)


@contextmanager
def kernel_path(path: str) -> Iterator[None]:
    """vLLM picks its quantized CPU kernels by ``torch.cpu._is_amx_tile_supported()``
    when a layer's weights are processed; ``no-amx`` answers False meanwhile."""
    import torch

    if path == "amx":
        yield
        return
    amx = torch.cpu._is_amx_tile_supported
    torch.cpu._is_amx_tile_supported = lambda: False
    try:
        yield
    finally:
        torch.cpu._is_amx_tile_supported = amx


def quantized_kernels(llm: Any) -> list[str]:
    """How the engine's quantized layers compute: the int8 kernel's method, or
    whether GPTQ runs as W4A8."""

    def kernels(model: Any) -> list[str]:
        found = set()
        for module in model.modules():
            kernel = getattr(getattr(module, "scheme", None), "kernel", None)
            if getattr(kernel, "linear_method", None) is not None:
                found.add(kernel.linear_method.__name__)
            if hasattr(module, "use_w4a8"):
                found.add("gptq_w4a8" if module.use_w4a8 else "gptq_w4a16")
        return sorted(found)

    return llm.apply_model(kernels)[0]


def run_quantized(workdir: Path) -> dict[str, Any]:
    """For each quantized format and each kernel path this CPU runs: one engine per
    checkpoint (bfloat16), then a reload from the other one's folder and, where the
    weight-transfer engines run the session, a push of the first one's tensors one
    by one, each against the fresh engine on the checkpoint that should serve."""
    from spark2_5_dev import quantize
    from spark2_5_dev.checkpoints import build_spark2_5_checkpoint
    from spark2_5_dev.fixture import FIXTURE_CONFIG_OVERRIDES
    from spark2_5_dev.reference import checkpoint_tensors

    results: dict[str, Any] = {"cpu_paths": cpu_paths()}
    for fmt in quantize.FORMATS:
        paths = {
            label: quantize.quantize_checkpoint(
                build_spark2_5_checkpoint(
                    workdir / fmt / f"float-{label}", seed=seed, **FIXTURE_CONFIG_OVERRIDES
                ),
                workdir / fmt / label,
                fmt,
            )
            for label, seed in (("a", 3), ("b", 4))
        }
        batch = prompts(3, json.loads((paths["a"] / "config.json").read_text())["vocab_size"])
        for path in results["cpu_paths"]:
            with kernel_path(path):
                try:
                    results[f"{fmt}/{path}"] = _quantized_reloads(paths, batch, checkpoint_tensors)
                except RuntimeError as refused:  # vLLM has no kernel for it on this CPU
                    results[f"{fmt}/{path}"] = {"refused": str(refused)}
                    gc.collect()
    return results


def _quantized_reloads(
    paths: dict[str, Path], batch: list[list[int]], checkpoint_tensors: Callable[[Path], dict]
) -> dict[str, Any]:
    fresh, reloaded, pushed, kernels = {}, {}, {}, set()
    for first, then in ("ab", "ba"):
        llm = offline_engine(paths[first], dtype="bfloat16", **in_memory_transfer())
        served = Served(llm, batch)
        fresh[first] = served.generate()
        kernels.update(quantized_kernels(llm))
        llm.collective_rpc("reload_weights", kwargs={"weights_path": str(paths[then])})
        reloaded[then] = served.generate()
        if engines_own_the_session():
            push(llm, checkpoint_tensors(paths[first]), per_tensor=True)
            pushed[first] = served.generate()
        del llm, served
        gc.collect()
    return {
        "kernels": sorted(kernels),
        "a_and_b_differ": fresh["a"] != fresh["b"],
        "reloaded_equals_fresh": {label: reloaded[label] == fresh[label] for label in "ab"},
        "pushed_equals_fresh": {label: pushed[label] == fresh[label] for label in pushed},
    }


def kernel_libraries() -> list[str]:
    """vLLM's CPU kernel libraries this process has loaded."""
    maps = Path("/proc/self/maps").read_text()
    return sorted({Path(line.split()[-1]).name for line in maps.splitlines() if "/vllm/_C" in line})


def run_all(workdir: str | Path, parts: Callable[[Path], dict[str, Any]]) -> dict[str, Any]:
    """A weight-update driver's ``parts(workdir)``, in this process made ready for its
    engines first: :data:`ENGINE_ENV` where unset, one torch thread."""
    for name, value in ENGINE_ENV.items():
        os.environ.setdefault(name, value)
    import torch

    torch.set_num_threads(1)
    return parts(Path(workdir))


def update_paths(
    workdir: Path, cases: tuple[UpdateCase, ...] = CASES, quantized_only: bool = False
) -> dict[str, Any]:
    """This driver's parts: each case, the LoRA case, the quantized reloads."""
    import vllm

    if engines_own_the_session():
        register_in_memory_transfer()
    result = {"vllm": vllm.__version__, "transfer_steps": engines_own_the_session()}
    if not quantized_only:
        result["cases"] = {case.name: run_case(case, workdir) for case in cases}
        result["lora"] = run_lora_case(workdir) if reloads_weights_into_lora_layers() else None
    result["quantized"] = run_quantized(workdir)
    return {**result, "kernel_libraries": kernel_libraries()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog=f"python -m {__spec__.name}", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--workdir", type=Path, required=True, help="where checkpoints go")
    parser.add_argument("--out", type=Path, required=True, help="JSON file for the results")
    parser.add_argument("--quantized-only", action="store_true", help="only run_quantized")
    args = parser.parse_args(argv)
    result = run_all(args.workdir, partial(update_paths, quantized_only=args.quantized_only))
    args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
