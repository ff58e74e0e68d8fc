# SPDX-License-Identifier: Apache-2.0
"""Resolve ``module:object`` references by parsing source, never importing it.

Discovery must not run a carrier's code, so a reference counts as resolved when
the module's file binds the name at module level (a ``def``, ``class``, import
or assignment).
"""

from __future__ import annotations

import ast
from pathlib import Path


def _module_file(package_root: Path, module: str) -> Path | None:
    base = package_root.joinpath(*module.split("."))
    for candidate in (base.with_name(base.name + ".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _module_level_names(tree: ast.Module) -> set[str]:
    """Names a module binds at import time: defs, classes, imports, assignments."""
    names: set[str] = set()
    pending: list[ast.AST] = list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            continue  # their bodies bind nothing at module level
        if isinstance(node, (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp)):
            continue
        if isinstance(node, ast.alias):
            names.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        pending.extend(ast.iter_child_nodes(node))
    return names


def unresolved(package_root: Path, module: str, name: str) -> str | None:
    """Why ``module:name`` does not resolve under ``package_root``, or None."""
    source = _module_file(package_root, module)
    if source is None:
        return f"module {module!r} not found under {package_root}"
    try:
        tree = ast.parse(source.read_bytes(), filename=str(source))
    except (OSError, SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        return f"{source} cannot be parsed ({type(exc).__name__}: {exc}); fix the module"
    if name not in _module_level_names(tree):
        return f"{source} defines no module-level name {name!r}"
    return None
