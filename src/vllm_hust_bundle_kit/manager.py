"""What the extension manager (``vllm-hust-ext``) would do with installed bundles.

The manager owns its state file and its launches; this module only reads the
state and predicts, as measured against the real manager:

* :func:`state_path`: where the manager keeps its state, found as it finds it;
* :func:`read_state`: the bundles enabled in its state file, and why the
  manager would refuse to run at all (an enabled bundle that is not installed);
* :func:`launch_refusal`: why ``vllm-hust-ext run`` would refuse a bundle;
* :func:`activation_environment`: exactly what ``run --dry-run`` and
  ``extension env`` inject for a set of bundles;
* :func:`overridden_by_launch`: the caller's variables a launch replaces.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from vllm_hust_bundle_kit.contract import (
    ENABLED_BUNDLES_ENVS,
    MANAGER_APP_NAME,
    MANAGER_BUILTIN_PLUGINS,
    PLUGINS_ENV,
    STATE_ENV,
    STATE_FILENAME,
    VLLM_PLUGIN_GROUP,
)
from vllm_hust_bundle_kit.errors import BundleError, error, shown
from vllm_hust_bundle_kit.files import read_json
from vllm_hust_bundle_kit.installed import Bundle, activation_blocker
from vllm_hust_bundle_kit.schemas import STATE_VALIDATOR, first_problem
from vllm_hust_bundle_kit.versions import COMPATIBLE, UNKNOWN, host_compatibility


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
    enabled: tuple[str, ...]
    problem: str | None  # why the manager would refuse `enable`, `disable` and `run`


def read_state(path: Path, installed_ids: Sequence[str]) -> ManagerState:
    """The manager's state file, read only. A missing file enables nothing."""
    if not path.exists() and not path.is_symlink():
        return ManagerState(path, (), None)
    try:
        state = read_json(path, "extension manager's state file")
        problem = first_problem(STATE_VALIDATOR, state)
        if problem:
            raise error(path, problem)
    except BundleError as exc:
        return ManagerState(path, (), str(exc))
    enabled = tuple(sorted(name for name, entry in state["extensions"].items() if entry["enabled"]))
    missing = [name for name in enabled if name not in installed_ids]
    if missing:
        return ManagerState(
            path,
            enabled,
            f"{path}: extensions.{missing[0]}.enabled = true: no installed distribution "
            f"provides {missing[0]!r}, so the manager refuses enable, disable and run of every "
            f"bundle (`enabled Bundles are not installed: {missing}`); remove the entry from "
            "this file or install the bundle",
        )
    return ManagerState(path, enabled, None)


def launch_refusal(bundle: Bundle) -> str | None:
    """Why ``vllm-hust-ext run`` would refuse to launch with ``bundle`` enabled, or None."""
    manifest = bundle.manifest
    blocker = activation_blocker(manifest)
    if blocker:
        return blocker
    compatibility = host_compatibility(manifest)
    if compatibility.state != COMPATIBLE and (
        compatibility.state != UNKNOWN or manifest["runtime"]["isolation"] == "trusted_in_process"
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


def refused_launch(bundle: Bundle) -> str | None:
    """:func:`launch_refusal` as the operator reads it: the manifest, then the manager's words."""
    refusal = launch_refusal(bundle)
    if refusal is None:
        return None
    return f"{bundle.manifest_path}: refusing to launch {bundle.extension_id!r}: {refusal}"


def _general_plugins(bundle: Bundle) -> list[str]:
    return [
        entry_point["name"]
        for entry_point in bundle.manifest.get("activation", {}).get("entry_points", [])
        if entry_point["group"] == VLLM_PLUGIN_GROUP
    ]


def activation_environment(
    bundles: Sequence[Bundle], environ: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The variables a manager launch with ``bundles`` enabled sets on top of ``environ``.

    The union of the bundles' ``activation.environment`` (conflicting values are
    an error; each replaces the caller's value), the enabled bundle ids (empty
    when none is), and, while a bundle declares a ``vllm.general_plugins`` entry
    point, ``VLLM_PLUGINS``: the names already in it, the manager's built-in
    ``ascend``, then the bundles' general plugins. vLLM then loads only those.
    """
    env = os.environ if environ is None else environ
    for bundle in bundles:
        refusal = refused_launch(bundle)
        if refusal:
            raise BundleError(refusal)
    injected: dict[str, str] = {}
    owners: dict[str, str] = {}
    for bundle in bundles:
        for name, value in bundle.manifest.get("activation", {}).get("environment", {}).items():
            if injected.get(name, value) != value:
                raise BundleError(
                    f"{bundle.manifest_path}: activation.environment.{name} = {shown(value)}: "
                    f"conflicts with {shown(injected[name])} from {owners[name]}; "
                    "enable only one of them"
                )
            injected[name], owners[name] = value, bundle.extension_id
    allowed = [name.strip() for name in env.get(PLUGINS_ENV, "").split(",") if name.strip()]
    plugins = [plugin for bundle in bundles for plugin in _general_plugins(bundle)]
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
    """The manager's launch as the state file stands: refused (why), or what it injects;
    ``enabled`` says whether ``bundle`` takes part in it."""
    enabled = bundle.extension_id in state.enabled
    if state.problem:
        return LaunchPrediction(enabled, state.problem, None)
    refusal = refused_launch(bundle)
    if refusal and enabled:
        return LaunchPrediction(enabled, refusal, None)
    by_id = {item.extension_id: item for item in installed_bundles}
    try:  # the launch with every enabled bundle, as the manager makes it
        environment = activation_environment([by_id[i] for i in state.enabled], environ)
    except BundleError as exc:
        return LaunchPrediction(enabled, str(exc), None)
    return LaunchPrediction(enabled, None, environment, refusal)
