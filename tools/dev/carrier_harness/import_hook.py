"""The toolkit's deferred-import hook for the harness's per-process hooks, in any
Python the harness's ``sitecustomize`` starts in: also where the project is not
installed yet (the interpreters and pip that ``scripts/setup-env`` runs in a fresh
checkout), which then load the hook from this checkout's ``src/``."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType

_CHECKOUT_COPY = Path(__file__).resolve().parents[3] / "src/vllm_hust_bundle_kit/deferred.py"


def _deferred() -> ModuleType:
    try:
        from vllm_hust_bundle_kit import deferred
    except ImportError:
        spec = importlib.util.spec_from_file_location("_harness_deferred", _CHECKOUT_COPY)
        deferred = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(deferred)
    return deferred


def after_import(names: Sequence[str], callback: Callable[[ModuleType], None]) -> bool:
    """``vllm_hust_bundle_kit.deferred.after_import``: ``callback`` runs on the first
    of ``names`` to be imported, or now when one already is."""
    return _deferred().after_import(names, callback)
