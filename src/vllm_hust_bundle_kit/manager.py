"""What the extension manager (``vllm-hust-ext``) would do with installed bundles.

The manager owns its state file and its launches; this module only reads the
state and predicts, as measured against the real manager:

* :func:`read_state`: the bundles enabled in its state file, and why the
  manager would refuse to run at all (an enabled bundle that is not installed);
* :func:`launch_refusal`: why ``vllm-hust-ext run`` would refuse a bundle;
* :func:`activation_environment`: exactly what ``run --dry-run`` and
  ``extension env`` inject for a set of bundles.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vllm_hust_bundle_kit.contract import (
    DEFAULT_STATE_PATH,
    ENABLED_BUNDLES_ENVS,
    MANAGER_BUILTIN_PLUGINS,
    PLUGINS_ENV,
    STATE_ENV,
    VLLM_PLUGIN_GROUP,
)
from vllm_hust_bundle_kit.errors import BundleError, error, shown
from vllm_hust_bundle_kit.files import read_json
from vllm_hust_bundle_kit.installed import Bundle, activation_blocker
from vllm_hust_bundle_kit.schemas import STATE_VALIDATOR, first_problem
from vllm_hust_bundle_kit.versions import COMPATIBLE, UNKNOWN, host_compatibility


def state_path(environ: Mapping[str, str] | None = None) -> Path:
    """The manager's state file: ``$VLLM_HUST_EXT_CONFIG`` or the per-user default."""
    env = os.environ if environ is None else environ
    return Path(env[STATE_ENV]) if env.get(STATE_ENV) else Path(DEFAULT_STATE_PATH).expanduser()


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
            f"{path}: enabled Bundles are not installed: {missing}; the manager refuses "
            "enable, disable and run until they are installed or removed from this file",
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
    an error), the enabled bundle ids, and always ``VLLM_PLUGINS``: the names
    already in it, the manager's built-in ``ascend``, then the bundles' general
    plugins. vLLM then loads only those general plugins.
    """
    env = os.environ if environ is None else environ
    for bundle in bundles:
        refusal = launch_refusal(bundle)
        if refusal:
            raise BundleError(f"refusing to launch {bundle.extension_id!r}: {refusal}")
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
    injected[PLUGINS_ENV] = ",".join(dict.fromkeys([*allowed, *MANAGER_BUILTIN_PLUGINS, *plugins]))
    injected[ENABLED_BUNDLES_ENVS[0]] = ",".join(bundle.extension_id for bundle in bundles)
    return injected


def describe_state(state: ManagerState, bundle_id: str) -> dict[str, Any]:
    return {
        "state_file": str(state.path),
        "enabled": bundle_id in state.enabled,
        "problem": state.problem,
    }
