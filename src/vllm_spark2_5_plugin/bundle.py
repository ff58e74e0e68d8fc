"""Extension bundles: ``manifest.toml`` rendered to the vLLM-HUST manifest, and its contract.

``manifest.toml`` at the project root is the only hand-edited description of the
bundles this distribution ships. :func:`render` turns each ``[[bundle]]`` into the
JSON manifest that the vLLM-HUST extension manager (``vllm-hust-ext``) reads and
writes it into the package named by the bundle's ``vllm_hust.extension_bundles``
entry point. The rest of the module implements the manager's documented
contract, so that the bundle can be checked and enabled where the manager is
not installed:

* :func:`discover` iterates the installed ``vllm_hust.extension_bundles`` entry
  points and finds each manifest through its distribution's RECORD (or, for an
  editable install, its source directory); :func:`validate` checks it with the
  JSON Schema in ``manifest.schema.json`` and resolves every ``module:object`` by
  parsing source, so neither imports plugin code;
* :func:`activation_blocker`, :func:`host_compatibility`, the enable state file
  and :func:`activation_environment` (what enabling bundles injects into a vLLM
  launch, refused while a bundle is blocked or its host is out of range).

Only the standard library, ``packaging`` and ``jsonschema`` are imported at module
level, and nothing from this package, so discovery can run the way the manager
runs it: without importing the carrier.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.metadata
import json
import os
import re
import sys
import tempfile
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator, FormatChecker, ValidationError
from jsonschema.exceptions import best_match
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version
from referencing import Registry, Resource

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

BUNDLE_GROUP = "vllm_hust.extension_bundles"
VLLM_PLUGIN_GROUP = "vllm.general_plugins"
SCHEMA_VERSION = "0.2-experimental"
RENDERED_FILENAME = "vllm-hust-extension-v0.2.json"
# A bundle's package directory holds exactly one of these.
MANIFEST_FILENAMES = ("vllm-hust-extension-v0.3.json", RENDERED_FILENAME)
SOURCE_FILENAME = "manifest.toml"
STATE_ENV = "VLLM_HUST_EXT_CONFIG"
DEFAULT_STATE_PATH = Path("~/.config/vllm-hust-ext/config.json")
PLUGINS_ENV = "VLLM_PLUGINS"
# Computed by the manager on every launch; a bundle's environment must not set them.
MANAGER_OWNED_ENV = (PLUGINS_ENV, "VLLMHUST_EXT_ENABLED_BUNDLES", "VLLM_HUST_EXT_ENABLED_BUNDLES")
# Characters that make a value a shell expression or a placeholder, not a literal.
_NON_LITERAL_CHARS = frozenset("$`<>\n\r\0")


class BundleError(ValueError):
    """One line for the operator: the file, the field, the value and the fix."""


# --- schemas -------------------------------------------------------------------

_FORMATS = FormatChecker(formats=())


@_FORMATS.checks("pep440-version", raises=InvalidVersion)
def _is_version(value: object) -> bool:
    return not isinstance(value, str) or Version(value) is not None


@_FORMATS.checks("pep440-specifier", raises=InvalidSpecifier)
def _is_specifier(value: object) -> bool:
    return not isinstance(value, str) or SpecifierSet(value) is not None


MANIFEST_SCHEMA: dict[str, Any] = json.loads(
    Path(__file__).with_name("manifest.schema.json").read_text(encoding="utf-8")
)
_MANIFEST_ID = MANIFEST_SCHEMA["$id"]
_REGISTRY = Registry().with_resource(_MANIFEST_ID, Resource.from_contents(MANIFEST_SCHEMA))


def _manifest_def(pointer: str) -> dict[str, str]:
    return {"$ref": f"{_MANIFEST_ID}#/{pointer}"}


def _table(required: Sequence[str], **properties: Any) -> dict[str, Any]:
    return {
        "type": "object",
        "additionalProperties": False,
        "required": list(required),
        "properties": properties,
    }


# manifest.toml mirrors the JSON manifest, except: the version comes from
# pyproject.toml, TOML has no null (an omitted version_range renders as null),
# `carriers` are the python_module implementation items plus the evidence their
# status rests on, and `host.verified_on` records the host versions verified.
_SOURCE_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    **_table(
        ["bundle"],
        bundle={
            "type": "array",
            "minItems": 1,
            "items": _table(
                [
                    "extension_id",
                    "kind",
                    "lifecycle_owner",
                    "host",
                    "runtime",
                    "protocols",
                    "carriers",
                    "requires_services",
                ],
                extension_id=_manifest_def("$defs/identifier"),
                kind=_manifest_def("properties/kind"),
                lifecycle_owner=_manifest_def("properties/lifecycle_owner"),
                host=_table(
                    ["provider", "name", "version_range", "verified_on"],
                    provider=_manifest_def("$defs/host/properties/provider"),
                    name=_manifest_def("$defs/host/properties/name"),
                    version_range=_manifest_def("$defs/version_range"),
                    api_range=_manifest_def("$defs/version_range"),
                    verified_on={
                        "type": "array",
                        "minItems": 1,
                        "uniqueItems": True,
                        "items": {"type": "string", "format": "pep440-version"},
                    },
                ),
                runtime=_manifest_def("$defs/runtime"),
                protocols={
                    "type": "array",
                    "items": _table(
                        ["name"],
                        name=_manifest_def("$defs/protocol/properties/name"),
                        version_range=_manifest_def("$defs/version_range"),
                    ),
                },
                carriers={
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        **_table(
                            ["module", "object", "status", "evidence"],
                            module=_manifest_def("$defs/module_path"),
                            object=_manifest_def("$defs/python_name"),
                            status=_manifest_def("$defs/implementation/then/properties/status"),
                            evidence={
                                "description": "files, relative to manifest.toml",
                                "type": "array",
                                "uniqueItems": True,
                                "items": {"type": "string", "minLength": 1},
                            },
                        ),
                        # An active carrier must say what evidence made it active.
                        "if": {"properties": {"status": {"const": "active"}}},
                        "then": {
                            "properties": {
                                "evidence": {
                                    "description": "an active carrier lists the evidence "
                                    "files its status rests on",
                                    "minItems": 1,
                                }
                            }
                        },
                    },
                },
                requires_services={
                    "type": "array",
                    "items": _table(
                        ["service_id", "protocol", "endpoint_config"],
                        service_id=_manifest_def("$defs/service/properties/service_id"),
                        protocol=_manifest_def("$defs/service/properties/protocol"),
                        version_range=_manifest_def("$defs/version_range"),
                        endpoint_config=_manifest_def("$defs/service/properties/endpoint_config"),
                        optional={"type": "boolean"},
                    ),
                },
                components=_manifest_def("properties/components"),
                activation=_manifest_def("$defs/activation"),
            ),
        },
    ),
}

_STATE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["schema_version", "extensions"],
    "properties": {
        "schema_version": {"const": 2},
        "extensions": {
            "type": "object",
            "additionalProperties": {
                "type": "object",
                "required": ["enabled"],
                "properties": {
                    "enabled": {"type": "boolean"},
                    "configuration": {"type": "object"},
                },
            },
        },
    },
}


def _validator(schema: dict[str, Any]) -> Draft202012Validator:
    return Draft202012Validator(schema, registry=_REGISTRY, format_checker=_FORMATS)


_MANIFEST_VALIDATOR = _validator(MANIFEST_SCHEMA)
_SOURCE_VALIDATOR = _validator(_SOURCE_SCHEMA)
_STATE_VALIDATOR = _validator(_STATE_SCHEMA)


# --- error messages --------------------------------------------------------------

_MISSING = object()
_TYPE_NAMES = {
    "string": "a string",
    "array": "an array",
    "object": "a table/object",
    "boolean": "true or false",
}


@dataclass(frozen=True)
class _Problem:
    """What is wrong with one field: its path inside a document, its value, the fix."""

    path: tuple[str | int, ...]
    value: Any
    message: str


def _dotted(path: Sequence[str | int]) -> str:
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else part)
    return text or "(top level)"


def _shown(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= 80 else text[:77] + "..."


def _error(where: str | os.PathLike[str], problem: _Problem) -> BundleError:
    field = _dotted(problem.path)
    if problem.value is _MISSING:
        return BundleError(f"{where}: {field}: {problem.message}")
    return BundleError(f"{where}: {field} = {_shown(problem.value)}: {problem.message}")


def _schema_problem(error: ValidationError) -> _Problem:
    path = tuple(error.absolute_path)
    schema, value, keyword = error.schema, error.instance, error.validator
    if "propertyNames" in error.schema_path:
        return _Problem((*path, value), _MISSING, f"invalid key; use {schema['description']}")
    if keyword == "additionalProperties":
        allowed = sorted(schema.get("properties", {}))
        key = sorted(set(value) - set(allowed))[0]
        return _Problem((*path, key), value[key], f"unknown key; use one of: {', '.join(allowed)}")
    if keyword == "required":
        key = next(name for name in error.validator_value if name not in value)
        return _Problem((*path, key), _MISSING, "required key is missing; add it")
    if keyword == "type":
        expected = error.validator_value
        names = [expected] if isinstance(expected, str) else expected
        return _Problem(path, value, "must be " + " or ".join(_TYPE_NAMES.get(n, n) for n in names))
    if keyword == "enum":
        return _Problem(
            path, value, "must be one of: " + ", ".join(map(str, error.validator_value))
        )
    if keyword == "const":
        return _Problem(path, value, f"must be {_shown(error.validator_value)}")
    if keyword == "format":
        kind = "version" if error.validator_value == "pep440-version" else "version range"
        return _Problem(path, value, f"is not a valid PEP 440 {kind} ({error.cause})")
    if keyword == "pattern":
        rule = schema.get("description", f"a string matching {error.validator_value}")
        return _Problem(path, value, f"must be {rule}")
    if keyword in ("minItems", "minLength"):
        why = f" ({schema['description']})" if "description" in schema else ""
        return _Problem(path, value, f"must not be empty{why}")
    if keyword == "uniqueItems":
        return _Problem(path, value, "lists an item twice; list each once")
    return _Problem(path, value, error.message)


def _first_schema_problem(validator: Draft202012Validator, document: Any) -> _Problem | None:
    error = best_match(validator.iter_errors(document))
    return None if error is None else _schema_problem(error)


# --- versions --------------------------------------------------------------------


def host_in_range(version: str, version_range: str) -> bool:
    """Whether ``version`` satisfies ``version_range`` under the contract's prerelease rule.

    A prerelease or dev host is inside a range only when the range itself names
    a prerelease (PEP 440's default). packaging>=26 admits prereleases in
    ``SpecifierSet.contains`` by default, so the rule is passed explicitly.
    """
    specifiers = SpecifierSet(version_range)
    try:
        parsed = Version(version)
    except InvalidVersion:
        return False
    return specifiers.contains(parsed, prereleases=bool(specifiers.prereleases))


def _range_problem(version_range: str) -> str | None:
    """Why a host range does not pin what was verified, or None."""
    upper = lower = False
    for specifier in SpecifierSet(version_range):
        if specifier.operator in ("==", "===", "~="):
            upper = lower = True
        elif specifier.operator in ("<", "<="):
            upper = True
        elif specifier.operator in (">", ">="):
            lower = lower or Version(specifier.version) > Version("0")
    if upper and lower:
        return None
    return (
        "open-ended range; pin the verified releases with a lower and an upper bound, "
        "e.g. '>=0.32.0,<0.33'"
    )


# --- module:object resolution without importing -----------------------------------


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


def _unresolved(package_root: Path, module: str, name: str) -> str | None:
    """Why ``module:name`` does not resolve under ``package_root`` (parsed, not imported)."""
    source = _module_file(package_root, module)
    if source is None:
        return f"module {module!r} not found under {package_root}"
    tree = ast.parse(source.read_bytes(), filename=str(source))
    if name not in _module_level_names(tree):
        return f"{source} defines no module-level name {name!r}"
    return None


# --- bundles ------------------------------------------------------------------------


@dataclass(frozen=True)
class Distribution:
    """What the checks need to know about the distribution that ships a bundle."""

    name: str
    version: str
    entry_points: Mapping[tuple[str, str], str]  # (group, name) -> value
    package_root: Path  # the directory holding its top-level packages


@dataclass(frozen=True)
class Bundle:
    extension_id: str  # the entry point's name
    manifest: dict[str, Any]
    manifest_path: Path
    distribution: Distribution


def _semantic_problems(bundle: Bundle) -> Iterator[_Problem]:
    """What the JSON Schema cannot check: names, references, versions, ranges."""
    manifest, distribution = bundle.manifest, bundle.distribution
    if manifest["extension_id"] != bundle.extension_id:
        yield _Problem(
            ("extension_id",),
            manifest["extension_id"],
            f"must equal the {BUNDLE_GROUP} entry point name {bundle.extension_id!r}",
        )
    if Version(manifest["extension_version"]) != Version(distribution.version):
        yield _Problem(
            ("extension_version",),
            manifest["extension_version"],
            f"must equal the version of distribution {distribution.name} "
            f"({distribution.version}); re-render the manifest",
        )
    range_problem = _range_problem(manifest["host"]["version_range"])
    if range_problem:
        yield _Problem(("host", "version_range"), manifest["host"]["version_range"], range_problem)

    carriers = set()
    for index, item in enumerate(manifest["implementation"]):
        if item["type"] == "python_module":
            carriers.add(f"{item['module']}:{item['object']}")
            reason = _unresolved(distribution.package_root, item["module"], item["object"])
            if reason:
                yield _Problem(("implementation", index, "object"), item["object"], reason)

    seen_components = set()
    for index, component in enumerate(manifest.get("components", [])):
        if component["component_id"] in seen_components:
            yield _Problem(
                ("components", index, "component_id"),
                component["component_id"],
                "duplicate component_id; give each component its own",
            )
        seen_components.add(component["component_id"])
        module, name = component["implementation_ref"].split(":")
        reason = _unresolved(distribution.package_root, module, name)
        if reason:
            yield _Problem(
                ("components", index, "implementation_ref"), component["implementation_ref"], reason
            )

    activation = manifest.get("activation", {})
    for index, entry_point in enumerate(activation.get("entry_points", [])):
        key = (entry_point["group"], entry_point["name"])
        target = distribution.entry_points.get(key)
        if target is None:
            yield _Problem(
                ("activation", "entry_points", index),
                entry_point,
                f"distribution {distribution.name} installs no such entry point; "
                "declare it in pyproject.toml",
            )
        elif key[0] == VLLM_PLUGIN_GROUP and target not in carriers:
            yield _Problem(
                ("activation", "entry_points", index),
                entry_point,
                f"points at {target}, which is not one of the bundle's carriers; "
                "add it to the carriers so its status is tracked",
            )
    for name, value in activation.get("environment", {}).items():
        if name in MANAGER_OWNED_ENV:
            yield _Problem(
                ("activation", "environment", name),
                value,
                "is computed by the extension manager on launch; remove it",
            )
        elif not value or value != value.strip() or _NON_LITERAL_CHARS & set(value):
            yield _Problem(
                ("activation", "environment", name),
                value,
                "must be the literal value to inject (non-empty, no surrounding spaces, "
                "no $, backquotes or <placeholders>)",
            )


def _manifest_problem(bundle: Bundle) -> _Problem | None:
    return _first_schema_problem(_MANIFEST_VALIDATOR, bundle.manifest) or next(
        _semantic_problems(bundle), None
    )


def validate(bundle: Bundle) -> None:
    """Check an installed bundle's manifest; raise :class:`BundleError` on the first problem."""
    problem = _manifest_problem(bundle)
    if problem:
        raise _error(bundle.manifest_path, problem)


def activation_blocker(manifest: Mapping[str, Any]) -> str | None:
    """Why the bundle cannot be enabled: no active carrier but descriptor-only ones."""
    statuses = {item["status"] for item in manifest["implementation"] if "status" in item}
    if "active" in statuses or not statuses & {"import_only", "legacy_unregistered"}:
        return None
    return (
        "extension is descriptor-only and cannot be enabled "
        f"(implementation status: {', '.join(sorted(statuses))})"
    )


@dataclass(frozen=True)
class HostCompatibility:
    state: str  # compatible, incompatible or unknown
    host_name: str
    host_version: str | None
    version_range: str

    def describe(self) -> str:
        if self.host_version is None:
            return f"host {self.host_name} is not installed ({self.state})"
        relation = "inside" if self.state == "compatible" else "outside"
        return (
            f"host {self.host_name} {self.host_version} is {relation} "
            f"host.version_range {self.version_range!r} ({self.state})"
        )


def host_compatibility(manifest: Mapping[str, Any]) -> HostCompatibility:
    """Compare the installed host distribution with the manifest's host range."""
    host = manifest["host"]
    try:
        version = importlib.metadata.version(host["name"])
    except importlib.metadata.PackageNotFoundError:
        return HostCompatibility("unknown", host["name"], None, host["version_range"])
    state = "compatible" if host_in_range(version, host["version_range"]) else "incompatible"
    return HostCompatibility(state, host["name"], version, host["version_range"])


# --- discovery ----------------------------------------------------------------------


def _manifests_in(directory: Path) -> list[Path]:
    return [directory / name for name in MANIFEST_FILENAMES if (directory / name).is_file()]


def _editable_root(dist: importlib.metadata.Distribution) -> Path | None:
    text = dist.read_text("direct_url.json")
    if not text:
        return None
    direct_url = json.loads(text)
    if not direct_url.get("dir_info", {}).get("editable"):
        return None
    return Path(urllib.request.url2pathname(urllib.parse.urlparse(direct_url["url"]).path))


def _source_package_root(root: Path, package: str) -> Path | None:
    """The directory holding ``package`` in a source tree: ``root`` or ``root/src``."""
    for base in (root, root / "src"):
        if base.joinpath(*package.split(".")).is_dir():
            return base
    return None


def _locate_manifest(dist: importlib.metadata.Distribution, package: str, where: str) -> Path:
    parts = tuple(package.split("."))
    recorded = [
        Path(dist.locate_file(file))
        for file in dist.files or ()
        if file.parent.parts == parts and file.name in MANIFEST_FILENAMES
    ]
    if not recorded:
        # Editable installs record a path hook, not the package files.
        root = _editable_root(dist)
        package_root = _source_package_root(root, package) if root else None
        if package_root:
            recorded = _manifests_in(package_root.joinpath(*parts))
    if len(recorded) != 1:
        found = ", ".join(str(path) for path in recorded) or "none"
        raise BundleError(
            f"{where}: package {package} must hold exactly one of "
            f"{', '.join(MANIFEST_FILENAMES)} (found: {found}); reinstall the distribution"
        )
    return recorded[0]


def _load_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise BundleError(f"{path}: cannot read the JSON manifest ({exc})") from None


def discover() -> list[Bundle]:
    """Every installed bundle, from the ``vllm_hust.extension_bundles`` entry points.

    Locates and parses each manifest without importing the bundle's package; call
    :func:`validate` to check one.
    """
    bundles: dict[str, Bundle] = {}
    for entry_point in importlib.metadata.entry_points(group=BUNDLE_GROUP):
        dist = entry_point.dist
        where = f"{dist.name} {dist.version}: entry point {BUNDLE_GROUP} {entry_point.name!r}"
        if ":" in entry_point.value:
            raise BundleError(
                f"{where} = {entry_point.value!r}: must be a dotted package path without :object"
            )
        manifest_path = _locate_manifest(dist, entry_point.value, where)
        depth = len(entry_point.value.split("."))
        distribution = Distribution(
            name=dist.name,
            version=dist.version,
            entry_points={(ep.group, ep.name): ep.value for ep in dist.entry_points},
            package_root=manifest_path.parent.parents[depth - 1],
        )
        if entry_point.name in bundles:
            other = bundles[entry_point.name].distribution.name
            raise BundleError(
                f"{where}: extension id already provided by distribution {other}; "
                "uninstall one of them"
            )
        bundles[entry_point.name] = Bundle(
            entry_point.name, _load_json(manifest_path), manifest_path, distribution
        )
    return [bundles[extension_id] for extension_id in sorted(bundles)]


def select(bundles: Sequence[Bundle], extension_ids: Sequence[str]) -> list[Bundle]:
    """The bundles named by ``extension_ids`` (all when empty), in the order given."""
    if not extension_ids:
        return list(bundles)
    by_id = {bundle.extension_id: bundle for bundle in bundles}
    for extension_id in extension_ids:
        if extension_id not in by_id:
            installed = ", ".join(by_id) or "none"
            raise BundleError(
                f"extension {extension_id!r} is not installed (installed bundles: {installed})"
            )
    return [by_id[extension_id] for extension_id in dict.fromkeys(extension_ids)]


# --- enable state and launch environment -------------------------------------------------


def state_path(environ: Mapping[str, str] | None = None) -> Path:
    """The manager's state file: ``$VLLM_HUST_EXT_CONFIG`` or the per-user default."""
    env = os.environ if environ is None else environ
    return Path(env[STATE_ENV]) if env.get(STATE_ENV) else DEFAULT_STATE_PATH.expanduser()


def read_state(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {"schema_version": 2, "extensions": {}}
    state = _load_json(path)
    problem = _first_schema_problem(_STATE_VALIDATOR, state)
    if problem:
        raise _error(path, problem)
    return state


def enabled_ids(state: Mapping[str, Any]) -> list[str]:
    return sorted(name for name, entry in state["extensions"].items() if entry["enabled"])


def _write_atomically(path: Path, text: str, mode: int) -> None:
    """Write ``text`` to a temporary file next to ``path``, then rename it over ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            file.write(text)
            file.flush()
            os.fsync(file.fileno())
        os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise


def set_enabled(path: Path, bundle: Bundle, enabled: bool) -> None:
    """Record the intent to enable or disable ``bundle``; runs no plugin code.

    Enabling is refused while :func:`activation_blocker` names a reason.
    """
    if enabled:
        blocker = activation_blocker(bundle.manifest)
        if blocker:
            raise BundleError(f"cannot enable {bundle.extension_id!r}: {blocker}")
    state = read_state(path)
    entry = state["extensions"].get(bundle.extension_id, {})
    state["extensions"][bundle.extension_id] = {
        **entry,
        "enabled": enabled,
        "configuration": entry.get("configuration", {}),
    }
    # The state may carry operator configuration: owner-only, like the manager's.
    _write_atomically(path, json.dumps(state, indent=2, sort_keys=True) + "\n", 0o600)


def launch_refusal(bundle: Bundle) -> str | None:
    """Why a vLLM launch with ``bundle`` enabled must not start, or None."""
    manifest = bundle.manifest
    blocker = activation_blocker(manifest)
    if blocker:
        return blocker
    compatibility = host_compatibility(manifest)
    if compatibility.state == "incompatible" or (
        compatibility.state == "unknown"
        and manifest["runtime"]["isolation"] == "trusted_in_process"
    ):
        return compatibility.describe()
    for protocol in manifest["protocols"]:
        if protocol["version_range"] is not None:
            return (
                f"protocol {protocol['name']} requires {protocol['version_range']!r}, which the "
                "host cannot report"
            )
    required = [s["service_id"] for s in manifest["requires_services"] if not s.get("optional")]
    if required:
        return (
            f"required services {', '.join(required)} need a health check; "
            "launch with vllm-hust-ext run"
        )
    return None


def activation_environment(
    bundles: Sequence[Bundle], environ: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The variables a launch with ``bundles`` enabled adds to ``environ``.

    The union of the bundles' ``activation.environment`` (conflicting values are
    an error), the enabled bundle ids, and ``VLLM_PLUGINS`` extended with the
    bundles' general-plugin names when the launch environment restricts plugins.
    Unset, ``VLLM_PLUGINS`` already loads every plugin, so it stays unset.
    """
    # Imported here so that discovery above never imports the package.
    from vllm_spark2_5_plugin._gate import ENABLED_BUNDLES_ENVS

    env = os.environ if environ is None else environ
    for bundle in bundles:
        refusal = launch_refusal(bundle)
        if refusal:
            raise BundleError(f"refusing to launch {bundle.extension_id!r}: {refusal}")

    injected: dict[str, str] = {}
    owners: dict[str, str] = {}
    plugins: list[str] = []
    for bundle in bundles:
        activation = bundle.manifest.get("activation", {})
        for name, value in activation.get("environment", {}).items():
            if injected.get(name, value) != value:
                raise BundleError(
                    f"{bundle.manifest_path}: activation.environment.{name} = {_shown(value)}: "
                    f"conflicts with {_shown(injected[name])} from {owners[name]}; "
                    "enable only one of them"
                )
            injected[name], owners[name] = value, bundle.extension_id
        plugins += [
            entry_point["name"]
            for entry_point in activation.get("entry_points", [])
            if entry_point["group"] == VLLM_PLUGIN_GROUP
        ]
    if plugins and PLUGINS_ENV in env:
        allowed = [name.strip() for name in env[PLUGINS_ENV].split(",") if name.strip()]
        injected[PLUGINS_ENV] = ",".join(dict.fromkeys([*allowed, *plugins]))
    injected[ENABLED_BUNDLES_ENVS[0]] = ",".join(bundle.extension_id for bundle in bundles)
    return injected


# --- manifest.toml -> JSON ------------------------------------------------------------------


@dataclass(frozen=True)
class RenderedManifest:
    path: Path
    text: str

    def is_current(self) -> bool:
        return self.path.is_file() and self.path.read_text(encoding="utf-8") == self.text


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as file:
            return tomllib.load(file)
    except FileNotFoundError:
        raise BundleError(f"{path}: not found; run from the project root or pass --root") from None
    except tomllib.TOMLDecodeError as exc:
        # The parser reports a position only; quote the line so the key and value show.
        line = re.search(r"at line (\d+)", str(exc))
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
        quoted = ""
        if line and 0 < int(line.group(1)) <= len(lines):
            quoted = f"; the line reads: {lines[int(line.group(1)) - 1].strip()}"
        raise BundleError(f"{path}: not valid TOML: {exc}{quoted}") from None


def _project(root: Path) -> tuple[str, str, dict[tuple[str, str], str]]:
    """Name, version and entry points declared in ``pyproject.toml``."""
    pyproject = root / "pyproject.toml"
    project = _read_toml(pyproject).get("project", {})
    for key in ("name", "version"):
        if not isinstance(project.get(key), str):
            raise BundleError(
                f"{pyproject}: project.{key}: missing; bundles take their version from "
                "[project] in pyproject.toml, so set it there (not dynamic)"
            )
    entry_points = {
        (group, name): value
        for group, table in project.get("entry-points", {}).items()
        for name, value in table.items()
    }
    return project["name"], project["version"], entry_points


def _to_manifest(source: Mapping[str, Any], version: str) -> dict[str, Any]:
    """The JSON manifest for one ``[[bundle]]`` of manifest.toml."""
    manifest = {
        "schema_version": SCHEMA_VERSION,
        "extension_id": source["extension_id"],
        "extension_version": version,
        "kind": source["kind"],
        "host": {key: value for key, value in source["host"].items() if key != "verified_on"},
        "runtime": source["runtime"],
        "lifecycle_owner": source["lifecycle_owner"],
        "protocols": [
            {"name": item["name"], "version_range": item.get("version_range")}
            for item in source["protocols"]
        ],
        "implementation": [
            {"type": "python_module", **{key: item[key] for key in ("module", "object", "status")}}
            for item in source["carriers"]
        ],
        "requires_services": [
            {**item, "version_range": item.get("version_range")}
            for item in source["requires_services"]
        ],
    }
    for optional in ("components", "activation"):
        if optional in source:
            manifest[optional] = source[optional]
    return manifest


def _source_location(index: int, path: tuple[str | int, ...]) -> tuple[str | int, ...]:
    """Where a field of a rendered manifest comes from in manifest.toml."""
    if path[:1] == ("implementation",):
        path = ("carriers", *path[1:])
    return ("bundle", index, *path)


def _source_problems(
    root: Path, index: int, source: Mapping[str, Any], package_dir: Path | None
) -> Iterator[_Problem]:
    """Checks of one ``[[bundle]]`` that only the source can answer."""
    here = ("bundle", index)
    if package_dir is None:
        yield _Problem(
            (*here, "extension_id"),
            source["extension_id"],
            f"pyproject.toml declares no {BUNDLE_GROUP} entry point of this name, or its "
            "package directory does not exist; declare one naming the bundle's package",
        )
        return
    others = [path.name for path in _manifests_in(package_dir) if path.name != RENDERED_FILENAME]
    if others:
        yield _Problem(
            (*here, "extension_id"),
            source["extension_id"],
            f"{package_dir} also holds {', '.join(others)}; a bundle package holds exactly "
            "one manifest, remove the other",
        )
    host = source["host"]
    for position, verified in enumerate(host["verified_on"]):
        if not host_in_range(verified, host["version_range"]):
            yield _Problem(
                (*here, "host", "verified_on", position),
                verified,
                f"is outside host.version_range {host['version_range']!r}; "
                "the range must contain every verified host version",
            )
    for carrier_index, carrier in enumerate(source["carriers"]):
        for position, evidence in enumerate(carrier["evidence"]):
            evidence_path = Path(evidence)
            resolved = (root / evidence_path).resolve()
            if (
                evidence_path.is_absolute()
                or not resolved.is_relative_to(root.resolve())
                or not resolved.is_file()
            ):
                yield _Problem(
                    (*here, "carriers", carrier_index, "evidence", position),
                    evidence,
                    "must be an existing file inside the project, relative to manifest.toml",
                )


def render(root: Path) -> list[RenderedManifest]:
    """Validate ``root/manifest.toml`` and return the JSON manifest of each bundle.

    Nothing is written; see :func:`write`. Raises :class:`BundleError` naming the
    file, the key and the value of the first problem.
    """
    source_path = root / SOURCE_FILENAME
    source = _read_toml(source_path)
    problem = _first_schema_problem(_SOURCE_VALIDATOR, source)
    if problem:
        raise _error(source_path, problem)
    name, version, entry_points = _project(root)

    declared = {key[1]: value for key, value in entry_points.items() if key[0] == BUNDLE_GROUP}
    ids = [bundle["extension_id"] for bundle in source["bundle"]]
    for extension_id in declared:
        if extension_id not in ids:
            raise BundleError(
                f"{root / 'pyproject.toml'}: project.entry-points.{BUNDLE_GROUP}."
                f"{extension_id!r}: no [[bundle]] with this extension_id in {source_path}; "
                "add one or remove the entry point"
            )

    rendered = []
    for index, bundle_source in enumerate(source["bundle"]):
        if bundle_source["extension_id"] in ids[:index]:
            raise _error(
                source_path,
                _Problem(
                    ("bundle", index, "extension_id"),
                    bundle_source["extension_id"],
                    f"duplicate extension_id (also bundle[{ids.index(ids[index])}]); "
                    "give each bundle its own",
                ),
            )
        package = declared.get(bundle_source["extension_id"])
        package_root = _source_package_root(root, package) if package else None
        package_dir = package_root.joinpath(*package.split(".")) if package_root else None
        problem = next(_source_problems(root, index, bundle_source, package_dir), None)
        if problem:
            raise _error(source_path, problem)

        manifest = _to_manifest(bundle_source, version)
        bundle = Bundle(
            extension_id=bundle_source["extension_id"],
            manifest=manifest,
            manifest_path=package_dir / RENDERED_FILENAME,
            distribution=Distribution(name, version, entry_points, package_root),
        )
        problem = _manifest_problem(bundle)
        if problem and problem.path[:1] == ("extension_version",):
            raise _error(
                root / "pyproject.toml", _Problem(("project", "version"), version, problem.message)
            )
        if problem:
            raise _error(
                source_path,
                _Problem(_source_location(index, problem.path), problem.value, problem.message),
            )
        rendered.append(
            RenderedManifest(bundle.manifest_path, json.dumps(manifest, indent=2) + "\n")
        )
    return rendered


def write(rendered: Sequence[RenderedManifest]) -> list[Path]:
    """Write the manifests that changed, each atomically; return their paths."""
    changed = [item for item in rendered if not item.is_current()]
    for item in changed:
        _write_atomically(item.path, item.text, 0o644)
    return [item.path for item in changed]
