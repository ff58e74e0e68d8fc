"""manifest.toml, the JSON manifest rendered from it, and the checks a schema cannot make.

Driven through ``vllm-hust-bundle render`` on copies of this repository, so
every error is checked as an operator sees it: one line naming the file, the
field and its value, exit status 2, and nothing written.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import stat
from pathlib import Path

import packaging
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from carrier_harness.project import (
    PROJECT_ROOT,
    copy_project,
    manifest_source,
    normalized,
    our_bundles,
    pyproject,
    with_status,
)
from vllm_hust_bundle_kit import installed, render
from vllm_hust_bundle_kit.cli import main
from vllm_hust_bundle_kit.contract import RENDERED_FILENAME, VLLM_PLUGIN_GROUP
from vllm_hust_bundle_kit.schemas import MANIFEST_SCHEMA
from vllm_hust_bundle_kit.versions import host_in_range, range_problem, rules_disagree


def test_manifest_schema_is_a_valid_json_schema():
    Draft202012Validator.check_schema(MANIFEST_SCHEMA)


def test_checked_in_manifest_is_what_manifest_toml_renders():
    for rendered in render.render(PROJECT_ROOT):
        assert rendered.is_current(), (
            f"{rendered.path} is stale: run `vllm-hust-bundle render` and commit the result"
        )


def test_each_bundle_in_manifest_toml_is_installed_under_its_entry_point():
    source_ids = [item["extension_id"] for item in manifest_source()["bundle"]]
    found = our_bundles()
    assert [bundle.extension_id for bundle in found] == sorted(source_ids)
    rendered = {
        item.path.parent.name: json.loads(item.text) for item in render.render(PROJECT_ROOT)
    }
    for bundle in found:
        installed.validate(bundle)
        assert bundle.manifest_path.name == RENDERED_FILENAME
        assert bundle.manifest == rendered[bundle.manifest_path.parent.name]


def test_every_general_plugin_of_the_distribution_is_a_carrier_of_a_bundle():
    name = normalized(pyproject()["name"])
    plugins = [
        entry_point
        for entry_point in importlib.metadata.entry_points(group=VLLM_PLUGIN_GROUP)
        if normalized(entry_point.dist.name) == name
    ]
    assert plugins
    activated = {
        (item["name"], target)
        for bundle in our_bundles()
        for item in bundle.manifest["activation"]["entry_points"]
        for target in bundle.carriers()
        if item["group"] == VLLM_PLUGIN_GROUP
    }
    for plugin in plugins:
        assert (plugin.name, plugin.value) in activated, plugin


def test_active_carriers_rest_on_archived_evidence():
    for source in manifest_source()["bundle"]:
        for carrier in source["carriers"]:
            if carrier["status"] == "active":
                assert carrier["evidence"], carrier
            for evidence in carrier["evidence"]:
                assert (PROJECT_ROOT / evidence).is_file(), evidence


def test_activation_blocker_follows_the_documented_rule():
    found = our_bundles()[0]
    assert installed.activation_blocker(with_status(found, "import_only").manifest) == (
        "extension is descriptor-only and cannot be enabled (implementation status: import_only)"
    )
    assert installed.activation_blocker(with_status(found, "active").manifest) is None
    mixed = with_status(found, "legacy_unregistered").manifest
    mixed["implementation"].append({**mixed["implementation"][0], "status": "import_only"})
    assert installed.activation_blocker(mixed) == (
        "extension is descriptor-only and cannot be enabled "
        "(implementation status: import_only, legacy_unregistered)"
    )
    mixed["implementation"].append({**mixed["implementation"][0], "status": "active"})
    assert installed.activation_blocker(mixed) is None


def test_each_host_range_is_bounded_and_contains_its_verified_hosts():
    for source in manifest_source()["bundle"]:
        host = source["host"]
        assert range_problem(host["version_range"]) is None
        assert host["verified_on"]
        for verified in host["verified_on"]:
            assert host_in_range(verified, host["version_range"])


# --- how a host version is judged against a range (as the manager judges it) ----------


@pytest.mark.parametrize(
    ("host_version", "inside"),
    [
        ("0.32.0", True),
        ("0.32.0+cpu", True),
        ("0.32.7", True),
        ("0.32.0.post1", True),
        ("0.32.0rc1", False),  # below the lower bound under either rule
        ("0.31.0", False),
        ("0.33.0", False),
        ("0.33.0rc1", False),  # `<0.33` excludes 0.33's own pre-releases under either rule
        ("not-a-version", False),
    ],
)
def test_final_releases_and_the_bounds_own_prereleases_are_judged_alike(host_version, inside):
    assert host_in_range(host_version, ">=0.32.0,<0.33") is inside
    assert not rules_disagree(host_version, ">=0.32.0,<0.33")


@pytest.mark.parametrize("host_version", ["0.32.1rc1", "0.32.1rc1.dev3", "0.32.5a1"])
def test_a_prerelease_between_the_bounds_is_judged_as_the_installed_packaging_does(host_version):
    """packaging >= 26 admits it, older packaging does not; the manager uses the installed one."""
    assert rules_disagree(host_version, ">=0.32.0,<0.33")
    lenient = int(packaging.__version__.split(".")[0]) >= 26
    assert host_in_range(host_version, ">=0.32.0,<0.33") is lenient


def test_a_range_that_names_a_prerelease_admits_prereleases_under_both_rules():
    assert host_in_range("0.33.0rc2", ">=0.33.0rc1,<0.34")
    assert not rules_disagree("0.33.0rc2", ">=0.33.0rc1,<0.34")


@pytest.mark.parametrize(
    "version_range", [">=0", ">0", ">=0.32.0", "<0.33", "!=0.31.0", ">=0,<0.33", ""]
)
def test_open_ended_host_ranges_are_rejected(version_range):
    assert range_problem(version_range)


@pytest.mark.parametrize("version_range", [">=0.32.0,<0.33", "==0.32.0", "==0.32.*", "~=0.32.0"])
def test_bounded_host_ranges_are_accepted(version_range):
    assert range_problem(version_range) is None


# --- bad manifest.toml: one line naming file, key and value; nothing written ---------------

SOURCE_TEXT = (PROJECT_ROOT / "manifest.toml").read_text()
FIRST = manifest_source()["bundle"][0]
FIRST_ID = FIRST["extension_id"]
(SWITCH,) = [name for name, value in FIRST["activation"]["environment"].items() if value == "1"]
FIRST_PLUGIN = FIRST["activation"]["entry_points"][0]["name"]
FIRST_CARRIER = FIRST["carriers"][0]
SECOND_REF = FIRST["components"][1]["implementation_ref"]
EVIDENCE_LIST = re.search(r"evidence = \[[^\]]*\]", SOURCE_TEXT).group(0)
RANGE_LINE = re.search(r'^version_range = "[^"]*"', SOURCE_TEXT, re.M).group(0)
FIRST_VERIFIED = FIRST["host"]["verified_on"][0]
FIRST_PROTOCOL = re.search(r'\[\[bundle\.protocols\]\]\nname = "[^"]*"\n', SOURCE_TEXT).group(0)
FIRST_CARRIER_TABLE = re.search(r"\[\[bundle\.carriers\]\]\n(?:.*\n)*?\]\n", SOURCE_TEXT)
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
        f'extension_id = "{FIRST_ID}"',
        f'extension_id = "{FIRST_ID.replace("-", "_")}_x"',
        f'bundle[0].extension_id = "{FIRST_ID.replace("-", "_")}_x": must be lowercase',
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
        'version_range = ">=99.0,<99.1"',
        f'bundle[0].host.verified_on[0] = "{FIRST_VERIFIED}": is outside host.version_range',
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
        f'status = "{FIRST_CARRIER["status"]}"',
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
        'evidence = ["extensions/no-such-run.log"]',
        'bundle[0].carriers[0].evidence[0] = "extensions/no-such-run.log": '
        "must be an existing file",
    ),
    "evidence-outside-the-project": (
        EVIDENCE_LIST,
        'evidence = ["../../../../../../etc/hostname"]',
        "must be an existing file inside the project",
    ),
    "evidence-path-with-nul": (
        EVIDENCE_LIST,
        'evidence = ["extensions/a\\u0000b"]',
        "must be an existing file inside the project",
    ),
    "evidence-path-too-long": (
        EVIDENCE_LIST,
        f'evidence = ["{"x" * 5000}"]',
        "must be an existing file inside the project",
    ),
    "carrier-object-not-defined": (
        f'object = "{FIRST_CARRIER["object"]}"',
        'object = "regsiter"',
        'bundle[0].carriers[0].object = "regsiter": ',
    ),
    "carrier-listed-twice": (
        FIRST_CARRIER_TABLE.group(0),
        FIRST_CARRIER_TABLE.group(0)
        + FIRST_CARRIER_TABLE.group(0).replace('status = "active"', 'status = "import_only"'),
        "bundle[0].carriers[1] = ",
    ),
    "protocol-listed-twice": (
        FIRST_PROTOCOL,
        FIRST_PROTOCOL + "\n" + FIRST_PROTOCOL,
        "duplicate protocol; list each once",
    ),
    "component-module-missing": (
        f'"{SECOND_REF}"',
        f'"{SECOND_REF.split(".")[0]}.no_such_module:X"',
        f'bundle[0].components[1].implementation_ref = "{SECOND_REF.split(".")[0]}'
        f".no_such_module:X\": module '{SECOND_REF.split('.')[0]}.no_such_module' not found",
    ),
    "entry-point-not-installed": (
        f'name = "{FIRST_PLUGIN}" }}',
        'name = "no_such_plugin" }',
        'bundle[0].activation.entry_points[0] = {"group": "vllm.general_plugins", '
        '"name": "no_such_plugin"}: distribution',
    ),
    "environment-not-a-literal": (
        f'{SWITCH} = "1"',
        f'{SWITCH} = "${{ENABLE}}"',
        f'bundle[0].activation.environment.{SWITCH} = "${{ENABLE}}": must be the literal value',
    ),
    "environment-owned-by-the-manager": (
        f'{SWITCH} = "1"',
        f'{SWITCH} = "1", VLLM_PLUGINS = "x"',
        'bundle[0].activation.environment.VLLM_PLUGINS = "x": is computed by the extension manager',
    ),
    "environment-not-a-string": (
        f'{SWITCH} = "1"',
        f"{SWITCH} = 1",
        f"bundle[0].activation.environment.{SWITCH} = 1: must be a string",
    ),
    "no-entry-point-for-bundle": (
        f'extension_id = "{FIRST_ID}"',
        f'extension_id = "{FIRST_ID}-x"',
        f"pyproject.toml: project.entry-points.vllm_hust.extension_bundles.'{FIRST_ID}': "
        "no [[bundle]] with this extension_id",
    ),
    "deeply-nested": (
        "requires_services = []",
        "requires_services = " + "[" * 5000 + "]" * 5000,
        "nested too deeply",
    ),
}


def _tree_state(root: Path) -> dict[str, bytes]:
    return {
        str(path.relative_to(root)): path.read_bytes()
        for path in sorted(root.rglob("*"))
        if path.is_file() and "__pycache__" not in path.parts
    }


@pytest.fixture
def project(tmp_path):
    (tmp_path / "project").mkdir()
    return copy_project(tmp_path / "project")


def render_failure(project, capsys, root=None) -> str:
    """Run ``render`` on ``project``; assert it failed cleanly and wrote nothing; the line."""
    before = _tree_state(project.parent)
    assert main(["render", "--root", str(root or project)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.endswith("\n") and err.count("\n") == 1, err
    assert err.startswith("vllm-hust-bundle: error: ")
    assert _tree_state(project.parent) == before, "render wrote something despite the error"
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
    assert error.startswith(f"vllm-hust-bundle: error: {project / named_file}: ")


def test_duplicate_bundle_id_is_one_clear_error(project, capsys):
    source = project / "manifest.toml"
    text = source.read_text()
    source.write_text(text + text[text.index("\n[[bundle]]") :])
    error = render_failure(project, capsys)
    assert f'bundle[1].extension_id = "{FIRST_ID}": duplicate extension_id' in error


def test_version_comes_from_pyproject(project, capsys):
    pyproject_path = project / "pyproject.toml"
    text = pyproject_path.read_text()
    pyproject_path.write_text(text.replace('version = "', 'version = "not a version', 1))
    error = render_failure(project, capsys)
    assert f"{pyproject_path}: project.version = " in error
    assert "is not a valid PEP 440 version" in error


def _first_bundle_entry_point(text: str) -> str:
    return re.search(r'^"' + re.escape(FIRST_ID) + r'" = "[^"]*"$', text, re.M).group(0)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ('"/etc/vllm-hust"', "whose value is the dotted name of the package"),
        ('"src.outside"', "is not a folder under the project root"),
        ("3", "project.entry-points.vllm_hust.extension_bundles." + FIRST_ID + " = 3: must be"),
    ],
    ids=["absolute-path", "no-such-package", "not-a-string"],
)
def test_a_bundle_entry_point_must_name_a_package_inside_the_project(
    project, capsys, value, expected
):
    pyproject_path = project / "pyproject.toml"
    text = pyproject_path.read_text()
    line = _first_bundle_entry_point(text)
    pyproject_path.write_text(text.replace(line, f'"{FIRST_ID}" = {value}'))
    assert expected in render_failure(project, capsys)


def test_an_evidence_symlink_loop_is_one_clear_error(project, capsys):
    loop = project / "extensions" / "loop"
    loop.symlink_to(loop)
    source = project / "manifest.toml"
    source.write_text(source.read_text().replace(EVIDENCE_LIST, 'evidence = ["extensions/loop"]'))
    assert "must be an existing file inside the project" in render_failure(project, capsys)


def test_evidence_that_does_not_match_its_sha256sums_is_refused(project, capsys):
    sums = [e for e in FIRST_CARRIER["evidence"] if e.endswith("SHA256SUMS")]
    assert sums, "the carrier's evidence lists its SHA256SUMS"
    listed = (project / sums[0]).read_text().splitlines()[0].split("  ")[1]
    (project / sums[0]).parent.joinpath(listed).write_text("edited by hand\n")
    error = render_failure(project, capsys)
    assert f"{listed} does not match its sha256" in error


@pytest.mark.parametrize(
    "source",
    [b"def register(:\n", b"register = 1\n\0", b"register = '\xff\xfe'\n"],
    ids=["syntax-error", "nul-byte", "not-utf8"],
)
def test_a_carrier_module_that_cannot_be_parsed_is_named(project, capsys, source):
    module = project / "src" / Path(*FIRST_CARRIER["module"].split(".")) / "__init__.py"
    module.write_bytes(source)
    error = render_failure(project, capsys)
    assert f'bundle[0].carriers[0].object = "{FIRST_CARRIER["object"]}"' in error
    assert "cannot be parsed" in error


@pytest.mark.parametrize(
    "make", ["regular-file", "directory-manifest", "not-utf8", "missing"], ids=str
)
def test_an_unreadable_project_is_one_clear_error(project, capsys, make):
    root = project
    if make == "regular-file":
        root = project / "pyproject.toml"
    elif make == "directory-manifest":
        (project / "manifest.toml").unlink()
        (project / "manifest.toml").mkdir()
    elif make == "not-utf8":
        (project / "manifest.toml").write_bytes(b"kind = '\xff'\n")
    else:
        (project / "manifest.toml").unlink()
    error = render_failure(project, capsys, root=root)
    assert "manifest.toml" in error


def test_render_rewrites_a_stale_manifest_atomically(project, capsys):
    (rendered,) = render.render(PROJECT_ROOT)
    target = project / rendered.path.relative_to(PROJECT_ROOT)
    target.write_text('{"stale": true}\n')

    assert main(["render", "--root", str(project), "--check"]) == 1
    assert f"{target}: stale" in capsys.readouterr().err

    assert main(["render", "--root", str(project)]) == 0
    assert capsys.readouterr().out == f"wrote: {target}\n"
    assert target.read_text() == rendered.text
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o644
    assert sorted(path.name for path in target.parent.iterdir()) == [
        "__init__.py",
        RENDERED_FILENAME,
    ]

    assert main(["render", "--root", str(project), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {str(target): "unchanged"}
    assert main(["render", "--root", str(project), "--check"]) == 0


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_any_corruption_of_manifest_toml_is_refused_or_rendered_never_a_traceback(
    project, capsys, data
):
    """Splice random bytes into manifest.toml: render either succeeds (the change was
    harmless) or prints one error line with exit status 2; it never writes outside the
    bundle package and never raises."""
    source = project / "manifest.toml"
    original = SOURCE_TEXT.encode()
    start = data.draw(st.integers(0, len(original)), label="start")
    end = data.draw(st.integers(start, min(len(original), start + 40)), label="end")
    insert = data.draw(st.binary(max_size=30) | st.sampled_from([b"[", b'"', b"\0", b"\xff"]))
    source.write_bytes(original[:start] + insert + original[end:])
    outside_before = {k: v for k, v in _tree_state(project).items() if RENDERED_FILENAME not in k}
    status = main(["render", "--root", str(project)])
    err = capsys.readouterr().err
    assert status in (0, 2)
    if status == 2:
        assert err.count("\n") == 1 and err.startswith("vllm-hust-bundle: error: "), err
    outside_after = {k: v for k, v in _tree_state(project).items() if RENDERED_FILENAME not in k}
    assert outside_after == outside_before
    source.write_bytes(original)
