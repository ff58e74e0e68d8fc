# SPDX-License-Identifier: Apache-2.0
"""Run a registration when a host module is imported, not before (standard library only).

vLLM loads general plugins in every process, but some registries are only ever
imported by one of them (the tool-parser registry by the API server). A carrier
that registers into such a registry at plugin load would import it, and its
dependencies, into every process. :func:`after_import` instead runs the
registration right away where the module is already imported, and otherwise
the moment anything imports it; in processes that never do, it costs nothing.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import threading
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any


class _RunAfterExec(importlib.abc.Loader):
    """Executes the module with its own loader, then runs the callback once."""

    def __init__(self, loader: Any, callback: Callable[[ModuleType], None]) -> None:
        self._loader = loader
        self._callback = callback

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        # The module keeps its real loader (resources, reloads); this one was a detour.
        module.__loader__ = self._loader
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        self._loader.exec_module(module)
        self._callback(module)


class _ImportWatcher(importlib.abc.MetaPathFinder):
    def __init__(self, names: Sequence[str], callback: Callable[[ModuleType], None]) -> None:
        self._names = frozenset(names)
        self._callback = callback
        self._local = threading.local()

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname not in self._names or getattr(self._local, "busy", False):
            return None
        self._local.busy = True
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._local.busy = False
        if spec is None or spec.loader is None:
            return None
        self.remove()
        spec.loader = _RunAfterExec(spec.loader, self._callback)
        return spec

    def remove(self) -> None:
        if self in sys.meta_path:
            sys.meta_path.remove(self)


def after_import(names: Sequence[str], callback: Callable[[ModuleType], None]) -> bool:
    """Call ``callback(module)`` once, with the first of ``names`` to be imported.

    Returns True when it ran now (one of them was already imported), False when
    it waits for the import. ``names`` are alternatives, e.g. a module's current
    and former locations.
    """
    for name in names:
        module = sys.modules.get(name)
        if module is not None:
            callback(module)
            return True
    sys.meta_path.insert(0, _ImportWatcher(names, callback))
    return False
