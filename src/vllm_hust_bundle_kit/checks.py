# SPDX-License-Identifier: Apache-2.0
"""Checks a JSON Schema cannot make, shared by ``manifest.toml`` and installed manifests.

Both sides describe a bundle as :class:`BundleFacts`: each field together with
where it sits in the document it was read from, so a problem names the field
the operator has to edit, in the file they have open.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vllm_hust_bundle_kit.contract import MANAGER_OWNED_ENVS, VLLM_PLUGIN_GROUP
from vllm_hust_bundle_kit.errors import Problem
from vllm_hust_bundle_kit.references import unresolved
from vllm_hust_bundle_kit.versions import range_problem

Where = tuple[str | int, ...]
# Characters that make a value a shell expression or a placeholder, not a literal.
_NON_LITERAL_CHARS = frozenset("$`<>\n\r\0")


@dataclass(frozen=True)
class Distribution:
    """What the checks need to know about the distribution that ships a bundle."""

    name: str
    version: str
    entry_points: Mapping[tuple[str, str], str]  # (group, name) -> value
    package_root: Path  # the folder holding its top-level packages


@dataclass(frozen=True)
class Carrier:
    where: Where
    module: str
    object: str

    @property
    def target(self) -> str:
        return f"{self.module}:{self.object}"


@dataclass(frozen=True)
class BundleFacts:
    """The fields the checks read, each with its location."""

    prefix: Where  # where the bundle itself sits in its document
    host_range: str
    protocols: Sequence[str]
    carriers: Sequence[Carrier]
    components: Sequence[Mapping[str, Any]]
    activation: Mapping[str, Any]
    distribution: Distribution


def _duplicates(values: Sequence[Any]) -> Iterator[int]:
    seen: list[Any] = []
    for index, value in enumerate(values):
        if value in seen:
            yield index
        seen.append(value)


def _declaration_problems(facts: BundleFacts) -> Iterator[Problem]:
    problem = range_problem(facts.host_range)
    if problem:
        yield Problem((*facts.prefix, "host", "version_range"), facts.host_range, problem)
    for index in _duplicates(facts.protocols):
        yield Problem(
            (*facts.prefix, "protocols", index, "name"),
            facts.protocols[index],
            "duplicate protocol; list each once",
        )
    for index in _duplicates([carrier.target for carrier in facts.carriers]):
        carrier = facts.carriers[index]
        yield Problem(
            carrier.where,
            carrier.target,
            "the same carrier is listed twice; list it once, with one status",
        )
    components = facts.components
    for index in _duplicates([component["component_id"] for component in components]):
        yield Problem(
            (*facts.prefix, "components", index, "component_id"),
            components[index]["component_id"],
            "duplicate component_id; give each component its own",
        )


def _reference_problems(facts: BundleFacts) -> Iterator[Problem]:
    root = facts.distribution.package_root
    for carrier in facts.carriers:
        reason = unresolved(root, carrier.module, carrier.object)
        if reason:
            yield Problem((*carrier.where, "object"), carrier.object, reason)
    for index, component in enumerate(facts.components):
        module, name = component["implementation_ref"].split(":")
        reason = unresolved(root, module, name)
        if reason:
            yield Problem(
                (*facts.prefix, "components", index, "implementation_ref"),
                component["implementation_ref"],
                reason,
            )


def _activation_problems(facts: BundleFacts) -> Iterator[Problem]:
    where, distribution = (*facts.prefix, "activation"), facts.distribution
    targets = {carrier.target for carrier in facts.carriers}
    for index, entry_point in enumerate(facts.activation.get("entry_points", [])):
        key = (entry_point["group"], entry_point["name"])
        target = distribution.entry_points.get(key)
        if target is None:
            yield Problem(
                (*where, "entry_points", index),
                entry_point,
                f"distribution {distribution.name} installs no such entry point; "
                "declare it in pyproject.toml",
            )
        elif key[0] == VLLM_PLUGIN_GROUP and target not in targets:
            yield Problem(
                (*where, "entry_points", index),
                entry_point,
                f"points at {target}, which is not one of the bundle's carriers; "
                "add it to the carriers so its status is tracked",
            )
    for name, value in facts.activation.get("environment", {}).items():
        if name in MANAGER_OWNED_ENVS:
            yield Problem(
                (*where, "environment", name),
                value,
                "is computed by the extension manager on launch; remove it",
            )
        elif not value or value != value.strip() or _NON_LITERAL_CHARS & set(value):
            yield Problem(
                (*where, "environment", name),
                value,
                "must be the literal value to inject (non-empty, no surrounding spaces, "
                "no $, backquotes or <placeholders>)",
            )


def first_problem(facts: BundleFacts) -> Problem | None:
    for checks in (_declaration_problems, _reference_problems, _activation_problems):
        problem = next(checks(facts), None)
        if problem:
            return problem
    return None
