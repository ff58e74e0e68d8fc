# SPDX-License-Identifier: Apache-2.0
"""The extension manager's state file: where it is and what it enables.

The manager (``vllm-hust-ext``) owns the file; this module only reads it, as the
manager's public source and the measured manager read it. :func:`state_path` finds
it; :func:`read_state` reads it once into a :class:`ManagerState`: the bundles it
enables (schema 2, or the legacy schema-1 list), each entry's ``configuration``,
and why the manager would refuse to run at all (a file it refuses, an enabled
bundle that is not installed, an enabled entry's configuration). Where
``vllm_hust_ext`` is importable, its own reading of the file decides.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from vllm_hust_bundle_kit.contract import (
    LEGACY_STATE_SCHEMA_VERSION,
    MANAGER_APP_NAME,
    STATE_ENTRY_KEYS,
    STATE_ENV,
    STATE_FILENAME,
)
from vllm_hust_bundle_kit.errors import BundleError, Problem, error
from vllm_hust_bundle_kit.files import parse_json, read_text
from vllm_hust_bundle_kit.installed import Bundle, validate
from vllm_hust_bundle_kit.manager_refusals import configuration_refusal, manifest_or_host_refusal
from vllm_hust_bundle_kit.schemas import STATE_VALIDATOR, first_problem

WHAT = "extension manager's state file"


def state_path(environ: Mapping[str, str] | None = None) -> Path:
    """The manager's state file: ``$VLLM_HUST_EXT_CONFIG`` when set and not empty, else
    ``config.json`` in platformdirs' per-user config folder of the manager, the very
    call the manager makes (so ``XDG_CONFIG_HOME`` and each platform's rules apply)."""
    env = os.environ if environ is None else environ
    if env.get(STATE_ENV):
        return Path(env[STATE_ENV])
    from platformdirs import user_config_path  # reads the process environment itself

    return user_config_path(MANAGER_APP_NAME) / STATE_FILENAME


@dataclass(frozen=True)
class ManagerState:
    path: Path
    enabled: tuple[str, ...]  # in the state file's order, the order the manager launches them
    # Why the manager's `run` would refuse every launch, as one line: a state file it
    # refuses (then `enable` and `disable` fail too), an enabled bundle that is not
    # installed (likewise), or an enabled entry's configuration.
    problem: str | None
    # Each entry's `configuration` (`vllm-hust-ext extension configure`), enabled or not.
    configurations: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def configuration(self, extension_id: str) -> Mapping[str, Any]:
        return self.configurations.get(extension_id, {})

    def configuration_error(
        self, extension_id: str, within: tuple[str | int, ...], value: Any, message: str
    ) -> BundleError:
        """One line naming the field ``within`` the entry's configuration, and its fix."""
        where = ("extensions", extension_id, STATE_ENTRY_KEYS[1], *within)
        return error(self.path, Problem(where, value, message))


@dataclass(frozen=True)
class _Reading:
    """The bundles a state file enables and their configurations, as the manager reads it."""

    enabled: tuple[str, ...]
    configurations: dict[str, dict[str, Any]]
    legacy: bool  # schema_version 1: an `enabled` list


def _toolkit_reading(path: Path, document: Any) -> _Reading | str:
    """The manager's reading of a parsed state file, or why it refuses the file."""
    if isinstance(document, dict) and document.get("schema_version") is True:
        # The manager asks `schema_version == 1`, which Python answers yes for true.
        document = {**document, "schema_version": LEGACY_STATE_SCHEMA_VERSION}
    problem = first_problem(STATE_VALIDATOR, document)
    if problem:
        return str(error(path, problem))
    if document["schema_version"] == LEGACY_STATE_SCHEMA_VERSION:
        ids = tuple(dict.fromkeys(document.get("enabled", [])))
        return _Reading(ids, {extension_id: {} for extension_id in ids}, legacy=True)
    entries = document.get("extensions", {})
    return _Reading(
        tuple(i for i, entry in entries.items() if entry.get(STATE_ENTRY_KEYS[0], False)),
        {i: entry.get(STATE_ENTRY_KEYS[1], {}) for i, entry in entries.items()},
        legacy=False,
    )


@contextlib.contextmanager
def _copy_of(text: str) -> Iterator[Path | None]:
    """A private file holding ``text`` while in use, or None where none can be written."""
    try:
        folder = tempfile.mkdtemp(prefix="state-snapshot-")
    except OSError:
        yield None
        return
    try:
        snapshot = Path(folder) / STATE_FILENAME
        try:
            snapshot.write_text(text, encoding="utf-8")
        except OSError:
            snapshot = None
        yield snapshot
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _installed_manager_reading(text: str) -> _Reading | str | None:
    """What the installed manager itself reads in ``text`` (the state file as the toolkit
    read it), where ``vllm_hust_ext`` is importable: its ``vllm_hust_ext.config.load_config``
    (public, and the same call in every public version: ``load_config(path) -> UserConfig``
    whose ``enabled`` lists the ids; the versions that know configurations also have
    ``extensions``), given a private copy of ``text`` so that both readings are of one
    read of the file, or its refusal as text. None where the manager is not installed
    (the toolkit's reading answers).

    Only the state file is asked this way. The launch itself (merging the bundles'
    variables, ``VLLM_PLUGINS``, the runtime-evidence check) is done by private
    functions of ``vllm_hust_ext.cli``, and its public ``main`` prints, exits through
    argparse and reads the process environment; so the launch stays predicted here,
    and tests/test_bundle_contract.py and tests/test_manager_state.py hold the
    prediction against ``vllm-hust-ext run`` wherever the manager is installed.
    """
    try:
        from vllm_hust_ext.config import load_config
    except Exception:  # not installed, or not importable: not asked
        return None
    with _copy_of(text) as snapshot:
        if snapshot is None:  # no room for the copy: the toolkit's reading answers
            return None
        try:
            config = load_config(snapshot)
            enabled = tuple(config.enabled)
            extensions = getattr(config, "extensions", {})
            configurations = {
                extension_id: dict(getattr(entry, "configuration", {}))
                for extension_id, entry in extensions.items()
            }
        except Exception as exc:  # whatever it raises is its refusal (`run` exits then)
            return f"{type(exc).__name__}: {exc}"
    return _Reading(enabled, configurations, legacy=not extensions and bool(enabled))


def _deciding_reading(path: Path, text: str, document: Any) -> _Reading | str:
    """The reading of ``document`` (``text``, the file at ``path``) that decides: the installed
    manager's where it is importable, else the toolkit's. Where both refuse the file,
    the toolkit's words stand: they name the field; where both accept it, the toolkit
    says whether it is the legacy list, which the manager's reading no longer shows."""
    ours = _toolkit_reading(path, document)
    theirs = _installed_manager_reading(text)
    if theirs is None:
        return ours
    if isinstance(theirs, str):
        if isinstance(ours, str):
            return ours
        return f"{path}: vllm-hust-ext refuses this {WHAT} ({theirs}); fix the file or remove it"
    return theirs if isinstance(ours, str) else replace(theirs, legacy=ours.legacy)


def read_state(path: Path, installed_bundles: Sequence[Bundle]) -> ManagerState:
    """The manager's state file, read once and only read, as the manager reads it: no
    file (or a dangling symlink) enables nothing; schema_version 1's ``enabled`` list
    enables those ids; a schema-2 entry without ``enabled`` is not enabled. ``problem``
    is the first reason the manager's ``run`` would refuse, in its order: the file, an
    enabled bundle that is not installed, then an enabled bundle's own checks and its
    entry's configuration."""
    try:
        present = path.exists()  # the manager's test: False through a dangling symlink
    except OSError as exc:
        return ManagerState(
            path, (), f"{path}: cannot look up the {WHAT} ({exc.strerror or exc}); fix its folder"
        )
    if not present:
        return ManagerState(path, (), None)
    try:
        text = read_text(path, WHAT)
        document = parse_json(path, text, WHAT)
    except BundleError as exc:  # unreadable, or not JSON: the manager refuses it too
        return ManagerState(path, (), str(exc))
    reading = _deciding_reading(path, text, document)
    if isinstance(reading, str):
        return ManagerState(path, (), reading)
    state = ManagerState(path, reading.enabled, None, reading.configurations)
    by_id = {bundle.extension_id: bundle for bundle in installed_bundles}
    problem = _not_installed(path, reading, by_id) or _enabled_bundles_refusal(
        state, [by_id[extension_id] for extension_id in reading.enabled]
    )
    return replace(state, problem=problem)


def _not_installed(path: Path, reading: _Reading, by_id: Mapping[str, Bundle]) -> str | None:
    """The manager's refusal of every command while an enabled bundle is not installed,
    naming that bundle's place in the file (the first missing id, sorted)."""
    missing = sorted(i for i in reading.enabled if i not in by_id)
    if not missing:
        return None
    if reading.legacy:
        where, value = ("enabled", reading.enabled.index(missing[0])), missing[0]
    else:
        where, value = ("extensions", missing[0], STATE_ENTRY_KEYS[0]), True
    fix = (
        f"no installed distribution provides {missing[0]!r}, so the manager refuses "
        f"enable, disable and run of every bundle (`enabled Bundles are not installed: "
        f"{missing}`); remove the entry from this file or install the bundle"
    )
    return str(error(path, Problem(where, value, fix)))


def _enabled_bundles_refusal(state: ManagerState, enabled: Sequence[Bundle]) -> str | None:
    """Why ``run`` refuses the launch with ``enabled``: a bundle's invalid manifest, else
    an entry's configuration once every bundle passes its own checks (``run`` refuses on
    those first, and they are that bundle's finding, not the state file's)."""
    for bundle in enabled:
        try:
            validate(bundle)
        except BundleError as exc:
            return f"{exc} (the state file enables {bundle.extension_id})"
    if any(manifest_or_host_refusal(bundle, state) for bundle in enabled):
        return None
    for bundle in enabled:
        refusal = configuration_refusal(bundle, state)
        if refusal:
            return refusal
    return None
