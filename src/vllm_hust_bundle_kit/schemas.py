# SPDX-License-Identifier: Apache-2.0
"""The JSON Schemas: the manager's manifest, this toolkit's ``manifest.toml``, the manager's state.

Each validator reports the first problem as a :class:`~.errors.Problem` worded
for an operator (the field, its value, what is allowed).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from importlib import resources
from typing import Any

from jsonschema import Draft202012Validator, FormatChecker, ValidationError
from jsonschema.exceptions import best_match
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version
from referencing import Registry, Resource

from vllm_hust_bundle_kit.contract import (
    LEGACY_STATE_SCHEMA_VERSION,
    STATE_ENTRY_KEYS,
    STATE_SCHEMA_VERSION,
)
from vllm_hust_bundle_kit.errors import MISSING, Problem, shown

_FORMATS = FormatChecker(formats=())


@_FORMATS.checks("pep440-version", raises=InvalidVersion)
def _is_version(value: object) -> bool:
    return not isinstance(value, str) or Version(value) is not None


@_FORMATS.checks("pep440-specifier", raises=InvalidSpecifier)
def _is_specifier(value: object) -> bool:
    return not isinstance(value, str) or SpecifierSet(value) is not None


MANIFEST_SCHEMA: dict[str, Any] = json.loads(
    resources.files(__package__).joinpath("manifest.schema.json").read_text(encoding="utf-8")
)
_MANIFEST_ID = MANIFEST_SCHEMA["$id"]
_REGISTRY = Registry().with_resource(_MANIFEST_ID, Resource.from_contents(MANIFEST_SCHEMA))


def _manifest_def(pointer: str) -> dict[str, str]:
    return {"$ref": f"{_MANIFEST_ID}#/{pointer}"}


def _table(required: Sequence[str], **properties: Any) -> dict[str, Any]:
    return {
        "type": "object",
        "additionalProperties": False,
        "required": list(required),
        "properties": properties,
    }


_CARRIER = {
    **_table(
        ["module", "object", "status", "evidence"],
        module=_manifest_def("$defs/module_path"),
        object=_manifest_def("$defs/python_name"),
        status=_manifest_def("$defs/implementation/then/properties/status"),
        evidence={
            "description": "files, relative to manifest.toml",
            "type": "array",
            "uniqueItems": True,
            "items": {"type": "string", "minLength": 1},
        },
    ),
    # An active carrier must say what evidence made it active.
    "if": {"properties": {"status": {"const": "active"}}},
    "then": {
        "properties": {
            "evidence": {
                "description": "an active carrier lists the evidence files its status rests on",
                "minItems": 1,
            }
        }
    },
}

# manifest.toml mirrors the JSON manifest, except: the version comes from
# pyproject.toml, TOML has no null (an omitted version_range renders as null),
# `carriers` are the python_module implementation items plus the evidence their
# status rests on, and `host.verified_on` records the host versions verified.
_BUNDLE_SOURCE = _table(
    [
        "extension_id",
        "kind",
        "lifecycle_owner",
        "host",
        "runtime",
        "protocols",
        "carriers",
        "requires_services",
    ],
    extension_id=_manifest_def("$defs/identifier"),
    kind=_manifest_def("properties/kind"),
    lifecycle_owner=_manifest_def("properties/lifecycle_owner"),
    host=_table(
        ["provider", "name", "version_range", "verified_on"],
        provider=_manifest_def("$defs/host/properties/provider"),
        name=_manifest_def("$defs/host/properties/name"),
        version_range=_manifest_def("$defs/version_range"),
        api_range=_manifest_def("$defs/version_range"),
        verified_on={
            "type": "array",
            "minItems": 1,
            "uniqueItems": True,
            "items": {"type": "string", "format": "pep440-version"},
        },
    ),
    runtime=_manifest_def("$defs/runtime"),
    protocols={
        "type": "array",
        "items": _table(
            ["name"],
            name=_manifest_def("$defs/protocol/properties/name"),
            version_range=_manifest_def("$defs/version_range"),
        ),
    },
    carriers={"type": "array", "minItems": 1, "items": _CARRIER},
    requires_services={
        "type": "array",
        "items": _table(
            ["service_id", "protocol", "endpoint_config"],
            service_id=_manifest_def("$defs/service/properties/service_id"),
            protocol=_manifest_def("$defs/service/properties/protocol"),
            version_range=_manifest_def("$defs/version_range"),
            endpoint_config=_manifest_def("$defs/service/properties/endpoint_config"),
            optional={"type": "boolean"},
        ),
    },
    components=_manifest_def("properties/components"),
    activation=_manifest_def("$defs/activation"),
)
SOURCE_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    **_table(["bundle"], bundle={"type": "array", "minItems": 1, "items": _BUNDLE_SOURCE}),
}

# The manager's state file, as the manager reads it (vllm_hust_ext.config.load_config):
# an object whose schema_version is 1 (legacy: an `enabled` list of bundle ids, other
# keys ignored) or 2 (`extensions`, default empty: bundle id -> entry holding at most
# `enabled`, default false, and `configuration`, default empty). Other top-level keys
# are ignored; a schema_version that is neither, or any other key in an entry, is refused.
_STATE_ENTRY = _table(
    [],
    **{
        STATE_ENTRY_KEYS[0]: {"type": "boolean"},
        STATE_ENTRY_KEYS[1]: {"type": "object"},
    },
)
STATE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["schema_version"],
    "if": {
        "required": ["schema_version"],
        "properties": {"schema_version": {"const": LEGACY_STATE_SCHEMA_VERSION}},
    },
    "then": {"properties": {"enabled": {"type": "array", "items": {"type": "string"}}}},
    "else": {
        "properties": {
            "schema_version": {"const": STATE_SCHEMA_VERSION},
            "extensions": {"type": "object", "additionalProperties": _STATE_ENTRY},
        }
    },
}


def _validator(schema: dict[str, Any]) -> Draft202012Validator:
    return Draft202012Validator(schema, registry=_REGISTRY, format_checker=_FORMATS)


MANIFEST_VALIDATOR = _validator(MANIFEST_SCHEMA)
SOURCE_VALIDATOR = _validator(SOURCE_SCHEMA)
STATE_VALIDATOR = _validator(STATE_SCHEMA)

_TYPE_NAMES = {
    "string": "a string",
    "array": "an array",
    "object": "a table/object",
    "boolean": "true or false",
}


def _schema_problem(error: ValidationError) -> Problem:
    path = tuple(error.absolute_path)
    schema, value, keyword = error.schema, error.instance, error.validator
    if "propertyNames" in error.schema_path:
        return Problem((*path, value), MISSING, f"invalid key; use {schema['description']}")
    if keyword == "additionalProperties":
        allowed = sorted(schema.get("properties", {}))
        key = sorted(set(value) - set(allowed))[0]
        return Problem((*path, key), value[key], f"unknown key; use one of: {', '.join(allowed)}")
    if keyword == "required":
        key = next(name for name in error.validator_value if name not in value)
        return Problem((*path, key), MISSING, "required key is missing; add it")
    if keyword == "type":
        expected = error.validator_value
        names = [expected] if isinstance(expected, str) else expected
        return Problem(path, value, "must be " + " or ".join(_TYPE_NAMES.get(n, n) for n in names))
    if keyword == "enum":
        return Problem(path, value, "must be one of: " + ", ".join(map(str, error.validator_value)))
    if keyword == "const":
        return Problem(path, value, f"must be {shown(error.validator_value)}")
    if keyword == "format":
        kind = "version" if error.validator_value == "pep440-version" else "version range"
        return Problem(path, value, f"is not a valid PEP 440 {kind} ({error.cause})")
    if keyword == "pattern":
        rule = schema.get("description", f"a string matching {error.validator_value}")
        return Problem(path, value, f"must be {rule}")
    if keyword in ("minItems", "minLength"):
        why = f" ({schema['description']})" if "description" in schema else ""
        return Problem(path, value, f"must not be empty{why}")
    if keyword == "uniqueItems":
        return Problem(path, value, "lists an item twice; list each once")
    return Problem(path, value, error.message)


def first_problem(validator: Draft202012Validator, document: Any) -> Problem | None:
    """The most relevant schema violation in ``document``, or None."""
    error = best_match(validator.iter_errors(document))
    return None if error is None else _schema_problem(error)
