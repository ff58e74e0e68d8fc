"""A Python package's source read without importing it: its modules, the symbols each
defines or re-exports, their signatures and the statements they hold, from ``ast``.

A carrier checks what it calls in a vLLM release that cannot be installed here (a
CUDA wheel, a release no CPU build exists for) by reading that release's files.
Python decides some of this only at run time (a module ``__getattr__``, a base class
from another package); where the source cannot tell, the answers say so instead of
guessing. Knows no carrier.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
from collections.abc import Iterator
from pathlib import Path

P = inspect.Parameter


@dataclasses.dataclass(frozen=True)
class Module:
    name: str
    path: Path
    tree: ast.Module

    @property
    def is_package(self) -> bool:
        return self.path.name == "__init__.py"


@dataclasses.dataclass(frozen=True)
class Found:
    """A symbol where its source defines it: a class, a function, an assignment or a
    module. ``bound``: reached through an instance (or a classmethod through its class),
    so its first parameter is not the caller's. ``outside``: where a name imported from
    outside the tree comes from (``pydantic.BaseModel``); then ``node`` is None."""

    node: ast.AST | None
    module: Module | None
    where: str
    bound: bool = False
    outside: str = ""


class SourceTree:
    """The ``packages`` under ``root``, the folder that holds them (site-packages, an
    unpacked wheel); what they import from other packages is outside the tree, as it
    is in a wheel."""

    def __init__(self, root: Path, packages: tuple[str, ...]) -> None:
        self.root = Path(root)
        self.packages = packages
        self._modules: dict[str, Module | None] = {}

    def module(self, name: str) -> Module | None:
        if name.split(".")[0] not in self.packages:
            return None
        if name not in self._modules:
            base = self.root.joinpath(*name.split("."))
            path = next(
                (p for p in (base / "__init__.py", base.with_suffix(".py")) if p.is_file()), None
            )
            tree = ast.parse(path.read_bytes(), str(path)) if path else None
            self._modules[name] = Module(name, path, tree) if tree else None
        return self._modules[name]

    def files(self) -> list[Path]:
        """The module files read so far."""
        return [module.path for module in self._modules.values() if module]

    def lookup(self, module_name: str, path: tuple[str, ...]) -> Found | None:
        """``module_name``'s symbol at attribute ``path`` (``("Class", "method")``)."""
        module = self.module(module_name)
        if module is None:
            return None
        found: Found | None = Found(module.tree, module, module_name)
        for name in path:
            found = self.member(found, name) if found else None
        return found

    # --- names -------------------------------------------------------------------------

    def resolve(self, module: Module, name: str, depth: int = 0) -> Found | None:
        """What ``name`` is in ``module``'s namespace, following imports and aliases."""
        if depth > 20:
            return None
        node = top_level_bindings(module.tree).get(name)
        if node is None:
            for source in star_imports(module):
                star = self.module(source)
                found = star and self.resolve(star, name, depth + 1)
                if found:
                    return found
            sub = self.module(f"{module.name}.{name}") if module.is_package else None
            if sub:
                return Found(sub.tree, sub, sub.name)
            return lazy_attribute(module, name)
        where = f"{module.name}.{name}"
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            return Found(node, module, where)
        if isinstance(node, ast.ImportFrom):
            source = absolute(module, node)
            original = next(a.name for a in node.names if (a.asname or a.name) == name)
            other = self.module(source)
            if other is None:
                return Found(None, None, where, outside=f"{source}.{original}")
            found = self.resolve(other, original, depth + 1)
            sub = None if found else self.module(f"{source}.{original}")
            return found or (Found(sub.tree, sub, sub.name) if sub else None)
        if isinstance(node, ast.Import):  # import a.b as name; import name.b
            aliases = [a.name for a in node.names if a.asname == name] or [name]
            imported = self.module(aliases[0])
            return Found(imported.tree, imported, aliases[0]) if imported else None
        return self._assigned(module, node, where, depth)

    def _assigned(self, module: Module, node: ast.AST, where: str, depth: int) -> Found:
        value = getattr(node, "value", None)
        if isinstance(value, ast.Name):  # an alias
            return self.resolve(module, value.id, depth + 1) or Found(node, module, where)
        if isinstance(value, ast.Call):  # an instance of one of the tree's classes
            cls = self.expression(module, value.func)
            if cls and isinstance(cls.node, ast.ClassDef):
                return Found(cls.node, cls.module, where, bound=True)
        return Found(node, module, where)

    def expression(self, module: Module, expr: ast.expr) -> Found | None:
        """What a name or dotted name written in ``module`` refers to."""
        if isinstance(expr, ast.Subscript):  # Generic[T], Base[Config]
            return self.expression(module, expr.value)
        if isinstance(expr, ast.Name):
            return self.resolve(module, expr.id)
        if isinstance(expr, ast.Attribute):
            owner = self.expression(module, expr.value)
            if owner and owner.outside:
                return Found(None, None, expr.attr, outside=f"{owner.outside}.{expr.attr}")
            return self.member(owner, expr.attr) if owner else None
        return None

    # --- members -----------------------------------------------------------------------

    def member(self, owner: Found, name: str) -> Found | None:
        if isinstance(owner.node, ast.Module):
            return self.resolve(owner.module, name)
        if isinstance(owner.node, ast.ClassDef):
            return self.class_member(owner, name)
        return None

    def class_member(self, owner: Found, name: str) -> Found | None:
        """``name`` in the class body, as an attribute its methods set on ``self``, or
        in a base class of the tree (first found, in the order of the bases)."""
        for cls, module in self.classes(owner):
            where = f"{module.name}.{cls.name}.{name}"
            node = class_bindings(cls).get(name) or instance_attribute(cls, name)
            if node is None:
                continue
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                kinds = decorator_names(node)
                bound = "classmethod" in kinds or (owner.bound and "staticmethod" not in kinds)
                return Found(node, module, where, bound=bound)
            return Found(node, module, where)
        return None

    def classes(self, owner: Found) -> Iterator[tuple[ast.ClassDef, Module]]:
        """The class and its bases that the tree defines, depth first."""
        seen: set[int] = set()
        pending = [(owner.node, owner.module)]
        while pending:
            cls, module = pending.pop(0)
            if id(cls) in seen:
                continue
            seen.add(id(cls))
            yield cls, module
            for base in cls.bases:
                found = self.expression(module, base)
                if found and isinstance(found.node, ast.ClassDef):
                    pending.append((found.node, found.module))

    def outside_bases(self, owner: Found) -> list[str]:
        """The bases of the class and its tree-defined bases that come from elsewhere."""
        names = []
        for cls, module in self.classes(owner):
            for base in cls.bases:
                found = self.expression(module, base)
                if found is None or found.outside:
                    names.append(found.outside if found else ast.unparse(base))
        return names

    # --- what a symbol holds -----------------------------------------------------------

    def statements(self, found: Found, depth: int = 2) -> list[str]:
        """Each assignment and call in ``found`` as ``ast.unparse`` writes it, and in the
        functions of its module it calls by name, ``depth`` calls deep."""
        texts = []
        for node in ast.walk(found.node):
            if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.Call)):
                texts.append(ast.unparse(node))
            if depth and isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                callee = top_level_bindings(found.module.tree).get(node.func.id)
                if isinstance(callee, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    texts += self.statements(Found(callee, found.module, ""), depth - 1)
        return texts


# --- signatures --------------------------------------------------------------------------

EMPTY = P.empty


def signature(tree: SourceTree, found: Found) -> inspect.Signature | None:
    """How ``found`` is called, as ``inspect.signature`` would say; None where the
    source cannot tell (a class whose constructor comes from outside the tree)."""
    if isinstance(found.node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return function_signature(found.node, found.bound)
    if not isinstance(found.node, ast.ClassDef):
        return None
    as_class = dataclasses.replace(found, bound=False)
    outside = tree.outside_bases(as_class)
    if any(base.startswith("pydantic.") for base in outside):
        return _unchecked(fields(tree, as_class, pydantic=True))
    if "dataclass" in decorator_names(found.node) and "__init__" not in class_bindings(found.node):
        return _unchecked(fields(tree, as_class, pydantic=False))
    init = tree.class_member(dataclasses.replace(found, bound=True), "__init__")
    if init is not None:
        return function_signature(init.node, bound=True)
    return None if outside else inspect.Signature()


def _unchecked(parameters: list[P]) -> inspect.Signature:
    # Dataclass fields may put a field without a default after one with a default
    # (keyword-only ones): only binding matters here, not the order's validity.
    return inspect.Signature(parameters, __validate_parameters__=False)


def function_signature(
    node: ast.FunctionDef | ast.AsyncFunctionDef, bound: bool
) -> inspect.Signature:
    args = node.args
    positional = [*args.posonlyargs, *args.args]
    defaults = [EMPTY] * (len(positional) - len(args.defaults)) + [None] * len(args.defaults)
    kinds = [P.POSITIONAL_ONLY] * len(args.posonlyargs) + [P.POSITIONAL_OR_KEYWORD] * len(args.args)
    params = [
        P(a.arg, kind, default=d) for a, kind, d in zip(positional, kinds, defaults, strict=True)
    ]
    params = params[1:] if bound else params
    if args.vararg:
        params.append(P(args.vararg.arg, P.VAR_POSITIONAL))
    for arg, default in zip(args.kwonlyargs, args.kw_defaults, strict=True):
        params.append(P(arg.arg, P.KEYWORD_ONLY, default=EMPTY if default is None else None))
    if args.kwarg:
        params.append(P(args.kwarg.arg, P.VAR_KEYWORD))
    return _unchecked(params)


def fields(tree: SourceTree, found: Found, pydantic: bool) -> list[P]:
    """A dataclass's or pydantic model's fields, bases' first: keyword-only for
    pydantic (``extra=`` only decides what unknown keywords do)."""
    chain = [cls for cls, _ in tree.classes(found)]
    chosen: dict[str, P] = {}
    for cls in reversed(chain):
        keyword_only = pydantic
        for node in cls.body:
            if not isinstance(node, ast.AnnAssign) or not isinstance(node.target, ast.Name):
                continue
            name, annotation = node.target.id, ast.unparse(node.annotation)
            if annotation.endswith("KW_ONLY"):
                keyword_only = True
                continue
            if "ClassVar" in annotation or (pydantic and name.startswith("_")):
                continue
            default = _field_default(node.value)
            if default is False:  # field(init=False)
                continue
            kind = P.KEYWORD_ONLY if keyword_only else P.POSITIONAL_OR_KEYWORD
            chosen.pop(name, None)
            chosen[name] = P(name, kind, default=None if default else EMPTY)
    return list(chosen.values())


def _field_default(value: ast.expr | None) -> bool | None:
    """Whether a field declared ``= value`` has a default (None: none), False for a
    dataclass field left out of ``__init__``."""
    if value is None:
        return None
    if not (isinstance(value, ast.Call) and ast.unparse(value.func).endswith(("field", "Field"))):
        return True
    keywords = {k.arg: k.value for k in value.keywords}
    if isinstance(keywords.get("init"), ast.Constant) and keywords["init"].value is False:
        return False
    if "default" in keywords or "default_factory" in keywords:
        return True
    first = value.args[0] if value.args else None
    return (
        True
        if first is not None and not (isinstance(first, ast.Constant) and first.value is Ellipsis)
        else None
    )


# --- reading one module -------------------------------------------------------------------


def _body_statements(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Top-level statements, into ``if``/``try`` blocks but not ``if TYPE_CHECKING``."""
    for node in body:
        if isinstance(node, ast.If):
            if "TYPE_CHECKING" not in ast.unparse(node.test):
                yield from _body_statements(node.body)
            yield from _body_statements(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, *(h.body for h in node.handlers), node.orelse):
                yield from _body_statements(block)
        else:
            yield node


def _bindings(body: list[ast.stmt]) -> dict[str, ast.AST]:
    names: dict[str, ast.AST] = {}
    for node in _body_statements(body):
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            names[node.name] = node
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                if alias.name != "*":
                    names[alias.asname or alias.name.split(".")[0]] = node
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name):
                    names[target.id] = node
    return names


def lazy_attribute(module: Module, name: str) -> Found | None:
    """``name`` where the module's ``__getattr__`` makes it on first use (vLLM's
    ``current_platform``): found, but nothing about it can be read."""
    getter = top_level_bindings(module.tree).get("__getattr__")
    if isinstance(getter, ast.FunctionDef) and any(
        isinstance(node, ast.Constant) and node.value == name for node in ast.walk(getter)
    ):
        return Found(None, module, f"{module.name}.__getattr__({name!r})")
    return None


def top_level_bindings(tree: ast.Module) -> dict[str, ast.AST]:
    return _bindings(tree.body)


def class_bindings(cls: ast.ClassDef) -> dict[str, ast.AST]:
    return _bindings(cls.body)


def instance_attribute(cls: ast.ClassDef, name: str) -> ast.AST | None:
    """The first ``self.<name> = ...`` in a method of ``cls``."""
    for method in cls.body:
        if isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef)) and method.args.args:
            me = method.args.args[0].arg
            for node in ast.walk(method):
                targets = getattr(node, "targets", None) or [getattr(node, "target", None)]
                for target in targets:
                    if (
                        isinstance(target, ast.Attribute)
                        and target.attr == name
                        and isinstance(target.value, ast.Name)
                        and target.value.id == me
                    ):
                        return node
    return None


def star_imports(module: Module) -> list[str]:
    return [
        absolute(module, node)
        for node in _body_statements(module.tree.body)
        if isinstance(node, ast.ImportFrom) and any(a.name == "*" for a in node.names)
    ]


def absolute(module: Module, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = module.name.split(".")
    package = package if module.is_package else package[:-1]
    base = package[: len(package) - node.level + 1]
    return ".".join([*base, *([node.module] if node.module else [])])


def decorator_names(node: ast.AST) -> set[str]:
    names = set()
    for decorator in getattr(node, "decorator_list", []):
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        names.add(ast.unparse(target).rsplit(".", 1)[-1])
    return names
