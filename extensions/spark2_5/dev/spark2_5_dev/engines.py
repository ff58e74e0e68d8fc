"""Starting the in-process engine a driver measures (``VLLM_ENABLE_V1_MULTIPROCESSING=0``)."""

from __future__ import annotations

import contextlib
import importlib
from typing import Any


def in_process_llm(*args: Any, **settings: Any) -> Any:
    """``vllm.LLM(*args, **settings)``, with vLLM's CPU worker imported first, the
    order a worker process has.

    Importing the CPU worker swaps vLLM's host-to-device copy for one that does not
    pin memory. On vLLM 0.23 a model-info cache miss (a first run, a changed model
    file, or another release rewriting the shared cache) imports vLLM's LoRA code
    first in the engine's own process; that code keeps the pinning copy, and a LoRA
    engine fails at warm-up with "Found no NVIDIA driver", for in-tree models too.
    """
    with contextlib.suppress(ModuleNotFoundError):
        importlib.import_module("vllm.v1.worker.cpu_worker")
    from vllm import LLM

    return LLM(*args, **settings)
