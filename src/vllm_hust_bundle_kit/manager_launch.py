# SPDX-License-Identifier: Apache-2.0
"""What a launch by the extension manager (``vllm-hust-ext run``) would set, or why not.

* :func:`activation_environment`: exactly what ``run --dry-run`` and ``extension
  env`` inject for a set of bundles, their entries' configurations applied;
* :func:`evidence_refusal`: why a real ``run`` refuses the caller's environment;
* :func:`overridden_by_launch`: the caller's variables a launch replaces;
* :func:`predict_launch`: all of it for one bundle, as the state file stands.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from vllm_hust_bundle_kit.contract import (
    CONFIGURED_ENVIRONMENT,
    ENABLED_BUNDLES_ENVS,
    MANAGER_BUILTIN_PLUGINS,
    PLUGINS_ENV,
    RUNTIME_EVIDENCE_ENVS,
    VLLM_PLUGIN_GROUP,
)
from vllm_hust_bundle_kit.errors import BundleError, Problem, error, shown
from vllm_hust_bundle_kit.installed import Bundle
from vllm_hust_bundle_kit.manager_refusals import (
    configuration_refusal,
    manifest_or_host_refusal,
    refused_launch,
)
from vllm_hust_bundle_kit.manager_state import ManagerState


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


def _conflict(
    bundle: Bundle, name: str, value: str, state: ManagerState | None, earlier: tuple[str, str]
) -> BundleError:
    """Two enabled bundles set ``name`` differently (``earlier``: the value set before, and
    the bundle that set it): named where ``bundle`` sets it, its entry or its manifest."""
    message = f"conflicts with {shown(earlier[0])} from {earlier[1]}; enable only one of them"
    configuration = state.configuration(bundle.extension_id) if state else {}
    if state is not None and name in configuration.get(CONFIGURED_ENVIRONMENT, {}):
        within = (CONFIGURED_ENVIRONMENT, name)
        return state.configuration_error(bundle.extension_id, within, value, message)
    return error(bundle.manifest_path, Problem(("activation", "environment", name), value, message))


def _bundles_environment(bundles: Sequence[Bundle], state: ManagerState | None) -> dict[str, str]:
    """The union of the bundles' variables, each with its entry's configuration applied."""
    injected: dict[str, str] = {}
    owners: dict[str, str] = {}
    for bundle in bundles:
        configuration = state.configuration(bundle.extension_id) if state else {}
        for name, value in configured_environment(bundle, configuration).items():
            if injected.get(name, value) != value:
                raise _conflict(bundle, name, value, state, (injected[name], owners[name]))
            injected[name], owners[name] = value, bundle.extension_id
    return injected


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
    for refusal_of in (manifest_or_host_refusal, configuration_refusal):
        for bundle in bundles:
            refusal = refusal_of(bundle, state)
            if refusal:
                raise BundleError(refusal)
    injected = _bundles_environment(bundles, state)
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
