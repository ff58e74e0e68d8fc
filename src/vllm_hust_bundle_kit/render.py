# SPDX-License-Identifier: Apache-2.0
"""``manifest.toml`` -> the JSON manifest of each bundle: validate the source, then render.

``manifest.toml`` at a project's root is the only hand-edited description of
the bundles a distribution ships. Its ``[[bundle]]`` tables follow the JSON
manifest, except: the version is ``[project] version`` in ``pyproject.toml``;
TOML has no null (an omitted ``version_range`` renders as null, "not
independently versioned"); ``[[bundle.carriers]]`` are the ``python_module``
implementation items plus the evidence files their status rests on; and
``host.verified_on`` lists the host versions the release was verified on.
Each manifest is written into the package named by the bundle's
``vllm_hust.extension_bundles`` entry point, which must lie inside the project.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

from vllm_hust_bundle_kit.checks import BundleFacts, Carrier, Distribution
from vllm_hust_bundle_kit.checks import first_problem as first_fact_problem
from vllm_hust_bundle_kit.contract import BUNDLE_GROUP, RENDERED_FILENAME, SCHEMA_VERSION
from vllm_hust_bundle_kit.errors import BundleError, Problem, check_nesting, error
from vllm_hust_bundle_kit.files import read_bytes, write_atomically
from vllm_hust_bundle_kit.installed import DOTTED_MODULE, manifests_in, source_package_root
from vllm_hust_bundle_kit.schemas import MANIFEST_VALIDATOR, SOURCE_VALIDATOR
from vllm_hust_bundle_kit.schemas import first_problem as first_schema_problem
from vllm_hust_bundle_kit.versions import host_in_range

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

SOURCE_FILENAME = "manifest.toml"
SUMS_FILENAME = "SHA256SUMS"


@dataclass(frozen=True)
class RenderedManifest:
    path: Path
    text: str

    def is_current(self) -> bool:
        try:
            return self.path.is_file() and self.path.read_text(encoding="utf-8") == self.text
        except (OSError, UnicodeDecodeError):
            return False


@dataclass(frozen=True)
class Project:
    """What ``pyproject.toml`` declares that rendering needs."""

    root: Path
    name: str
    version: str
    entry_points: dict[tuple[str, str], str]

    def bundle_package(self, extension_id: str) -> str | None:
        return self.entry_points.get((BUNDLE_GROUP, extension_id))


def read_toml(path: Path) -> dict[str, Any]:
    data = read_bytes(path, "TOML file")
    try:
        document = tomllib.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise BundleError(f"{path}: not UTF-8 text ({exc.reason})") from None
    except RecursionError:
        raise BundleError(f"{path}: nested too deeply; fix the file") from None
    except tomllib.TOMLDecodeError as exc:
        # The parser reports a position only; quote the line so the key and value show.
        line = re.search(r"at line (\d+)", str(exc))
        lines = data.decode("utf-8").splitlines()
        quoted = ""
        if line and 0 < int(line.group(1)) <= len(lines):
            quoted = f"; the line reads: {lines[int(line.group(1)) - 1].strip()[:120]}"
        raise BundleError(f"{path}: not valid TOML: {exc}{quoted}") from None
    check_nesting(path, document)
    return document


def read_project(root: Path) -> Project:
    pyproject = root / "pyproject.toml"
    project = read_toml(pyproject).get("project", {})
    for key in ("name", "version"):
        if not isinstance(project.get(key), str):
            raise BundleError(
                f"{pyproject}: project.{key}: missing; bundles take their version from "
                "[project] in pyproject.toml, so set it there (not dynamic)"
            )
    entry_points: dict[tuple[str, str], str] = {}
    for group, table in project.get("entry-points", {}).items():
        for name, value in table.items() if isinstance(table, dict) else ():
            if not isinstance(value, str):
                raise error(
                    pyproject,
                    Problem(("project", "entry-points", group, name), value, "must be a string"),
                )
            entry_points[group, name] = value
    return Project(root, project["name"], project["version"], entry_points)


def to_manifest(source: Mapping[str, Any], version: str) -> dict[str, Any]:
    """The JSON manifest for one valid ``[[bundle]]`` of manifest.toml."""
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


def _facts(
    index: int, source: Mapping[str, Any], project: Project, package_root: Path
) -> BundleFacts:
    return BundleFacts(
        prefix=("bundle", index),
        host_range=source["host"]["version_range"],
        protocols=[item["name"] for item in source["protocols"]],
        carriers=[
            Carrier(("bundle", index, "carriers", position), item["module"], item["object"])
            for position, item in enumerate(source["carriers"])
        ],
        components=source.get("components", []),
        activation=source.get("activation", {}),
        distribution=Distribution(
            project.name, project.version, project.entry_points, package_root
        ),
    )


def _inside(root: Path, relative: str) -> Path | None:
    """``root/relative`` resolved, when it is an existing regular file inside ``root``."""
    try:
        if Path(relative).is_absolute():
            return None
        resolved = (root / relative).resolve()
        inside = resolved.is_relative_to(root.resolve())
        return resolved if inside and resolved.is_file() else None
    except (OSError, ValueError, RuntimeError):  # NUL bytes, long names, symlink loops
        return None


def _sums_problem(sums: Path) -> str | None:
    """Why a SHA256SUMS evidence file does not vouch for its folder, or None."""
    try:
        lines = read_bytes(sums, SUMS_FILENAME).decode("utf-8").splitlines()
    except (BundleError, UnicodeDecodeError) as exc:
        return str(exc)
    for line in filter(None, lines):
        digest, _, name = line.partition("  ")
        listed = _inside(sums.parent, name)
        if listed is None:
            return f"lists {name!r}, which is not a file next to it"
        if hashlib.sha256(listed.read_bytes()).hexdigest() != digest:
            return f"{name} does not match its sha256; re-run the evidence or restore the file"
    return None


def _evidence_problems(root: Path, index: int, source: Mapping[str, Any]) -> Iterator[Problem]:
    for carrier_index, carrier in enumerate(source["carriers"]):
        for position, evidence in enumerate(carrier["evidence"]):
            where = ("bundle", index, "carriers", carrier_index, "evidence", position)
            found = _inside(root, evidence)
            if found is None:
                yield Problem(
                    where,
                    evidence,
                    "must be an existing file inside the project, relative to manifest.toml",
                )
            elif found.name == SUMS_FILENAME:
                problem = _sums_problem(found)
                if problem:
                    yield Problem(where, evidence, problem)


def _host_problems(index: int, source: Mapping[str, Any]) -> Iterator[Problem]:
    host = source["host"]
    for position, verified in enumerate(host["verified_on"]):
        if not host_in_range(verified, host["version_range"]):
            yield Problem(
                ("bundle", index, "host", "verified_on", position),
                verified,
                f"is outside host.version_range {host['version_range']!r}; "
                "the range must contain every verified host version",
            )


def _package_folder(project: Project, index: int, extension_id: str) -> tuple[Path, Path]:
    """The package root and folder the bundle's manifest is written to, inside the project."""
    package = project.bundle_package(extension_id)
    where = ("bundle", index, "extension_id")
    if package is None or not DOTTED_MODULE.fullmatch(package):
        raise error(
            project.root / SOURCE_FILENAME,
            Problem(
                where,
                extension_id,
                f"pyproject.toml must declare a {BUNDLE_GROUP} entry point of this name whose "
                "value is the dotted name of the package that holds the bundle's manifest",
            ),
        )
    package_root = source_package_root(project.root, package)
    folder = package_root.joinpath(*package.split(".")) if package_root else None
    if folder is None or not folder.resolve().is_relative_to(project.root.resolve()):
        raise error(
            project.root / SOURCE_FILENAME,
            Problem(
                where,
                extension_id,
                f"package {package} (its {BUNDLE_GROUP} entry point) is not a folder under the "
                "project root or its src/; create it with an __init__.py",
            ),
        )
    others = [path.name for path in manifests_in(folder) if path.name != RENDERED_FILENAME]
    if others:
        raise error(
            project.root / SOURCE_FILENAME,
            Problem(
                where,
                extension_id,
                f"{folder} also holds {', '.join(others)}; a bundle package holds exactly one "
                "manifest, remove the other",
            ),
        )
    return package_root, folder


def _render_one(project: Project, index: int, source: Mapping[str, Any]) -> RenderedManifest:
    source_path = project.root / SOURCE_FILENAME
    package_root, folder = _package_folder(project, index, source["extension_id"])
    problem = (
        next(_host_problems(index, source), None)
        or next(_evidence_problems(project.root, index, source), None)
        or first_fact_problem(_facts(index, source, project, package_root))
    )
    if problem:
        raise error(source_path, problem)
    manifest = to_manifest(source, project.version)
    # A valid source renders a valid manifest; this guards the rendering itself.
    problem = first_schema_problem(MANIFEST_VALIDATOR, manifest)
    if problem:
        raise error(folder / RENDERED_FILENAME, problem)
    return RenderedManifest(folder / RENDERED_FILENAME, json.dumps(manifest, indent=2) + "\n")


def _check_version_and_ids(project: Project, ids: Sequence[str]) -> None:
    """The version renders into every manifest; each bundle has one id and one entry point."""
    pyproject, source_path = project.root / "pyproject.toml", project.root / SOURCE_FILENAME
    try:
        Version(project.version)
    except InvalidVersion as exc:
        problem = Problem(
            ("project", "version"), project.version, f"is not a valid PEP 440 version ({exc})"
        )
        raise error(pyproject, problem) from None
    for group, extension_id in project.entry_points:
        if group == BUNDLE_GROUP and extension_id not in ids:
            raise BundleError(
                f"{pyproject}: project.entry-points.{BUNDLE_GROUP}.{extension_id!r}: no "
                f"[[bundle]] with this extension_id in {source_path}; add one or remove the "
                "entry point"
            )
    for index in range(1, len(ids)):
        if ids[index] in ids[:index]:
            problem = Problem(
                ("bundle", index, "extension_id"),
                ids[index],
                f"duplicate extension_id (also bundle[{ids.index(ids[index])}]); "
                "give each bundle its own",
            )
            raise error(source_path, problem)


def render(root: Path) -> list[RenderedManifest]:
    """Validate ``root/manifest.toml`` and return the JSON manifest of each bundle.

    Nothing is written; see :func:`write`. Raises :class:`BundleError` naming the
    file, the key and the value of the first problem.
    """
    source_path = root / SOURCE_FILENAME
    source = read_toml(source_path)
    problem = first_schema_problem(SOURCE_VALIDATOR, source)
    if problem:
        raise error(source_path, problem)
    project = read_project(root)
    _check_version_and_ids(project, [bundle["extension_id"] for bundle in source["bundle"]])
    return [_render_one(project, index, bundle) for index, bundle in enumerate(source["bundle"])]


def write(rendered: Sequence[RenderedManifest]) -> list[Path]:
    """Write the manifests that changed, each atomically; return their paths."""
    changed = [item for item in rendered if not item.is_current()]
    for item in changed:
        write_atomically(item.path, item.text, 0o644)
    return [item.path for item in changed]
