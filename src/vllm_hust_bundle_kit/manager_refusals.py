# SPDX-License-Identifier: Apache-2.0
"""Why ``vllm-hust-ext run`` refuses to launch with a bundle enabled.

``run`` judges every enabled bundle before it plans the launch and again as it
plans it, so the refusals are data here: two sequences of checks, each in the
manager's order, the first finding standing. :data:`_BUNDLE_CHECKS` run before it
plans the launch (the bundle's status, its host and protocol versions, its required
services); :data:`_CONFIGURATION_CHECKS` as it plans it (the ``launch_options`` and
``environment`` of the bundle's state file entry). The entry's ``configuration``
(``vllm-hust-ext extension configure``) may also set the host version and protocol
versions the first ones judge.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any, TypeVar

from vllm_hust_bundle_kit.contract import (
    CONFIGURED_ENVIRONMENT,
    CONFIGURED_HOST_VERSION,
    CONFIGURED_LAUNCH_OPTIONS,
    CONFIGURED_PROTOCOL_VERSIONS,
    FLAG_LAUNCH_OPTIONS,
    JSON_LAUNCH_OPTIONS,
)
from vllm_hust_bundle_kit.errors import Problem, encodable, shown
from vllm_hust_bundle_kit.installed import Bundle, activation_blocker
from vllm_hust_bundle_kit.versions import (
    COMPATIBLE,
    INCOMPATIBLE,
    HostCompatibility,
    host_compatibility,
    host_in_range,
)

if TYPE_CHECKING:  # manager_state asks this module; only annotations go the other way
    from vllm_hust_bundle_kit.manager_state import ManagerState

_Found = TypeVar("_Found")


def _first(findings: Iterable[_Found | None]) -> _Found | None:
    return next((found for found in findings if found is not None), None)


# --- before the launch is planned: the bundle, its host and its protocols ---------------------


@dataclass(frozen=True)
class _Refusal:
    reason: str  # the manager's reason, in this toolkit's words
    field: tuple[str, ...] = ()  # the entry's configuration field it comes from, if one
    value: Any = None
    fix: str = ""


@dataclass(frozen=True)
class _Judged:
    """A bundle as ``run`` judges it: its manifest and its entry's configuration."""

    manifest: Mapping[str, Any]
    configuration: Mapping[str, Any]

    @cached_property  # looked up only once a check gets that far, as the manager does
    def host(self) -> HostCompatibility:
        return host_compatibility(self.manifest, self.configuration)

    def host_refusal(self) -> _Refusal:
        """The host version judged, naming ``host_version`` where the entry configures it."""
        if not self.host.configured:
            return _Refusal(self.host.describe())
        return _Refusal(
            self.host.describe(),
            (CONFIGURED_HOST_VERSION,),
            self.configuration.get(CONFIGURED_HOST_VERSION),
            "remove host_version from the configuration to have the installed "
            f"{self.host.host_name} judged",
        )

    def versioned_protocols(self) -> Iterator[tuple[str, str, Any]]:
        """Each protocol with its own version range: name, range, the configured version."""
        supplied = self.configuration.get(CONFIGURED_PROTOCOL_VERSIONS, {})
        for protocol in self.manifest["protocols"]:
            if protocol["version_range"] is not None:  # else not versioned: the manager skips it
                yield protocol["name"], protocol["version_range"], supplied.get(protocol["name"])


def _not_enableable(judged: _Judged) -> _Refusal | None:
    blocker = activation_blocker(judged.manifest)
    return _Refusal(blocker) if blocker else None


def _incompatible_host(judged: _Judged) -> _Refusal | None:
    return judged.host_refusal() if judged.host.state == INCOMPATIBLE else None


def _protocol_versions_not_an_object(judged: _Judged) -> _Refusal | None:
    supplied = judged.configuration.get(CONFIGURED_PROTOCOL_VERSIONS, {})
    if isinstance(supplied, dict):
        return None
    return _Refusal(
        "must be an object of protocol name -> version; the manager calls the bundle "
        "incompatible (`protocol_versions must be an object`)",
        (CONFIGURED_PROTOCOL_VERSIONS,),
        supplied,
        "fix or remove it",
    )


def _protocol_outside_its_range(judged: _Judged) -> _Refusal | None:
    for name, version_range, version in judged.versioned_protocols():
        if version is not None and not host_in_range(str(version), version_range):
            return _Refusal(
                f"the configured version {shown(version)} of protocol {name} is "
                f"outside {version_range!r} (incompatible)",
                (CONFIGURED_PROTOCOL_VERSIONS, name),
                version,
                "fix or remove it",
            )
    return None


def _required_services(judged: _Judged) -> _Refusal | None:
    services = judged.manifest["requires_services"]
    required = [s["service_id"] for s in services if not s.get("optional")]
    if not required:
        return None
    return _Refusal(
        f"required services {', '.join(required)} need a health check; "
        "launch with vllm-hust-ext run"
    )


def _unverified_trusted_bundle(judged: _Judged) -> _Refusal | None:
    """An unknown host version, then a protocol version the host cannot report, keeps a
    trusted in-process bundle out; any other bundle launches regardless."""
    if judged.manifest["runtime"]["isolation"] != "trusted_in_process":
        return None
    if judged.host.state != COMPATIBLE:
        return judged.host_refusal()
    for name, version_range, version in judged.versioned_protocols():
        if version is None:
            return _Refusal(
                f"protocol {name} requires {version_range!r}, which the host cannot report"
            )
    return None


# In the manager's order; each check may rely on the ones before it having passed.
_BUNDLE_CHECKS: tuple[Callable[[_Judged], _Refusal | None], ...] = (
    _not_enableable,
    _incompatible_host,
    _protocol_versions_not_an_object,
    _protocol_outside_its_range,
    _required_services,
    _unverified_trusted_bundle,
)


def _refusal(bundle: Bundle, configuration: Mapping[str, Any]) -> _Refusal | None:
    judged = _Judged(bundle.manifest, configuration)
    return _first(check(judged) for check in _BUNDLE_CHECKS)


def launch_refusal(bundle: Bundle, configuration: Mapping[str, Any] | None = None) -> str | None:
    """Why ``vllm-hust-ext run`` would refuse to launch with ``bundle`` enabled (its state
    file entry's ``configuration`` as given), or None; the reason alone."""
    refusal = _refusal(bundle, configuration or {})
    return None if refusal is None else refusal.reason


def _configure(extension_id: str) -> str:
    return (
        f" (`vllm-hust-ext extension configure {extension_id} --file FILE` replaces the "
        "configuration)"
    )


def manifest_or_host_refusal(bundle: Bundle, state: ManagerState | None) -> str | None:
    """Why ``run`` refuses ``bundle`` before it plans the launch, as one line naming the
    manifest or, for a configured field, the state file."""
    configuration = state.configuration(bundle.extension_id) if state else {}
    refusal = _refusal(bundle, configuration)
    if refusal is None:
        return None
    head = f"refusing to launch {bundle.extension_id!r}: {refusal.reason}"
    if not refusal.field or state is None:
        return f"{bundle.manifest_path}: {head}"
    fix = f"; {refusal.fix}" if refusal.fix else ""
    message = head + fix + _configure(bundle.extension_id)
    return str(
        state.configuration_error(bundle.extension_id, refusal.field, refusal.value, message)
    )


# --- while the launch is planned: the entry's launch_options and environment ------------------


@dataclass(frozen=True)
class _Planned:
    """What ``run`` reads of a bundle's state file entry as it plans the launch."""

    bundle: Bundle
    options: Any  # the configuration's launch_options
    overrides: Any  # the configuration's environment


def _launch_options_not_an_object(entry: _Planned) -> Problem | None:
    if isinstance(entry.options, dict):
        return None
    return Problem(
        (CONFIGURED_LAUNCH_OPTIONS,),
        entry.options,
        "must be an object (the manager: `launch_options must be an object`); fix it",
    )


def _unknown_launch_option(entry: _Planned) -> Problem | None:
    known = (*JSON_LAUNCH_OPTIONS, *FLAG_LAUNCH_OPTIONS)
    unknown = sorted(set(entry.options) - set(known))
    if not unknown:
        return None
    return Problem(
        (CONFIGURED_LAUNCH_OPTIONS, unknown[0]),
        entry.options[unknown[0]],
        f"unknown launch option, refused by vllm-hust-ext run (`unsupported vLLM "
        f"launch_options: {unknown}`); use one of {', '.join(sorted(known))}, or remove it",
    )


# The type each kind of known launch option takes, and what is said of another type.
_LAUNCH_OPTION_KINDS = (
    (FLAG_LAUNCH_OPTIONS, bool, "must be true or false"),
    (JSON_LAUNCH_OPTIONS, dict, "must be an object"),
)


def _launch_option_of_the_wrong_type(entry: _Planned) -> Problem | None:
    for name, value in entry.options.items():
        for names, kind, message in _LAUNCH_OPTION_KINDS:
            if name in names and not isinstance(value, kind):
                return Problem((CONFIGURED_LAUNCH_OPTIONS, name), value, message)
    return None


def _environment_not_an_object(entry: _Planned) -> Problem | None:
    if isinstance(entry.overrides, dict):
        return None
    return Problem(
        (CONFIGURED_ENVIRONMENT,),
        entry.overrides,
        "must be an object of variable -> value (the manager: `environment must be an "
        "object`); fix it",
    )


def _undeclared_variable(entry: _Planned) -> Problem | None:
    declared = entry.bundle.manifest.get("activation", {}).get("environment", {})
    undeclared = sorted(set(entry.overrides) - set(declared))
    if not undeclared:
        return None
    return Problem(
        (CONFIGURED_ENVIRONMENT, undeclared[0]),
        entry.overrides[undeclared[0]],
        f"not declared in {entry.bundle.manifest_path.name}'s activation.environment "
        f"({', '.join(declared) or 'none'}), refused by vllm-hust-ext run (`environment "
        f"overrides must be declared by the manifest: {undeclared}`); remove it",
    )


# An override value no launch can pass on, as the manager finds it: the test, then what is said.
_UNUSABLE_VALUES: tuple[tuple[Callable[[Any], bool], str], ...] = (
    (
        lambda value: not isinstance(value, str),
        "must be a string (the manager: `environment override values must be strings`)",
    ),
    (
        lambda value: "\0" in value or not encodable(value),
        "holds a NUL character or a lone surrogate, which no process environment can hold "
        "(a real vllm-hust-ext run fails on it); fix it",
    ),
)


def _unusable_variable_value(entry: _Planned) -> Problem | None:
    for name, value in entry.overrides.items():
        for unusable, message in _UNUSABLE_VALUES:
            if unusable(value):
                return Problem((CONFIGURED_ENVIRONMENT, name), value, message)
    return None


# In the manager's order; each check may rely on the ones before it having passed.
_CONFIGURATION_CHECKS: tuple[Callable[[_Planned], Problem | None], ...] = (
    _launch_options_not_an_object,
    _unknown_launch_option,
    _launch_option_of_the_wrong_type,
    _environment_not_an_object,
    _undeclared_variable,
    _unusable_variable_value,
)


def configuration_refusal(bundle: Bundle, state: ManagerState | None) -> str | None:
    """What ``run`` refuses (exit 2) in the ``launch_options`` and ``environment`` of a
    vLLM bundle's entry in ``state`` when it plans the launch, as one line naming the
    state file's field."""
    if state is None:
        return None
    configuration = state.configuration(bundle.extension_id)
    entry = _Planned(
        bundle,
        configuration.get(CONFIGURED_LAUNCH_OPTIONS, {}),
        configuration.get(CONFIGURED_ENVIRONMENT, {}),
    )
    problem = _first(check(entry) for check in _CONFIGURATION_CHECKS)
    if problem is None:
        return None
    message = problem.message + _configure(bundle.extension_id)
    return str(state.configuration_error(bundle.extension_id, problem.path, problem.value, message))


def refused_launch(bundle: Bundle, state: ManagerState | None = None) -> str | None:
    """Why ``run`` would refuse ``bundle`` (with its entry's configuration in ``state``) as
    the operator reads it: one line naming the manifest or the state file, the field, the
    value and the fix."""
    return manifest_or_host_refusal(bundle, state) or configuration_refusal(bundle, state)
