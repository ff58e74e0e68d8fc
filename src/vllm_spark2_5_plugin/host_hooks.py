# SPDX-License-Identifier: Apache-2.0
"""Every reach of the carrier into vLLM's private state: the upgrade risk in one place.

vLLM has no public hook for any of these. Each names the private attribute or
class it relies on, what happens where it is missing, and the upstream change
that would retire it. The model attaches its hooks in one call, :func:`attach`.
Version drift of public APIs (modules that moved, keywords that changed) is in
:mod:`compat`.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from vllm_hust_bundle_kit import deferred

# --- the config table -------------------------------------------------------------
# Retire when vLLM has a public call to register a config class for a model_type.


def host_config_registry() -> dict[str, Any]:
    """vLLM's ``model_type -> config class`` table (``_CONFIG_REGISTRY``), consulted
    before remote code."""
    return importlib.import_module("vllm.transformers_utils.config")._CONFIG_REGISTRY


def register_config(model_type: str, config_cls: type) -> None:
    """Make ``model_type`` resolve to ``config_cls`` in vLLM and in transformers.

    An entry in vLLM's table also makes vLLM load the config without running
    the checkpoint's remote code, even when ``--trust-remote-code`` is given.
    """
    from transformers import AutoConfig

    host_config_registry()[model_type] = config_cls
    AutoConfig.register(model_type, config_cls, exist_ok=True)


# --- in-place weight updates --------------------------------------------------------
# Retire when vLLM tells a model that a layerwise reload starts and finishes (0.34's
# ``finalize_model_weights`` covers the finish only).

# vLLM's ``initialize_layerwise_reload`` and ``finalize_layerwise_reload`` each set
# this attribute of the model first thing (to park torchao's own reload while
# vLLM's runs); a property of that name tells the model that an update starts
# and that vLLM is about to finish it. The same in 0.32 (run) and 0.23 (read in
# its source); the layerwise reload itself is in every release of the range.
LAYERWISE_RELOAD_ATTRIBUTE = "_do_torchao_reload"


def _layerwise_reload_module() -> Any | None:
    try:
        return importlib.import_module("vllm.model_executor.model_loader.reload.layerwise")
    except ImportError:
        return None


def finalize_layerwise_reload(model: Any, model_config: Any) -> None:
    """End ``model``'s layerwise reload as vLLM does: every layer not loaded in it gets
    its previous tensors back."""
    module = importlib.import_module("vllm.model_executor.model_loader.reload")
    module.finalize_layerwise_reload(model, model_config)


def in_layerwise_reload(model: Any) -> bool:
    """Whether ``model`` is inside vLLM's layerwise reload: after
    ``initialize_layerwise_reload(model)``, until ``finalize_layerwise_reload`` resets
    the model's own entry (``LAYERWISE_INFO``)."""
    module = _layerwise_reload_module()
    info = None if module is None else getattr(module, "LAYERWISE_INFO", {}).get(model)
    return info is not None and info.can_load()


# --- quantized layers on CPU ----------------------------------------------------------
# Retire each when vLLM's CPU kernels do it themselves: build cpu_gemm_wna16 for AVX2
# (or refuse GPTQ there), and keep the oneDNN int8 handler's inputs across a reload.

# vLLM CPU kernel class -> the op of vLLM's CPU kernel library it computes with.
CPU_KERNEL_OPS = {"CPUWNA16LinearKernel": "cpu_gemm_wna16"}


def _quantized_kernels(model: Any) -> Iterable[tuple[str, Any, Any]]:
    """Each layer whose quantization method computes through a vLLM linear kernel:
    its name, its method and the kernel (GPTQ keeps it on the method, compressed-
    tensors on the layer's scheme)."""
    for name, module in model.named_modules():
        method = getattr(module, "quant_method", None)
        scheme = getattr(module, "scheme", None)
        kernel = getattr(method, "kernel", None) or getattr(scheme, "kernel", None)
        if kernel is not None:
            yield name, method, kernel


def refuse_missing_cpu_kernel_ops(model: Any) -> None:
    """Refuse, naming it, a quantized layer whose vLLM CPU kernel calls an op that the
    kernel library this CPU loaded lacks: vLLM 0.32's library for AVX2 CPUs
    (``_C_AVX2``) has no ``cpu_gemm_wna16``, which its GPTQ/AWQ 4-bit kernel calls, so
    vLLM would fail at its first forward pass with an ``AttributeError``."""
    import torch

    for name, method, kernel in _quantized_kernels(model):
        op = CPU_KERNEL_OPS.get(type(kernel).__name__)
        if op is not None and not hasattr(torch.ops._C, op):
            raise RuntimeError(
                f"{name}: vLLM computes this {type(method).__name__} layer with "
                f"{type(kernel).__name__}, which calls torch.ops._C.{op}, and vLLM's CPU "
                f"kernel library for this CPU has no {op} (vLLM builds it only for AVX-512 "
                "and newer x86 CPUs). Serve a bfloat16 or W8A8 int8 checkpoint here, or use "
                "a CPU with AVX-512"
            )


def keep_onednn_int8_scales(model: Any) -> None:
    """Keep each of ``model``'s int8 layers on vLLM's oneDNN CPU kernel whole across
    layerwise reloads.

    The kernel (``CPUInt8ScaledMMLinearKernel``, taken on x86 CPUs without AMX, where
    vLLM's ``check_cpu_sgl_kernel`` says no) hands its oneDNN handler the processed
    ``weight_scale`` by pointer and sets ``weight`` to None (the handler holds the
    packed weight). A layerwise reload then breaks the layer two ways: a reload of it
    copies the new results into the first load's tensors and drops the new ones, so
    the new handler reads freed memory (NaN logits, seen on vLLM 0.32); a reload
    that leaves it out restores only its non-None parameters, so ``weight`` is gone
    and its next forward raises ``AttributeError``. Here the handler's inputs are
    kept until the next reload of the layer replaces them, and ``weight`` stays an
    empty parameter. The AMX path and GPTQ's CPU kernel compute with the layer's
    tensors and need none of this; neither does any layer on a GPU, whose kernels
    have no such method.
    """
    import torch

    for _, _, kernel in _quantized_kernels(model):
        build = getattr(kernel, "process_weights_for_onednn", None)
        if build is None or getattr(build, "keeps_inputs", False):
            continue
        weight_name = kernel.layer_param_names[0]

        def build_and_keep(
            layer: Any, build: Callable[[Any], None] = build, weight_name: str = weight_name
        ) -> None:
            build(layer)
            if getattr(layer, weight_name, None) is None:
                empty = torch.empty(0, dtype=torch.int8)
                setattr(layer, weight_name, torch.nn.Parameter(empty, requires_grad=False))
            layer.spark2_5_onednn_inputs = tuple(layer.parameters(recurse=False))

        build_and_keep.keeps_inputs = True  # type: ignore[attr-defined]
        kernel.process_weights_for_onednn = build_and_keep


# --- LoRA -----------------------------------------------------------------------------
# Retire when vLLM lets a model check an adapter before it loads it.


def check_lora_adapters(manager: Any, check: Callable[[Any], None]) -> bool:
    """Make vLLM's LoRA ``manager`` call ``check(lora_model)`` on every adapter it adds,
    before it packs the adapter's weights or gives it a slot; what ``check`` raises
    refuses the adapter, and vLLM reports it to whoever asked to load it.

    Every release of the verified range adds adapters through
    ``LoRAModelManager._add_adapter``; where that is missing this returns False and
    adapters load unchecked.
    """
    add_adapter = getattr(manager, "_add_adapter", None)
    if add_adapter is None:
        return False

    def checked_add_adapter(lora_model: Any) -> Any:
        check(lora_model)
        return add_adapter(lora_model)

    manager._add_adapter = checked_add_adapter
    return True


# --- the Responses stream -------------------------------------------------------------
# Retire when vLLM's Responses stream keeps an open call's last pieces before the
# content a delta carries after them.

RESPONSES_SERVING = "vllm.entrypoints.openai.responses.serving"


def keep_open_calls_before_content() -> None:
    """Make vLLM's Responses stream take a delta's pieces of a call already open
    before its content.

    vLLM splits each delta into reasoning, content, then tool calls
    (``split_delta``), and content closes an open call. When a stream's last
    delta closes a call and carries text written after it (vLLM merges what the
    parser releases at the end into the last delta), the call's last pieces then
    come after its item was closed, nameless, and the stream fails (a pydantic
    error). Such pieces (no id, no name) always precede any content of the delta:
    content is never written inside a call. vLLM 0.32 and 0.33; releases without
    ``split_delta`` stream Responses otherwise and are left alone."""

    def patch(serving: Any) -> None:
        split = getattr(serving, "split_delta", None)
        if split is None or getattr(split, "keeps_open_calls_first", False):
            return

        def split_delta(delta: Any) -> list[Any]:
            parts = split(delta)
            continuing = [part for part in parts if _continues_a_call(part)]
            if not continuing:
                return parts
            rest = [part for part in parts if not _continues_a_call(part)]
            reasoning = [part for part in rest if part.reasoning is not None]
            others = [part for part in rest if part.reasoning is None]
            return [*reasoning, *continuing, *others]

        split_delta.keeps_open_calls_first = True  # type: ignore[attr-defined]
        serving.split_delta = split_delta

    deferred.after_import((RESPONSES_SERVING,), patch)


def _continues_a_call(delta: Any) -> bool:
    calls = delta.tool_calls or []
    return bool(calls) and all(
        call.id is None and getattr(call.function, "name", None) is None for call in calls
    )


# --- attaching them to a model ----------------------------------------------------------

NO_ADAPTER_CHECKS = (
    "This vLLM's LoRA manager has no _add_adapter: Spark2_5 cannot check LoRA adapters "
    "against the model, and serves mis-shaped ones unchecked"
)


@dataclass(frozen=True)
class ModelHooks:
    """What one model does when vLLM touches it: ``reload_step(inside)`` when a layerwise
    reload starts (False) or finishes (True); ``check_adapter(lora_model)`` before an
    adapter loads."""

    reload_step: Callable[[bool], None]
    check_adapter: Callable[[Any], None]


_HOOKS = "_spark2_5_host_hooks"


def attach(model: Any, hooks: ModelHooks) -> None:
    """Everything above, for ``model``: its quantized CPU layers checked and kept whole,
    and ``hooks`` called when vLLM reloads it or gives it a LoRA manager."""
    refuse_missing_cpu_kernel_ops(model)
    keep_onednn_int8_scales(model)
    model.__dict__[_HOOKS] = hooks
    model_cls = type(model)
    if not isinstance(model_cls.__dict__.get(LAYERWISE_RELOAD_ATTRIBUTE), property):
        setattr(model_cls, LAYERWISE_RELOAD_ATTRIBUTE, property(_reload_get, _reload_set))
        model_cls.lora_manager = property(_lora_manager_get, _lora_manager_set)


def _reload_get(model: Any) -> Any:
    return model.__dict__.get(f"_spark2_5{LAYERWISE_RELOAD_ATTRIBUTE}", False)


def _reload_set(model: Any, value: Any) -> None:
    model.__dict__[f"_spark2_5{LAYERWISE_RELOAD_ATTRIBUTE}"] = value
    model.__dict__[_HOOKS].reload_step(in_layerwise_reload(model))


def _lora_manager_get(model: Any) -> Any:
    return model.__dict__.get("_lora_manager")


def _lora_manager_set(model: Any, manager: Any) -> None:
    # vLLM's LoRA manager announces itself here when it wraps the model
    # (``self.model.lora_manager = self``); from then on it checks each adapter.
    model.__dict__["_lora_manager"] = manager
    if not check_lora_adapters(manager, model.__dict__[_HOOKS].check_adapter):
        logging.getLogger("vllm.spark2_5_plugin").warning(NO_ADAPTER_CHECKS)
