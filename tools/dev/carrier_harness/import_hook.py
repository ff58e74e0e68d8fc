"""The toolkit's deferred-import hook for the harness's per-process hooks, loaded
from this checkout's ``src/`` under a private name: a process the harness runs (as a
CPU class, engine-free) imports no module of the project it would not import on its
own (tests count them), and it works where the project is not installed yet (the
interpreters and pip that ``scripts/setup-env`` runs in a fresh checkout)."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType

_NAME = "_carrier_harness_deferred"
_SOURCE = Path(__file__).resolve().parents[3] / "src/vllm_hust_bundle_kit/deferred.py"


def _deferred() -> ModuleType:
    if _NAME not in sys.modules:
        spec = importlib.util.spec_from_file_location(_NAME, _SOURCE)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[_NAME] = module
    return sys.modules[_NAME]


def after_import(names: Sequence[str], callback: Callable[[ModuleType], None]) -> bool:
    """``vllm_hust_bundle_kit.deferred.after_import``: ``callback`` runs on the first
    of ``names`` to be imported, or now when one already is."""
    return _deferred().after_import(names, callback)
