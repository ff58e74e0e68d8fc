# SPDX-License-Identifier: Apache-2.0
"""What the extension manager (``vllm-hust-ext``) would do with installed bundles.

The manager owns its state file and its launches; this module only reads the
state and predicts, as its public source and the measured manager behave:

* :func:`state_path`: where the manager keeps its state, found as it finds it;
* :func:`read_state`: the bundles its state file enables (schema 2, or the legacy
  schema-1 list), each entry's ``configuration``, and why the manager would refuse
  to run at all (a file it refuses, an enabled bundle that is not installed, an
  enabled entry's configuration); where ``vllm_hust_ext`` is importable, its own
  reading of the file decides;
* :func:`refused_launch`: why ``vllm-hust-ext run`` would refuse a bundle, its
  entry's configuration (``host_version``, ``protocol_versions``,
  ``launch_options``, ``environment``) applied;
* :func:`activation_environment`: exactly what ``run --dry-run`` and
  ``extension env`` inject for a set of bundles;
* :func:`evidence_refusal`: why a real ``run`` refuses the caller's environment;
* :func:`overridden_by_launch`: the caller's variables a launch replaces.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from vllm_hust_bundle_kit.contract import (
    CONFIGURED_ENVIRONMENT,
    CONFIGURED_HOST_VERSION,
    CONFIGURED_LAUNCH_OPTIONS,
    CONFIGURED_PROTOCOL_VERSIONS,
    ENABLED_BUNDLES_ENVS,
    FLAG_LAUNCH_OPTIONS,
    JSON_LAUNCH_OPTIONS,
    LEGACY_STATE_SCHEMA_VERSION,
    MANAGER_APP_NAME,
    MANAGER_BUILTIN_PLUGINS,
    PLUGINS_ENV,
    RUNTIME_EVIDENCE_ENVS,
    STATE_ENTRY_KEYS,
    STATE_ENV,
    STATE_FILENAME,
    VLLM_PLUGIN_GROUP,
)
from vllm_hust_bundle_kit.errors import BundleError, Problem, encodable, error, shown
from vllm_hust_bundle_kit.files import read_json
from vllm_hust_bundle_kit.installed import Bundle, activation_blocker, validate
from vllm_hust_bundle_kit.schemas import STATE_VALIDATOR, first_problem
from vllm_hust_bundle_kit.versions import (
    COMPATIBLE,
    INCOMPATIBLE,
    host_compatibility,
    host_in_range,
)


def state_path(environ: Mapping[str, str] | None = None) -> Path:
    """The manager's state file: ``$VLLM_HUST_EXT_CONFIG`` when set and not empty, else
    ``config.json`` in platformdirs' per-user config folder of the manager, the very
    call the manager makes (so ``XDG_CONFIG_HOME`` and each platform's rules apply)."""
    env = os.environ if environ is None else environ
    if env.get(STATE_ENV):
        return Path(env[STATE_ENV])
    from platformdirs import user_config_path  # reads the process environment itself

    return user_config_path(MANAGER_APP_NAME) / STATE_FILENAME


WHAT = "extension manager's state file"


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


@dataclass(frozen=True)
class _Reading:
    """The bundles a state file enables and their configurations, as the manager reads it."""

    enabled: tuple[str, ...]
    configurations: dict[str, dict[str, Any]]
    legacy: bool  # schema_version 1: an `enabled` list


def _parse_state(path: Path, document: Any) -> _Reading | str:
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


def _real_manager_reading(path: Path) -> _Reading | str | None:
    """What the installed manager itself reads in ``path``, where ``vllm_hust_ext`` is
    importable: its ``vllm_hust_ext.config.load_config`` (public, and the same call in
    every public version: ``load_config(path) -> UserConfig`` whose ``enabled`` lists the
    ids; the versions that know configurations also have ``extensions``), or its refusal
    as text. None where the manager is not installed (the re-implementation answers).

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
    try:
        config = load_config(path)
        enabled = tuple(config.enabled)
        extensions = getattr(config, "extensions", {})
        configurations = {
            extension_id: dict(getattr(entry, "configuration", {}))
            for extension_id, entry in extensions.items()
        }
    except Exception as exc:  # whatever it raises is its refusal (`run` exits then)
        return f"{type(exc).__name__}: {exc}"
    return _Reading(enabled, configurations, legacy=not extensions and bool(enabled))


def read_state(path: Path, installed_bundles: Sequence[Bundle]) -> ManagerState:
    """The manager's state file, read only, as the manager reads it: no file (or a
    dangling symlink) enables nothing; schema_version 1's ``enabled`` list enables those
    ids; a schema-2 entry without ``enabled`` is not enabled. ``problem`` is the first
    reason the manager's ``run`` would refuse, in its order: the file, an enabled bundle
    that is not installed, then an enabled entry's configuration (once every enabled
    bundle's own checks, :func:`refused_launch`, pass)."""
    try:
        present = path.exists()  # the manager's test: False through a dangling symlink
    except OSError as exc:
        return ManagerState(
            path, (), f"{path}: cannot look up the {WHAT} ({exc.strerror or exc}); fix its folder"
        )
    if not present:
        return ManagerState(path, (), None)
    try:
        reading = _parse_state(path, read_json(path, WHAT))
    except BundleError as exc:  # unreadable, or not JSON: the manager refuses it too
        return ManagerState(path, (), str(exc))
    real = _real_manager_reading(path)
    if real is not None and isinstance(real, str) != isinstance(reading, str):
        # The re-implementation and the installed manager disagree: the manager decides.
        reading = (
            f"{path}: vllm-hust-ext refuses this {WHAT} ({real}); fix the file or remove it"
            if isinstance(real, str)
            else real
        )
    elif isinstance(real, _Reading) and isinstance(reading, _Reading):
        reading = replace(real, legacy=reading.legacy)
    if isinstance(reading, str):
        return ManagerState(path, (), reading)
    state = ManagerState(path, reading.enabled, None, reading.configurations)
    by_id = {bundle.extension_id: bundle for bundle in installed_bundles}
    missing = sorted(i for i in reading.enabled if i not in by_id)
    if missing:
        where = (
            ("enabled", reading.enabled.index(missing[0]))
            if reading.legacy
            else ("extensions", missing[0], STATE_ENTRY_KEYS[0])
        )
        value = missing[0] if reading.legacy else True
        fix = (
            f"no installed distribution provides {missing[0]!r}, so the manager refuses "
            f"enable, disable and run of every bundle (`enabled Bundles are not installed: "
            f"{missing}`); remove the entry from this file or install the bundle"
        )
        return replace(state, problem=str(error(path, Problem(where, value, fix))))
    enabled = [by_id[extension_id] for extension_id in reading.enabled]
    for bundle in enabled:
        try:
            validate(bundle)
        except BundleError as exc:
            return replace(state, problem=f"{exc} (the state file enables {bundle.extension_id})")
    if not any(_refused_by_manifest_or_host(bundle, state) for bundle in enabled):
        for bundle in enabled:
            problem = _configuration_refusal(bundle, state)
            if problem:
                return replace(state, problem=problem)
    return state


@dataclass(frozen=True)
class _Refusal:
    reason: str  # the manager's reason, in this toolkit's words
    field: tuple[str, ...] = ()  # the entry's configuration field it comes from, if one
    value: Any = None
    fix: str = ""


def _refusal(bundle: Bundle, configuration: Mapping[str, Any]) -> _Refusal | None:
    """Why ``run`` refuses ``bundle`` before it plans the launch, in the manager's order:
    not enableable, incompatible (host version, protocol versions), a required service,
    then an unverified trusted in-process bundle. ``configuration`` may set the host
    version and protocol versions the manager judges."""
    manifest = bundle.manifest
    blocker = activation_blocker(manifest)
    if blocker:
        return _Refusal(blocker)
    compatibility = host_compatibility(manifest, configuration)
    host_field = (CONFIGURED_HOST_VERSION,) if compatibility.configured else ()
    host_fix = (
        "remove host_version from the configuration to have the installed "
        f"{compatibility.host_name} judged"
    )
    if compatibility.state == INCOMPATIBLE:
        return _Refusal(
            compatibility.describe(),
            host_field,
            configuration.get(CONFIGURED_HOST_VERSION),
            host_fix,
        )
    supplied = configuration.get(CONFIGURED_PROTOCOL_VERSIONS, {})
    if not isinstance(supplied, dict):
        return _Refusal(
            "must be an object of protocol name -> version; the manager calls the bundle "
            "incompatible (`protocol_versions must be an object`)",
            (CONFIGURED_PROTOCOL_VERSIONS,),
            supplied,
            "fix or remove it",
        )
    unverified = None
    if compatibility.state != COMPATIBLE:
        unverified = _Refusal(
            compatibility.describe(),
            host_field,
            configuration.get(CONFIGURED_HOST_VERSION),
            host_fix if host_field else "",
        )
    for protocol in manifest["protocols"]:
        version_range = protocol["version_range"]
        if version_range is None:  # not independently versioned: the manager skips it
            continue
        version = supplied.get(protocol["name"])
        if version is None:
            unverified = unverified or _Refusal(
                f"protocol {protocol['name']} requires {version_range!r}, which the host "
                "cannot report"
            )
        elif not host_in_range(str(version), version_range):
            return _Refusal(
                f"the configured version {shown(version)} of protocol {protocol['name']} is "
                f"outside {version_range!r} (incompatible)",
                (CONFIGURED_PROTOCOL_VERSIONS, protocol["name"]),
                version,
                "fix or remove it",
            )
    required = [s["service_id"] for s in manifest["requires_services"] if not s.get("optional")]
    if required:
        return _Refusal(
            f"required services {', '.join(required)} need a health check; "
            "launch with vllm-hust-ext run"
        )
    # An unknown host or protocol version keeps only a trusted in-process bundle out.
    if manifest["runtime"]["isolation"] == "trusted_in_process":
        return unverified
    return None


def launch_refusal(bundle: Bundle, configuration: Mapping[str, Any] | None = None) -> str | None:
    """Why ``vllm-hust-ext run`` would refuse to launch with ``bundle`` enabled (its state
    file entry's ``configuration`` as given), or None; the reason alone."""
    refusal = _refusal(bundle, configuration or {})
    return None if refusal is None else refusal.reason


def _refused_by_manifest_or_host(bundle: Bundle, state: ManagerState | None) -> str | None:
    configuration = state.configuration(bundle.extension_id) if state else {}
    refusal = _refusal(bundle, configuration)
    if refusal is None:
        return None
    head = f"refusing to launch {bundle.extension_id!r}: {refusal.reason}"
    if refusal.field and state is not None:
        where = ("extensions", bundle.extension_id, STATE_ENTRY_KEYS[1], *refusal.field)
        fix = f"; {refusal.fix}" if refusal.fix else ""
        return str(
            error(
                state.path,
                Problem(where, refusal.value, head + fix + _configure(bundle.extension_id)),
            )
        )
    return f"{bundle.manifest_path}: {head}"


def _configure(extension_id: str) -> str:
    return (
        f" (`vllm-hust-ext extension configure {extension_id} --file FILE` replaces the "
        "configuration)"
    )


def _configuration_problem(bundle: Bundle, configuration: Mapping[str, Any]) -> Problem | None:
    """What ``run`` refuses (exit 2) in the ``launch_options`` and ``environment`` of a
    vLLM bundle's configuration when it plans the launch; paths within the configuration."""
    options = configuration.get(CONFIGURED_LAUNCH_OPTIONS, {})
    known = (*JSON_LAUNCH_OPTIONS, *FLAG_LAUNCH_OPTIONS)
    if not isinstance(options, dict):
        return Problem(
            (CONFIGURED_LAUNCH_OPTIONS,),
            options,
            "must be an object (the manager: `launch_options must be an object`); fix it",
        )
    unknown = sorted(set(options) - set(known))
    if unknown:
        return Problem(
            (CONFIGURED_LAUNCH_OPTIONS, unknown[0]),
            options[unknown[0]],
            f"unknown launch option, refused by vllm-hust-ext run (`unsupported vLLM "
            f"launch_options: {unknown}`); use one of {', '.join(sorted(known))}, or remove it",
        )
    for name, value in options.items():
        if name in FLAG_LAUNCH_OPTIONS and not isinstance(value, bool):
            return Problem((CONFIGURED_LAUNCH_OPTIONS, name), value, "must be true or false")
        if name in JSON_LAUNCH_OPTIONS and not isinstance(value, dict):
            return Problem((CONFIGURED_LAUNCH_OPTIONS, name), value, "must be an object")
    overrides = configuration.get(CONFIGURED_ENVIRONMENT, {})
    if not isinstance(overrides, dict):
        return Problem(
            (CONFIGURED_ENVIRONMENT,),
            overrides,
            "must be an object of variable -> value (the manager: `environment must be an "
            "object`); fix it",
        )
    declared = bundle.manifest.get("activation", {}).get("environment", {})
    undeclared = sorted(set(overrides) - set(declared))
    if undeclared:
        return Problem(
            (CONFIGURED_ENVIRONMENT, undeclared[0]),
            overrides[undeclared[0]],
            f"not declared in {bundle.manifest_path.name}'s activation.environment "
            f"({', '.join(declared) or 'none'}), refused by vllm-hust-ext run (`environment "
            f"overrides must be declared by the manifest: {undeclared}`); remove it",
        )
    for name, value in overrides.items():
        if not isinstance(value, str):
            return Problem(
                (CONFIGURED_ENVIRONMENT, name),
                value,
                "must be a string (the manager: `environment override values must be strings`)",
            )
        if "\0" in value or not encodable(value):
            return Problem(
                (CONFIGURED_ENVIRONMENT, name),
                value,
                "holds a NUL character or a lone surrogate, which no process environment "
                "can hold (a real vllm-hust-ext run fails on it); fix it",
            )
    return None


def _configuration_refusal(bundle: Bundle, state: ManagerState | None) -> str | None:
    if state is None:
        return None
    problem = _configuration_problem(bundle, state.configuration(bundle.extension_id))
    if problem is None:
        return None
    where = ("extensions", bundle.extension_id, STATE_ENTRY_KEYS[1], *problem.path)
    return str(
        error(
            state.path,
            Problem(where, problem.value, problem.message + _configure(bundle.extension_id)),
        )
    )


def refused_launch(bundle: Bundle, state: ManagerState | None = None) -> str | None:
    """Why ``run`` would refuse ``bundle`` (with its entry's configuration in ``state``) as
    the operator reads it: one line naming the manifest or the state file, the field, the
    value and the fix."""
    return _refused_by_manifest_or_host(bundle, state) or _configuration_refusal(bundle, state)


def configured_environment(bundle: Bundle, configuration: Mapping[str, Any]) -> dict[str, str]:
    """The bundle's ``activation.environment`` with its entry's ``configuration.environment``
    values over the manifest's (for a configuration :func:`refused_launch` accepts)."""
    environment = dict(bundle.manifest.get("activation", {}).get("environment", {}))
    environment.update(configuration.get(CONFIGURED_ENVIRONMENT, {}))
    return environment


def evidence_refusal(environ: Mapping[str, str] | None = None) -> str | None:
    """Why a real ``vllm-hust-ext run`` with a bundle enabled refuses to start in
    ``environ``: it holds one of the manager's runtime-evidence variables (set, even
    empty). ``run --dry-run`` and ``extension env`` do not check this."""
    env = os.environ if environ is None else environ
    held = [name for name in RUNTIME_EVIDENCE_ENVS if name in env]
    if not held:
        return None
    return (
        f"environment: {held[0]} = {shown(env[held[0]])}: vllm-hust-ext run sets "
        f"{', '.join(RUNTIME_EVIDENCE_ENVS)} itself for each launch and refuses to start "
        f"while the caller's environment holds any of them (`vllm-hust-ext owns runtime "
        f"evidence environment variables: {sorted(held)}`); unset {' '.join(held)} before "
        f"vllm-hust-ext run (`env -u {held[0]} vllm-hust-ext run ...`)"
    )


def _general_plugins(bundle: Bundle) -> list[str]:
    return [
        entry_point["name"]
        for entry_point in bundle.manifest.get("activation", {}).get("entry_points", [])
        if entry_point["group"] == VLLM_PLUGIN_GROUP
    ]


def activation_environment(
    bundles: Sequence[Bundle],
    environ: Mapping[str, str] | None = None,
    state: ManagerState | None = None,
) -> dict[str, str]:
    """The variables a manager launch with ``bundles`` enabled sets on top of ``environ``
    (what ``run --dry-run`` and ``extension env`` show), their entries' configurations
    taken from ``state``.

    The union of the bundles' ``activation.environment``, each with its entry's
    ``configuration.environment`` values over the manifest's (conflicting values are an
    error; each replaces the caller's value), the enabled bundle ids (empty when none
    is), and, while a bundle declares a ``vllm.general_plugins`` entry point,
    ``VLLM_PLUGINS``: the names already in it, the manager's built-in ``ascend``, then
    the bundles' general plugins (by bundle id). vLLM then loads only those. Raises
    :class:`BundleError` where ``run`` refuses, in its order: each bundle's manifest and
    host, then each bundle's configuration.
    """
    env = os.environ if environ is None else environ
    for bundle in bundles:
        refusal = _refused_by_manifest_or_host(bundle, state)
        if refusal:
            raise BundleError(refusal)
    for bundle in bundles:
        refusal = _configuration_refusal(bundle, state)
        if refusal:
            raise BundleError(refusal)
    injected: dict[str, str] = {}
    owners: dict[str, str] = {}
    for bundle in bundles:
        configuration = state.configuration(bundle.extension_id) if state else {}
        overridden = configuration.get(CONFIGURED_ENVIRONMENT, {})
        for name, value in configured_environment(bundle, configuration).items():
            if injected.get(name, value) != value:
                if name in overridden and state is not None:
                    where: Path = state.path
                    field_path: tuple[str, ...] = (
                        "extensions",
                        bundle.extension_id,
                        STATE_ENTRY_KEYS[1],
                        CONFIGURED_ENVIRONMENT,
                        name,
                    )
                else:
                    where, field_path = bundle.manifest_path, ("activation", "environment", name)
                raise error(
                    where,
                    Problem(
                        field_path,
                        value,
                        f"conflicts with {shown(injected[name])} from {owners[name]}; "
                        "enable only one of them",
                    ),
                )
            injected[name], owners[name] = value, bundle.extension_id
    allowed = [name.strip() for name in env.get(PLUGINS_ENV, "").split(",") if name.strip()]
    by_id = sorted(bundles, key=lambda bundle: bundle.extension_id)
    plugins = [plugin for bundle in by_id for plugin in _general_plugins(bundle)]
    if plugins:
        names = [*allowed, *MANAGER_BUILTIN_PLUGINS, *plugins]
        injected[PLUGINS_ENV] = ",".join(dict.fromkeys(names))
    injected[ENABLED_BUNDLES_ENVS[0]] = ",".join(bundle.extension_id for bundle in bundles)
    return injected


def overridden_by_launch(
    injected: Mapping[str, str], environ: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The caller's variables that a launch injecting ``injected`` replaces: name -> the
    caller's value. The manager starts the command with its own environment updated by
    what it injects, so a value set before ``vllm-hust-ext run`` never reaches the
    command; one set after ``--`` (``vllm-hust-ext run -- env NAME=VALUE ...``) does."""
    env = os.environ if environ is None else environ
    return {
        name: env[name]
        for name, value in injected.items()
        if name not in (PLUGINS_ENV, *ENABLED_BUNDLES_ENVS) and env.get(name, value) != value
    }


@dataclass(frozen=True)
class LaunchPrediction:
    """What ``vllm-hust-ext run`` would do for one bundle in the current state."""

    enabled: bool
    refusal: str | None  # one line naming the file, the field and the value
    environment: dict[str, str] | None  # what the launch injects, when it would launch
    refusal_once_enabled: str | None = None  # a bundle not enabled: why enabling it fails


def predict_launch(
    bundle: Bundle,
    state: ManagerState,
    installed_bundles: Sequence[Bundle],
    environ: Mapping[str, str] | None = None,
) -> LaunchPrediction:
    """The manager's launch as the state file stands, from ``environ``: refused (why), or
    what it injects; ``enabled`` says whether ``bundle`` takes part in it."""
    enabled = bundle.extension_id in state.enabled
    if state.problem:
        return LaunchPrediction(enabled, state.problem, None)
    refusal = refused_launch(bundle, state)
    if refusal and enabled:
        return LaunchPrediction(enabled, refusal, None)
    by_id = {item.extension_id: item for item in installed_bundles}
    try:  # the launch with every enabled bundle, as the manager makes it
        environment = activation_environment([by_id[i] for i in state.enabled], environ, state)
    except BundleError as exc:
        return LaunchPrediction(enabled, str(exc), None)
    if state.enabled:  # a real run checks the caller's environment last
        evidence = evidence_refusal(environ)
        if evidence:
            return LaunchPrediction(enabled, evidence, None)
    return LaunchPrediction(enabled, None, environment, refusal or evidence_refusal(environ))
