"""manifest.toml, the JSON manifest rendered from it, and the checks a schema cannot make."""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import stat
from pathlib import Path

import pytest
from bundle_support import (
    PROJECT_ROOT,
    copy_project,
    manifest_source,
    normalized,
    our_bundles,
    pyproject,
    with_status,
)
from jsonschema import Draft202012Validator

from vllm_spark2_5_plugin import _gate, _registration, bundle
from vllm_spark2_5_plugin.bundle_cli import main

# Flip a carrier here (and in manifest.toml) only together with its archived evidence.
PINNED_CARRIER_STATUS = {"vllm_spark2_5_plugin:register": "active"}


def test_manifest_schema_is_a_valid_json_schema():
    Draft202012Validator.check_schema(bundle.MANIFEST_SCHEMA)


def test_checked_in_manifest_is_what_manifest_toml_renders():
    for rendered in bundle.render(PROJECT_ROOT):
        assert rendered.is_current(), (
            f"{rendered.path} is stale: run `spark2-5-bundle render` and commit the result"
        )


def test_each_bundle_in_manifest_toml_is_installed_under_its_entry_point():
    source_ids = [item["extension_id"] for item in manifest_source()["bundle"]]
    installed = our_bundles()
    assert [found.extension_id for found in installed] == sorted(source_ids)
    assert _gate.BUNDLE_ID in source_ids
    rendered = {
        item.path.parent.name: json.loads(item.text) for item in bundle.render(PROJECT_ROOT)
    }
    for found in installed:
        bundle.validate(found)
        assert found.manifest_path.name == bundle.RENDERED_FILENAME
        assert found.manifest == rendered[found.manifest_path.parent.name]


def test_every_general_plugin_of_the_distribution_is_a_carrier_of_a_bundle():
    name = normalized(pyproject()["name"])
    plugins = [
        entry_point
        for entry_point in importlib.metadata.entry_points(group=bundle.VLLM_PLUGIN_GROUP)
        if normalized(entry_point.dist.name) == name
    ]
    assert plugins
    activated = {
        (item["name"], f"{carrier['module']}:{carrier['object']}")
        for found in our_bundles()
        for item in found.manifest["activation"]["entry_points"]
        for carrier in found.manifest["implementation"]
        if item["group"] == bundle.VLLM_PLUGIN_GROUP
    }
    for plugin in plugins:
        assert (plugin.name, plugin.value) in activated, plugin


def test_carrier_status_is_pinned_and_active_carriers_rest_on_archived_evidence():
    installed = {
        f"{item['module']}:{item['object']}": item["status"]
        for found in our_bundles()
        for item in found.manifest["implementation"]
    }
    assert installed == PINNED_CARRIER_STATUS
    for source in manifest_source()["bundle"]:
        for carrier in source["carriers"]:
            if carrier["status"] == "active":
                assert carrier["evidence"], carrier
            for evidence in carrier["evidence"]:
                assert (PROJECT_ROOT / evidence).is_file(), evidence


def test_activation_blocker_follows_the_documented_rule():
    (found,) = [item for item in our_bundles() if item.extension_id == _gate.BUNDLE_ID]
    assert bundle.activation_blocker(with_status(found, "import_only").manifest) == (
        "extension is descriptor-only and cannot be enabled (implementation status: import_only)"
    )
    assert bundle.activation_blocker(with_status(found, "active").manifest) is None

    mixed = with_status(found, "legacy_unregistered").manifest
    mixed["implementation"].append({**mixed["implementation"][0], "status": "import_only"})
    assert bundle.activation_blocker(mixed) == (
        "extension is descriptor-only and cannot be enabled "
        "(implementation status: import_only, legacy_unregistered)"
    )
    mixed["implementation"].append({**mixed["implementation"][0], "status": "active"})
    assert bundle.activation_blocker(mixed) is None


def test_version_is_typed_once_in_pyproject():
    version = pyproject()["version"]
    assert importlib.metadata.version(pyproject()["name"]) == version
    for found in our_bundles():
        assert found.manifest["extension_version"] == version


def test_host_range_pins_the_verified_vllm_and_feeds_the_load_line():
    assert _registration.MANIFEST_NAME == bundle.RENDERED_FILENAME
    (source,) = [b for b in manifest_source()["bundle"] if b["extension_id"] == _gate.BUNDLE_ID]
    version_range = source["host"]["version_range"]
    assert bundle._range_problem(version_range) is None
    assert source["host"]["verified_on"]
    for verified in source["host"]["verified_on"]:
        assert bundle.host_in_range(verified, version_range)
    assert _registration.verified_host_range() == version_range


@pytest.mark.parametrize(
    ("host_version", "inside"),
    [
        ("0.32.0", True),
        ("0.32.0+cpu", True),
        ("0.32.7", True),
        ("0.32.1rc1.dev3", False),
        ("0.32.0rc1", False),
        ("0.31.0", False),
        ("0.33.0", False),
        ("0.33.0rc1", False),
        ("not-a-version", False),
    ],
)
def test_host_range_uses_the_default_prerelease_rule(host_version, inside):
    assert bundle.host_in_range(host_version, ">=0.32.0,<0.33") is inside


def test_a_range_that_names_a_prerelease_admits_prereleases():
    assert bundle.host_in_range("0.33.0rc2", ">=0.33.0rc1,<0.34")
    assert not bundle.host_in_range("0.33.0rc2", ">=0.33.0,<0.34")


@pytest.mark.parametrize(
    "version_range", [">=0", ">0", ">=0.32.0", "<0.33", "!=0.31.0", ">=0,<0.33", ""]
)
def test_open_ended_host_ranges_are_rejected(version_range):
    assert bundle._range_problem(version_range)


@pytest.mark.parametrize("version_range", [">=0.32.0,<0.33", "==0.32.0", "==0.32.*", "~=0.32.0"])
def test_bounded_host_ranges_are_accepted(version_range):
    assert bundle._range_problem(version_range) is None


def test_activation_environment_opens_the_carrier_gate():
    for found in our_bundles():
        environment = found.manifest["activation"]["environment"]
        assert _gate.decide(environment).enabled
        assert _gate.decide({_gate.ENABLED_BUNDLES_ENVS[0]: found.extension_id}).enabled


# --- bad manifest.toml: one line naming file, key and value; nothing written ---------------

# What manifest.toml spells today, for the mutations below.
MANIFEST_SOURCE = (Path(__file__).parents[1] / "manifest.toml").read_text()
EVIDENCE_LIST = re.search(r"evidence = \[[^\]]*\]", MANIFEST_SOURCE).group(0)
RANGE_LINE = re.search(r'^version_range = "[^"]*"', MANIFEST_SOURCE, re.M).group(0)
FIRST_VERIFIED_HOST = re.search(r'^verified_on = \[\s*"([^"]+)"', MANIFEST_SOURCE, re.M).group(1)
BAD_SOURCES = {
    "unknown-key": (
        'provider = "vllm"',
        'provider = "vllm"\ncolour = "blue"',
        'bundle[0].host.colour = "blue": unknown key',
    ),
    "wrong-type": (
        "requires_services = []",
        'requires_services = "none"',
        'bundle[0].requires_services = "none": must be an array',
    ),
    "bad-identifier": (
        'extension_id = "org.vllm-hust.spark2-5"',
        'extension_id = "org.vllm_hust.spark2_5"',
        'bundle[0].extension_id = "org.vllm_hust.spark2_5": must be lowercase',
    ),
    "unparsable-range": (
        RANGE_LINE,
        'version_range = ">=0.32.0,<<0.33"',
        'bundle[0].host.version_range = ">=0.32.0,<<0.33": is not a valid PEP 440 version range',
    ),
    "open-ended-range": (
        RANGE_LINE,
        'version_range = ">=0"',
        'bundle[0].host.version_range = ">=0": open-ended range',
    ),
    "range-without-upper-bound": (
        RANGE_LINE,
        RANGE_LINE.split(",")[0] + '"',
        f'bundle[0].host.{RANGE_LINE.split(",")[0]}": open-ended range',
    ),
    "range-misses-verified-host": (
        RANGE_LINE,
        'version_range = ">=0.33.0,<0.34"',
        f'bundle[0].host.verified_on[0] = "{FIRST_VERIFIED_HOST}": is outside host.version_range',
    ),
    "toml-syntax": (
        'kind = "in_process_plugin"',
        'kind = "in_process_plugin',
        ("not valid TOML: ", 'the line reads: kind = "in_process_plugin'),
    ),
    "toml-duplicate-key": (
        'kind = "in_process_plugin"',
        'kind = "in_process_plugin"\nkind = "scheduler_policy"',
        ("not valid TOML: Cannot overwrite", 'the line reads: kind = "scheduler_policy"'),
    ),
    "unknown-status": (
        'status = "active"',
        'status = "enabled"',
        'bundle[0].carriers[0].status = "enabled": must be one of: active, import_only',
    ),
    "active-without-evidence": (
        EVIDENCE_LIST,
        "evidence = []",
        "bundle[0].carriers[0].evidence = []: must not be empty (an active carrier lists",
    ),
    "missing-evidence-file": (
        EVIDENCE_LIST,
        'evidence = ["extensions/spark2_5/evidence/no-such-run.log"]',
        'bundle[0].carriers[0].evidence[0] = "extensions/spark2_5/evidence/no-such-run.log": '
        "must be an existing file",
    ),
    "carrier-object-not-defined": (
        'object = "register"',
        'object = "regsiter"',
        'bundle[0].carriers[0].object = "regsiter": ',
    ),
    "component-module-missing": (
        '"vllm_spark2_5_plugin.spark2_5_config:Spark2_5Config"',
        '"vllm_spark2_5_plugin.no_such_module:Spark2_5Config"',
        'bundle[0].components[1].implementation_ref = "vllm_spark2_5_plugin.no_such_module:'
        "Spark2_5Config\": module 'vllm_spark2_5_plugin.no_such_module' not found",
    ),
    "entry-point-not-installed": (
        'name = "spark2_5" }',
        'name = "spark25" }',
        'bundle[0].activation.entry_points[0] = {"group": "vllm.general_plugins", '
        '"name": "spark25"}: distribution vllm-spark2_5-plugin installs no such entry point',
    ),
    "environment-not-a-literal": (
        'SPARK2_5_PLUGIN_ENABLE = "1"',
        'SPARK2_5_PLUGIN_ENABLE = "${ENABLE}"',
        'bundle[0].activation.environment.SPARK2_5_PLUGIN_ENABLE = "${ENABLE}": must be the '
        "literal value",
    ),
    "environment-owned-by-the-manager": (
        'SPARK2_5_PLUGIN_ENABLE = "1"',
        'SPARK2_5_PLUGIN_ENABLE = "1", VLLM_PLUGINS = "spark2_5"',
        'bundle[0].activation.environment.VLLM_PLUGINS = "spark2_5": is computed by the '
        "extension manager",
    ),
    "environment-not-a-string": (
        'SPARK2_5_PLUGIN_ENABLE = "1"',
        "SPARK2_5_PLUGIN_ENABLE = 1",
        "bundle[0].activation.environment.SPARK2_5_PLUGIN_ENABLE = 1: must be a string",
    ),
    "no-entry-point-for-bundle": (
        'extension_id = "org.vllm-hust.spark2-5"',
        'extension_id = "org.vllm-hust.spark2-6"',
        "pyproject.toml: project.entry-points.vllm_hust.extension_bundles."
        "'org.vllm-hust.spark2-5': no [[bundle]] with this extension_id",
    ),
}


def _directory_state(directory):
    return {path.name: path.read_bytes() for path in directory.iterdir()}


@pytest.fixture
def project(tmp_path):
    return copy_project(tmp_path)


def render_failure(project, capsys) -> str:
    """Run ``spark2-5-bundle render`` on ``project``; assert it failed cleanly, return the line."""
    package_dir = project / "src/vllm_spark2_5_plugin/bundles/spark2_5"
    before = _directory_state(package_dir)
    assert main(["render", "--root", str(project)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.endswith("\n") and err.count("\n") == 1, err
    assert err.startswith("spark2-5-bundle: error: ")
    assert _directory_state(package_dir) == before, "render wrote something despite the error"
    return err.strip()


@pytest.mark.parametrize(("old", "new", "expected"), BAD_SOURCES.values(), ids=BAD_SOURCES)
def test_bad_manifest_toml_is_one_clear_error(project, capsys, old, new, expected):
    source = project / "manifest.toml"
    text = source.read_text()
    assert text.count(old) >= 1
    source.write_text(text.replace(old, new, 1))
    error = render_failure(project, capsys)
    for fragment in (expected,) if isinstance(expected, str) else expected:
        assert fragment in error
    named_file = "pyproject.toml" if "pyproject.toml" in str(expected) else "manifest.toml"
    assert error.startswith(f"spark2-5-bundle: error: {project / named_file}: ")


def test_duplicate_bundle_id_is_one_clear_error(project, capsys):
    source = project / "manifest.toml"
    text = source.read_text()
    source.write_text(text + text[text.index("\n[[bundle]]") :])
    error = render_failure(project, capsys)
    assert 'bundle[1].extension_id = "org.vllm-hust.spark2-5": duplicate extension_id' in error


def test_version_comes_from_pyproject(project, capsys):
    pyproject_path = project / "pyproject.toml"
    text = pyproject_path.read_text()
    pyproject_path.write_text(text.replace('version = "', 'version = "not a version', 1))
    error = render_failure(project, capsys)
    assert f"{pyproject_path}: project.version = " in error
    assert "is not a valid PEP 440 version" in error


def test_render_rewrites_a_stale_manifest_atomically(project, capsys):
    (rendered,) = bundle.render(PROJECT_ROOT)
    target = project / rendered.path.relative_to(PROJECT_ROOT)
    target.write_text('{"stale": true}\n')

    assert main(["render", "--root", str(project), "--check"]) == 2
    assert f"{target}: stale" in capsys.readouterr().err

    assert main(["render", "--root", str(project)]) == 0
    assert capsys.readouterr().out == f"wrote: {target}\n"
    assert target.read_text() == rendered.text
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o644
    assert sorted(path.name for path in target.parent.iterdir()) == [
        "__init__.py",
        bundle.RENDERED_FILENAME,
    ]

    assert main(["render", "--root", str(project)]) == 0
    assert capsys.readouterr().out == f"unchanged: {target}\n"
    assert main(["render", "--root", str(project), "--check"]) == 0
