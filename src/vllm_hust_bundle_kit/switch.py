# SPDX-License-Identifier: Apache-2.0
"""A carrier's default-off switch: environment in, decision out (standard library only).

A carrier is enabled in a vLLM process when its enable variable is on, or when
the extension manager lists its bundle in ``VLLMHUST_EXT_ENABLED_BUNDLES`` and
the carrier's own manifest says the manager may enable it (status ``active``).
An explicit off wins over the list; ``vllm-hust-ext run`` sets the variable on
itself (replacing the caller's value), so an operator switches a managed
carrier off for one launch after ``--``: ``vllm-hust-ext run -- env VAR=0 ...``.
The bundle id, the enable variable (the one ``activation.environment`` entry
whose value is ``"1"``), the carrier's status and the host range are read from
the bundle's rendered manifest, so ``manifest.toml`` is the one place they are
written.
"""

from __future__ import annotations

import importlib.util
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from vllm_hust_bundle_kit.contract import ACTIVE, ENABLED_BUNDLES_ENVS, MANIFEST_FILENAMES

ON_VALUES = ("1", "true", "yes", "on")
OFF_VALUES = ("0", "false", "no", "off")
# A value is echoed in a warning up to this many characters.
MAX_ECHOED_CHARS = 64


class SwitchError(ValueError):
    """The carrier's rendered manifest cannot tell the switch what it needs."""


def echoed(value: str) -> str:
    """``repr(value)``, cut to a bounded length so a hostile value cannot flood a log."""
    if len(value) <= MAX_ECHOED_CHARS:
        return repr(value)
    return f"{value[:MAX_ECHOED_CHARS]!r}... ({len(value)} characters)"


def parse_switch(environ: Mapping[str, str], name: str, warnings: list[str]) -> bool | None:
    """``True``/``False`` for an on/off value of ``name``, ``None`` when unset or empty.

    Case and surrounding whitespace are ignored. Any other value adds a warning
    and reads as off: a switch that cannot be understood never turns a carrier on.
    """
    raw = environ.get(name)
    try:
        return switch_value(name, raw)
    except ValueError as exc:
        warnings.append(f"{exc}; treating it as off")
        return False


def switch_value(name: str, raw: str | None) -> bool | None:
    """``True``/``False`` for an on/off value of variable ``name``, ``None`` when unset
    or empty; a ``ValueError`` naming the variable, its (capped) value and the values
    understood for anything else. Case and surrounding whitespace are ignored."""
    if raw is None or not raw.strip():
        return None
    value = raw.strip().lower()
    if value in ON_VALUES:
        return True
    if value in OFF_VALUES:
        return False
    raise ValueError(
        f"{name}={echoed(raw)} is not understood; use one of {', '.join(ON_VALUES)} "
        f"(on) or {', '.join(OFF_VALUES)} (off)"
    )


def switch_names(manifest: Mapping) -> list[str]:
    """The manifest's ``activation.environment`` variables that a launch sets to ``"1"``."""
    environment = manifest.get("activation", {}).get("environment", {})
    return [name for name, value in environment.items() if value == "1"]


@dataclass(frozen=True)
class SwitchDecision:
    """Whether the carrier registers anything in this process, and why."""

    enabled: bool
    source: str
    override: bool = False
    warnings: tuple[str, ...] = field(default_factory=tuple)


@dataclass(frozen=True)
class CarrierSwitch:
    """One carrier's switch: its bundle, its variables, and what its manifest allows."""

    bundle_id: str
    enable_env: str
    override_env: str
    manager_may_enable: bool
    host_name: str
    host_range: str

    @classmethod
    def from_bundle_package(cls, package: str, carrier: str, override_env: str) -> CarrierSwitch:
        """The switch of ``carrier`` (``module:object``) in the bundle manifest of ``package``."""
        manifest = _read_manifest(package)
        try:
            statuses = {
                item["status"]
                for item in manifest["implementation"]
                if f"{item.get('module')}:{item.get('object')}" == carrier
            }
            switches = switch_names(manifest)
            host = manifest["host"]
            bundle_id = manifest["extension_id"]
            host_name, host_range = host["name"], host["version_range"]
        except (KeyError, TypeError, AttributeError) as exc:
            raise SwitchError(f"bundle manifest of {package} is malformed ({exc!r})") from None
        if len(statuses) != 1 or len(switches) != 1:
            raise SwitchError(
                f"bundle manifest of {package} must list carrier {carrier} once and set exactly "
                f'one activation.environment variable to "1" (found {len(statuses)} carrier '
                f"entries, variables {switches}); re-render it from manifest.toml"
            )
        return cls(
            bundle_id=bundle_id,
            enable_env=switches[0],
            override_env=override_env,
            manager_may_enable=statuses == {ACTIVE},
            host_name=host_name,
            host_range=host_range,
        )

    def decide(self, environ: Mapping[str, str] | None = None) -> SwitchDecision:
        """Read the switches from ``environ`` (default: the process environment)."""
        env = os.environ if environ is None else environ
        warnings: list[str] = []
        override = parse_switch(env, self.override_env, warnings) is True
        switch = parse_switch(env, self.enable_env, warnings)
        listed_in = self._listed_in(env)
        if switch and listed_in and self.manager_may_enable:
            # `vllm-hust-ext run` sets the switch and the list together: credit the manager.
            return SwitchDecision(
                True, f"{listed_in} lists {self.bundle_id}", override, (*warnings,)
            )
        if switch is not None:
            # An explicit setting, on or off, wins over the manager's bundle list.
            value = env[self.enable_env].strip().lower()
            understood = value in ON_VALUES or value in OFF_VALUES
            source = f"{self.enable_env}={value}" if understood else f"{self.enable_env} invalid"
            return SwitchDecision(switch, source, override, tuple(warnings))
        if listed_in is None:
            return SwitchDecision(False, f"{self.enable_env} unset", override, tuple(warnings))
        if not self.manager_may_enable:
            return SwitchDecision(
                False,
                f"{listed_in} lists {self.bundle_id} but its manifest does not let the manager "
                f"enable it (status not {ACTIVE}); set {self.enable_env}=1 to enable it by hand",
                override,
                tuple(warnings),
            )
        return SwitchDecision(
            True, f"{listed_in} lists {self.bundle_id}", override, tuple(warnings)
        )

    def settings_in(self, environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
        """The carrier's variables set in ``environ``: the switch's own (switch, override,
        bundle lists) and every other one named with the switch's prefix (for
        ``SPARK2_5_PLUGIN_ENABLE``: ``SPARK2_5_PLUGIN_``). These decide what the carrier
        does in a process, so each process vLLM starts for the engine needs them."""
        env = os.environ if environ is None else environ
        prefix = self.enable_env.rpartition("_")[0] + "_"
        own = (self.enable_env, self.override_env, *ENABLED_BUNDLES_ENVS)
        return tuple(sorted(n for n in env if n in own or n.startswith(prefix)))

    def _listed_in(self, environ: Mapping[str, str]) -> str | None:
        for name in ENABLED_BUNDLES_ENVS:
            if self.bundle_id in {item.strip() for item in environ.get(name, "").split(",")}:
                return name
        return None


def _read_manifest(package: str) -> dict:
    """The package's rendered manifest, found the way the manager finds it: the one
    manifest file in the package's folder (located without importing its code,
    which ``importlib.resources`` would do, with more imports besides)."""
    try:
        spec = importlib.util.find_spec(package)
        folders = list(spec.submodule_search_locations or ()) if spec else []
        found = [
            os.path.join(folder, name)
            for folder in folders
            for name in MANIFEST_FILENAMES
            if os.path.isfile(os.path.join(folder, name))
        ]
        if len(found) != 1:
            raise SwitchError(
                f"package {package} holds {len(found)} of {', '.join(MANIFEST_FILENAMES)}; "
                "it must hold exactly one (reinstall the distribution)"
            )
        with open(found[0], encoding="utf-8") as file:
            manifest = json.load(file)
    except (ImportError, OSError, ValueError, RecursionError) as exc:
        if isinstance(exc, SwitchError):
            raise
        raise SwitchError(f"cannot read the bundle manifest of {package} ({exc})") from None
    if not isinstance(manifest, dict):
        raise SwitchError(f"bundle manifest of {package} is not a JSON object")
    return manifest
