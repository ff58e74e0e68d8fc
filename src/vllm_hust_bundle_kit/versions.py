# SPDX-License-Identifier: Apache-2.0
"""Host version ranges, judged the way the extension manager judges them.

The manager asks the installed ``packaging`` whether the installed host version
is in ``host.version_range`` with ``SpecifierSet.contains``' default rule, and
that default changed: packaging < 26 keeps a pre-release or dev build out of a
range unless the range names a pre-release; packaging >= 26 lets one in when it
lies between the bounds (``0.32.1rc1`` is in ``>=0.23.0,<0.33``). PEP 440 cannot
spell "no pre-releases" for every version between two bounds, so this module
answers as the installed ``packaging`` does and says so whenever the two rules
disagree.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import packaging
from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from vllm_hust_bundle_kit.contract import CONFIGURED_HOST_VERSION

COMPATIBLE, INCOMPATIBLE, UNKNOWN = "compatible", "incompatible", "unknown"


def host_in_range(version: str, version_range: str) -> bool:
    """Whether the manager, with this ``packaging``, admits ``version`` to ``version_range``."""
    try:
        return SpecifierSet(version_range).contains(Version(version))
    except InvalidVersion:
        return False


def rules_disagree(version: str, version_range: str) -> bool:
    """Whether packaging < 26 and >= 26 judge ``version`` differently (a pre-release
    or dev build between the bounds of a range that names no pre-release)."""
    try:
        parsed = Version(version)
        specifiers = SpecifierSet(version_range)
    except InvalidVersion:
        return False
    strict = specifiers.contains(parsed, prereleases=bool(specifiers.prereleases))
    lenient = specifiers.contains(parsed, prereleases=True)
    return strict != lenient


def range_problem(version_range: str) -> str | None:
    """Why a host range does not pin what was verified, or None."""
    upper = lower = False
    for specifier in SpecifierSet(version_range):
        if specifier.operator in ("==", "===", "~="):
            upper = lower = True
        elif specifier.operator in ("<", "<="):
            upper = True
        elif specifier.operator in (">", ">="):
            lower = lower or Version(specifier.version) > Version("0")
    if upper and lower:
        return None
    return (
        "open-ended range; pin the verified releases with a lower and an upper bound, "
        "e.g. '>=0.32.0,<0.33'"
    )


@dataclass(frozen=True)
class HostCompatibility:
    state: str  # compatible, incompatible or unknown
    host_name: str
    host_version: str | None  # the version judged: the installed one, or the configured one
    version_range: str
    configured: bool = False  # host_version is the state file entry's configuration.host_version

    def describe(self) -> str:
        if self.host_version is None:
            if self.configured:
                return f"the configured host_version is null, so the host version is {self.state}"
            return f"host {self.host_name} is not installed ({self.state})"
        relation = "inside" if self.state == COMPATIBLE else "outside"
        host = (
            f"the configured host_version {self.host_version!r}"
            if self.configured
            else f"host {self.host_name} {self.host_version}"
        )
        return f"{host} is {relation} host.version_range {self.version_range!r} ({self.state})"

    def prerelease_note(self) -> str | None:
        """Said when the verdict depends on the installed packaging's pre-release rule."""
        if self.host_version is None or not rules_disagree(self.host_version, self.version_range):
            return None
        return (
            f"{self.host_version} is a pre-release or dev build between the range's bounds: "
            f"packaging {packaging.__version__} (what the manager uses here) calls it "
            f"{self.state}, packaging {'< 26' if self.state == COMPATIBLE else '>= 26'} would "
            "not; no pre-release was verified"
        )


def host_compatibility(
    manifest: Mapping[str, Any], configuration: Mapping[str, Any] | None = None
) -> HostCompatibility:
    """Compare the host version with the manifest's host range, as the manager does: the
    installed host distribution's, or, when the bundle's state file entry configures
    ``host_version`` (even as null), that value instead (any JSON value, as text)."""
    host = manifest["host"]
    if configuration is not None and CONFIGURED_HOST_VERSION in configuration:
        configured = configuration[CONFIGURED_HOST_VERSION]
        if configured is None:
            return HostCompatibility(UNKNOWN, host["name"], None, host["version_range"], True)
        # The manager judges Python's str() of whatever JSON value is configured.
        version, is_configured = str(configured), True
    else:
        try:
            version = importlib.metadata.version(host["name"])
        except importlib.metadata.PackageNotFoundError:
            return HostCompatibility(UNKNOWN, host["name"], None, host["version_range"])
        is_configured = False
    state = COMPATIBLE if host_in_range(version, host["version_range"]) else INCOMPATIBLE
    return HostCompatibility(state, host["name"], version, host["version_range"], is_configured)
