"""Helpers for the extension-bundle tests: this distribution's bundles, found via entry points."""

from __future__ import annotations

import copy
import dataclasses
import shutil
import sys
from pathlib import Path

from vllm_spark2_5_plugin import bundle
from vllm_spark2_5_plugin.bundle import Bundle

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

PROJECT_ROOT = Path(__file__).resolve().parent.parent


def pyproject() -> dict:
    with open(PROJECT_ROOT / "pyproject.toml", "rb") as file:
        return tomllib.load(file)["project"]


def manifest_source() -> dict:
    with open(PROJECT_ROOT / bundle.SOURCE_FILENAME, "rb") as file:
        return tomllib.load(file)


def normalized(name: str) -> str:
    return name.replace("-", "_").replace(".", "_").lower()


def our_bundles() -> list[Bundle]:
    """The installed bundles that this project's distribution ships."""
    name = normalized(pyproject()["name"])
    return [found for found in bundle.discover() if normalized(found.distribution.name) == name]


def with_status(found: Bundle, status: str) -> Bundle:
    """A copy of ``found`` whose carriers all have ``status`` (the installed files are untouched).

    Lets the tests drive both sides of the contract (blocked and enabled) whatever
    status the installed manifest gives the carrier.
    """
    manifest = copy.deepcopy(found.manifest)
    for item in manifest["implementation"]:
        item["status"] = status
    return dataclasses.replace(found, manifest=manifest)


def copy_project(destination: Path) -> Path:
    """Copy what ``render`` reads (pyproject.toml, manifest.toml, src/, the carriers'
    evidence) to ``destination``."""
    for name in ("pyproject.toml", bundle.SOURCE_FILENAME):
        shutil.copy2(PROJECT_ROOT / name, destination / name)
    for tree in ("src", "extensions"):
        shutil.copytree(
            PROJECT_ROOT / tree,
            destination / tree,
            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
        )
    return destination


def fake_host_distribution(directory: Path, name: str, version: str) -> Path:
    """A metadata-only distribution ``name==version`` in ``directory`` (no modules).

    Put first on ``sys.path`` it is what ``importlib.metadata.version(name)``
    reports, the way the CPU build's metadata-only ``vllm`` distribution works.
    """
    dist_info = directory / f"{normalized(name)}-{version}.dist-info"
    dist_info.mkdir(parents=True)
    (dist_info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n", encoding="utf-8"
    )
    return directory
