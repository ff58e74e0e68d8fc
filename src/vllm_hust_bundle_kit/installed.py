# SPDX-License-Identifier: Apache-2.0
"""Installed bundles: found through entry points, checked without importing them.

:func:`discover` iterates the ``vllm_hust.extension_bundles`` entry points and
finds each manifest through its distribution's RECORD (or, for an editable
install, its source folder), the way the extension manager does; :func:`validate`
checks one against the JSON Schema and everything the schema cannot see.
"""

from __future__ import annotations

import importlib.metadata
import json
import re
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.version import Version

from vllm_hust_bundle_kit.checks import BundleFacts, Carrier, Distribution
from vllm_hust_bundle_kit.checks import first_problem as first_fact_problem
from vllm_hust_bundle_kit.contract import ACTIVE, BUNDLE_GROUP, DESCRIPTOR_ONLY, MANIFEST_FILENAMES
from vllm_hust_bundle_kit.errors import BundleError, Problem, error
from vllm_hust_bundle_kit.files import read_json
from vllm_hust_bundle_kit.schemas import MANIFEST_VALIDATOR
from vllm_hust_bundle_kit.schemas import first_problem as first_schema_problem

DOTTED_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")


@dataclass(frozen=True)
class Bundle:
    extension_id: str  # the entry point's name
    manifest: dict[str, Any]
    manifest_path: Path
    distribution: Distribution

    def carriers(self) -> dict[str, str]:
        """``module:object`` -> status of each python_module implementation."""
        return {
            f"{item['module']}:{item['object']}": item["status"]
            for item in self.manifest["implementation"]
            if item["type"] == "python_module"
        }

    def facts(self) -> BundleFacts:
        manifest = self.manifest
        return BundleFacts(
            prefix=(),
            host_range=manifest["host"]["version_range"],
            protocols=[item["name"] for item in manifest["protocols"]],
            carriers=[
                Carrier(("implementation", index), item["module"], item["object"])
                for index, item in enumerate(manifest["implementation"])
                if item["type"] == "python_module"
            ],
            components=manifest.get("components", []),
            activation=manifest.get("activation", {}),
            distribution=self.distribution,
        )


def _identity_problem(bundle: Bundle) -> Problem | None:
    manifest, distribution = bundle.manifest, bundle.distribution
    if manifest["extension_id"] != bundle.extension_id:
        return Problem(
            ("extension_id",),
            manifest["extension_id"],
            f"must equal the {BUNDLE_GROUP} entry point name {bundle.extension_id!r}",
        )
    if Version(manifest["extension_version"]) != Version(distribution.version):
        return Problem(
            ("extension_version",),
            manifest["extension_version"],
            f"must equal the version of distribution {distribution.name} "
            f"({distribution.version}); re-render the manifest",
        )
    return None


def manifest_problem(bundle: Bundle) -> Problem | None:
    """The first problem of ``bundle``'s manifest: schema first, then the rest."""
    return (
        first_schema_problem(MANIFEST_VALIDATOR, bundle.manifest)
        or _identity_problem(bundle)
        or first_fact_problem(bundle.facts())
    )


def validate(bundle: Bundle) -> None:
    """Check an installed bundle's manifest; raise :class:`BundleError` on the first problem."""
    problem = manifest_problem(bundle)
    if problem:
        raise error(bundle.manifest_path, problem)


def activation_blocker(manifest: Mapping[str, Any]) -> str | None:
    """Why the manager refuses to enable the bundle: no active carrier, only descriptor ones."""
    statuses = {item["status"] for item in manifest["implementation"] if "status" in item}
    if ACTIVE in statuses or not statuses & set(DESCRIPTOR_ONLY):
        return None
    return (
        "extension is descriptor-only and cannot be enabled "
        f"(implementation status: {', '.join(sorted(statuses))})"
    )


# --- discovery -------------------------------------------------------------------


def manifests_in(folder: Path) -> list[Path]:
    return [folder / name for name in MANIFEST_FILENAMES if (folder / name).is_file()]


def source_package_root(root: Path, package: str) -> Path | None:
    """The folder holding ``package`` in a source tree: ``root`` or ``root/src``."""
    for base in (root, root / "src"):
        if base.joinpath(*package.split(".")).is_dir():
            return base
    return None


def _editable_root(dist: importlib.metadata.Distribution) -> Path | None:
    try:
        direct_url = json.loads(dist.read_text("direct_url.json") or "{}")
        if not direct_url.get("dir_info", {}).get("editable"):
            return None
        return Path(urllib.request.url2pathname(urllib.parse.urlparse(direct_url["url"]).path))
    except (ValueError, KeyError, TypeError, AttributeError):
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
        package_root = source_package_root(root, package) if root else None
        if package_root:
            recorded = manifests_in(package_root.joinpath(*parts))
    if len(recorded) != 1:
        found = ", ".join(str(path) for path in recorded) or "none"
        raise BundleError(
            f"{where}: package {package} must hold exactly one of "
            f"{', '.join(MANIFEST_FILENAMES)} (found: {found}); reinstall the distribution"
        )
    return recorded[0]


def _found_bundle(entry_point: importlib.metadata.EntryPoint) -> Bundle:
    dist = entry_point.dist
    where = f"{dist.name} {dist.version}: entry point {BUNDLE_GROUP} {entry_point.name!r}"
    if not DOTTED_MODULE.fullmatch(entry_point.value):
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
    return Bundle(
        entry_point.name, read_json(manifest_path, "JSON manifest"), manifest_path, distribution
    )


def discover() -> list[Bundle]:
    """Every installed bundle, from the ``vllm_hust.extension_bundles`` entry points.

    Locates and parses each manifest without importing the bundle's package; call
    :func:`validate` to check one.
    """
    bundles: dict[str, Bundle] = {}
    for entry_point in importlib.metadata.entry_points(group=BUNDLE_GROUP):
        found = _found_bundle(entry_point)
        if found.extension_id in bundles:
            raise BundleError(
                f"{found.distribution.name}: extension id {found.extension_id!r} is also "
                f"provided by distribution {bundles[found.extension_id].distribution.name}; "
                "uninstall one of them"
            )
        bundles[found.extension_id] = found
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
