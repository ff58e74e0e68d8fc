"""The extension manager's contract, as the real ``vllm-hust-ext`` was measured to behave.

The manager is not on the package index, so each measured behaviour is a test
here, named after it, that runs two ways: ``recorded`` checks what this
toolkit predicts (``vllm-hust-bundle inspect``/``env``, the manager modules)
against the measured behaviour; ``vllm_hust_ext`` runs the real manager's CLI
where the ``vllm_hust_ext`` package is installed, and is skipped with the
reason elsewhere. Where this project deliberately differs (it never writes the
manager's state; its errors are one line; it validates more strictly), the
test says so and checks the project's side.
"""

from __future__ import annotations

import configparser
import dataclasses
import json
import re
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

from carrier_harness.env import clean_env
from carrier_harness.manager import (
    MANAGERS,
    TOOL,
    enable_in,
    inspect,
    manager_env,
    real_manager,
    run,
    write_state,
)
from carrier_harness.project import (
    fake_host_distribution,
    our_bundles,
    pyproject,
    with_status,
)
from vllm_hust_bundle_kit import installed, manager_launch
from vllm_hust_bundle_kit.contract import (
    BUNDLE_GROUP,
    ENABLED_BUNDLES_ENVS,
    MANAGER_LAUNCH_ONLY_ENVS,
    PLUGINS_ENV,
    RENDERED_FILENAME,
    STATE_ENV,
    VLLM_PLUGIN_GROUP,
)
from vllm_hust_bundle_kit.errors import BundleError

# --- the built wheel: what the manager discovers -------------------------------------------


@pytest.fixture(scope="module")
def installed_wheel(wheel, tmp_path_factory) -> Path:
    """The wheel installed (without dependencies) into a scratch ``--target`` folder."""
    target = tmp_path_factory.mktemp("site")
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    result = run(
        [*pip, "install", "--no-deps", "--no-compile", "--target", str(target), str(wheel)],
        env=clean_env(),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return target


def test_wheel_carries_the_manifests_and_both_entry_point_groups(wheel):
    project = pyproject()
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        (dist_info,) = {name.split("/")[0] for name in names if ".dist-info/" in name}
        entry_points = configparser.ConfigParser(delimiters=("=",))
        entry_points.optionxform = str
        entry_points.read_string(archive.read(f"{dist_info}/entry_points.txt").decode())
        record = archive.read(f"{dist_info}/RECORD").decode()
        for found in our_bundles():
            manifest = found.manifest_path.relative_to(found.distribution.package_root)
            assert archive.read(manifest.as_posix()) == found.manifest_path.read_bytes()
            assert manifest.as_posix() in record
        assert "vllm_hust_bundle_kit/manifest.schema.json" in names
    for group in (BUNDLE_GROUP, VLLM_PLUGIN_GROUP):
        assert dict(entry_points[group]) == project["entry-points"][group]
    assert dict(entry_points["console_scripts"]) == project["scripts"]


DISCOVERY_PROBE = {
    "recorded": """
        from vllm_hust_bundle_kit import installed
        (found,) = installed.select(installed.discover(), [extension_id])
        installed.validate(found)
    """,
    "vllm_hust_ext": """
        from vllm_hust_ext.discovery import discover_bundles
        (found,) = discover_bundles((extension_id,))
    """,
}


@pytest.mark.parametrize("manager_kind", MANAGERS)
def test_discovery_from_the_installed_wheel_imports_no_carrier(
    installed_wheel, bundle, manager_kind
):
    if manager_kind == "vllm_hust_ext":
        real_manager()
    carriers = sorted({target.split(":")[0].split(".")[0] for target in bundle.carriers()})
    probe = textwrap.dedent(
        f"""
        import json, sys
        target, extension_id = sys.argv[1:]
        sys.path.insert(0, target)
        {textwrap.dedent(DISCOVERY_PROBE[manager_kind]).strip().replace(chr(10), chr(10) + 8 * " ")}
        print(json.dumps({{
            "manifest_path": str(found.manifest_path),
            "imported": sorted(
                name for name in sys.modules
                if name.split(".")[0] in {[*carriers, "vllm", "torch", "transformers"]!r}
            ),
        }}))
        """
    )
    result = run(
        [sys.executable, "-I", "-c", probe, str(installed_wheel), bundle.extension_id],
        env=clean_env(),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    found = json.loads(result.stdout)
    manifest = bundle.manifest_path.relative_to(bundle.distribution.package_root).as_posix()
    assert found["manifest_path"] == str(installed_wheel / manifest)
    assert found["imported"] == []


# --- point 1 (of docs/bundle.md): VLLM_PLUGINS, with `ascend`, while a plugin bundle is enabled

PLUGIN_CASES = {
    "unset": (None, "ascend,{plugin}"),
    "one-plugin": ("lora_filesystem_resolver", "lora_filesystem_resolver,ascend,{plugin}"),
    "empty": ("", "ascend,{plugin}"),
}


@pytest.mark.parametrize("manager_kind", MANAGERS)
@pytest.mark.parametrize(("allowed", "expected"), PLUGIN_CASES.values(), ids=PLUGIN_CASES)
def test_vllm_plugins_is_set_and_ascend_is_added_while_the_bundle_is_enabled(
    manager_kind, bundle, switch, plugin, verified_host, state_file, allowed, expected
):
    extra = {} if allowed is None else {PLUGINS_ENV: allowed}
    env = manager_env(state_file, verified_host, **extra)
    if manager_kind == "recorded":
        result = run([TOOL, "env", "--json", bundle.extension_id], env=env)
        assert result.returncode == 0, result.stderr
        injected = json.loads(result.stdout)
    else:
        cli = real_manager()
        assert run([cli, "extension", "enable", bundle.extension_id], env=env).returncode == 0
        dry_run = run([cli, "run", "--dry-run", "--", "true"], env=env)
        assert dry_run.returncode == 0, dry_run.stderr
        injected = json.loads(dry_run.stdout)["environment"]
    assert injected[PLUGINS_ENV] == expected.format(plugin=plugin)
    assert STATE_ENV not in injected  # exported by the caller here, never injected
    assert injected[switch] == "1"
    assert injected[ENABLED_BUNDLES_ENVS[0]] == bundle.extension_id


# --- point 3: a real launch sets more than --dry-run shows ---------------------------------------


@pytest.mark.parametrize("manager_kind", MANAGERS)
@pytest.mark.parametrize("how", ["never-enabled", "disabled"])
def test_with_nothing_enabled_only_the_empty_bundle_list_is_injected(
    manager_kind, bundle, verified_host, state_file, how
):
    env = manager_env(state_file, verified_host, **{PLUGINS_ENV: "lora_filesystem_resolver"})
    if manager_kind == "recorded":
        if how == "disabled":
            write_state(state_file, {bundle.extension_id: {"enabled": False, "configuration": {}}})
        code, report, err = inspect(bundle.extension_id, env)
        assert code == 1 and report["manager_state"]["enabled"] is False
        injected = report["launch_environment"]
        (line,) = err.splitlines()
        assert f"{state_file}: extensions.{bundle.extension_id}.enabled is not true" in line
    else:
        cli = real_manager()
        if how == "disabled":
            assert run([cli, "extension", "enable", bundle.extension_id], env=env).returncode == 0
            assert run([cli, "extension", "disable", bundle.extension_id], env=env).returncode == 0
        dry_run = run([cli, "run", "--dry-run", "--", "true"], env=env)
        assert dry_run.returncode == 0, dry_run.stderr
        injected = json.loads(dry_run.stdout)["environment"]
    assert injected == {ENABLED_BUNDLES_ENVS[0]: ""}


@pytest.mark.parametrize("manager_kind", MANAGERS)
def test_a_real_launch_sets_evidence_variables_that_dry_run_does_not_show(
    manager_kind, bundle, verified_host, state_file
):
    env = manager_env(state_file, verified_host)
    if manager_kind == "recorded":
        enable_in(state_file, bundle.extension_id)
        code, report, _ = inspect(bundle.extension_id, env)
        assert code == 0
        assert report["launch_also_sets"] == list(MANAGER_LAUNCH_ONLY_ENVS)
        return
    cli = real_manager()
    assert run([cli, "extension", "enable", bundle.extension_id], env=env).returncode == 0
    probe = "import json, os; print(json.dumps(dict(os.environ)))"
    launched = run([cli, "run", "--", sys.executable, "-c", probe], env=env)
    assert launched.returncode == 0, launched.stderr
    seen = json.loads(launched.stdout.splitlines()[-1])
    assert set(MANAGER_LAUNCH_ONLY_ENVS) <= set(seen)


# --- point 4: another bundle's enabled-but-missing entry blocks the manager ----------------------


@pytest.mark.parametrize("manager_kind", MANAGERS)
def test_an_enabled_bundle_that_is_not_installed_blocks_the_manager(
    manager_kind, bundle, verified_host, state_file
):
    write_state(state_file, {"org.example.other": {"enabled": True, "configuration": {}}})
    env = manager_env(state_file, verified_host)
    expected = "enabled Bundles are not installed: ['org.example.other']"
    if manager_kind == "recorded":
        code, report, err = inspect(bundle.extension_id, env)
        assert code == 1
        assert expected in report["manager_state"]["problem"]
        assert err.count("\n") == 1
        return
    cli = real_manager()
    for argv in (["extension", "enable"], ["extension", "disable"]):
        result = run([cli, *argv, bundle.extension_id], env=env)
        assert result.returncode == 2 and expected in result.stderr
    result = run([cli, "run", "--dry-run", "--", "true"], env=env)
    assert result.returncode == 2 and expected in result.stderr


# --- point 5: pre-release hosts are judged by the installed packaging ----------------------------

HOST_VERSIONS = ["0.32.1rc1", "0.32.1rc1.dev3", "0.33.0", "0.26.0"]


@pytest.mark.parametrize("manager_kind", MANAGERS)
@pytest.mark.parametrize("host_version", HOST_VERSIONS)
def test_prerelease_hosts_are_judged_by_the_installed_packaging(
    manager_kind, bundle, tmp_path, state_file, host_version
):
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    version_range = bundle.manifest["host"]["version_range"]
    # What packaging's own default says: the manager asks exactly this.
    expected = (
        "compatible"
        if SpecifierSet(version_range).contains(Version(host_version))
        else "incompatible"
    )
    env = manager_env(state_file, fake_host_distribution(tmp_path, "vllm", host_version))
    if manager_kind == "recorded":
        enable_in(state_file, bundle.extension_id)
        code, report, _ = inspect(bundle.extension_id, env)
        assert report["host"]["installed"] == host_version
        assert report["host"]["compatibility"] == expected
        assert code == (0 if expected == "compatible" else 1)
        if Version(host_version).is_prerelease and expected == "compatible":
            assert "no pre-release was verified" in report["host"]["note"]
        return
    result = run([real_manager(), "extension", "check", bundle.extension_id], env=env)
    assert result.returncode == 0, result.stderr
    assert expected in json.loads(result.stdout)["states"]


# --- point 6: the manager owns its state; this project never writes it ---------------------------


@pytest.mark.parametrize("manager_kind", MANAGERS)
def test_enable_and_disable_are_the_managers_alone(manager_kind, state_file):
    """The real manager's `disable <unknown id>` exits 0 and records the id; this project
    has no command that writes the manager's state, so it cannot diverge from it."""
    if manager_kind == "recorded":
        result = run([TOOL, "--help"], env=clean_env())
        assert result.returncode == 0
        listing = result.stdout.split("positional arguments:", 1)[1].split("options:", 1)[0]
        commands = re.findall(r"^    (\w+)", listing, re.M)
        assert commands == ["render", "validate", "inspect", "env"]
        return
    env = manager_env(state_file)
    result = run([real_manager(), "extension", "disable", "org.example.unknown"], env=env)
    assert result.returncode == 0
    state = json.loads(state_file.read_text())
    assert state["extensions"]["org.example.unknown"]["enabled"] is False


# --- a deliberate difference: error lines --------------------------------------------------------


@pytest.mark.parametrize("manager_kind", MANAGERS)
def test_errors_are_one_line_here_and_two_lines_from_the_manager(manager_kind, state_file):
    env = manager_env(state_file)
    if manager_kind == "recorded":
        result = run([TOOL, "env", "org.example.not-installed"], env=env)
        assert result.returncode == 2
        (line,) = result.stderr.splitlines()
        assert line.startswith("vllm-hust-bundle: error: extension 'org.example.not-installed'")
        return
    result = run([real_manager(), "extension", "enable", "org.example.not-installed"], env=env)
    assert result.returncode == 2
    usage, error = result.stderr.splitlines()
    assert usage.startswith("usage: vllm-hust-ext") and error.startswith("vllm-hust-ext: error:")


# --- a deliberate difference: a corrupt state file -----------------------------------------------


@pytest.mark.parametrize("manager_kind", MANAGERS)
@pytest.mark.parametrize(
    ("content", "recorded", "measured"),
    [
        ("{", "is not valid JSON", "Expecting property name enclosed in double quotes"),
        (
            json.dumps({"schema_version": 3, "extensions": {}}),
            "schema_version = 3: must be 2",
            "unsupported schema",
        ),
        (
            json.dumps({"schema_version": 2, "extensions": {"x": {"enabled": "on"}}}),
            'extensions.x.enabled = "on": must be true or false',
            "enabled must be boolean",
        ),
    ],
    ids=["not-json", "schema-3", "enabled-not-boolean"],
)
def test_a_corrupt_state_file_is_reported_and_left_untouched(
    manager_kind, bundle, verified_host, state_file, content, recorded, measured
):
    state_file.parent.mkdir(parents=True)
    state_file.write_text(content)
    env = manager_env(state_file, verified_host)
    if manager_kind == "recorded":
        code, report, _ = inspect(bundle.extension_id, env)
        assert code == 1
        problem = report["manager_state"]["problem"]
        assert problem.startswith(f"{state_file}: ") and recorded in problem  # names the file
    else:
        result = run([real_manager(), "extension", "enable", bundle.extension_id], env=env)
        assert result.returncode == 2 and measured in result.stderr
    assert state_file.read_text() == content


@pytest.mark.parametrize("kind", ["fifo", "folder", "deep", "huge"])
def test_a_hostile_state_path_is_reported_without_hanging(bundle, verified_host, tmp_path, kind):
    import os

    state = tmp_path / "state"
    if kind == "fifo":
        os.mkfifo(state)
    elif kind == "folder":
        state.mkdir()
    elif kind == "deep":
        state.write_text("[" * 100_000)
    else:
        state.write_bytes(b" " * (5 * 1024 * 1024))
    code, report, _ = inspect(bundle.extension_id, manager_env(state, verified_host))
    assert code == 1
    assert report["manager_state"]["problem"].startswith(f"{state}: ")


def test_a_state_path_under_a_regular_file_is_reported(bundle, verified_host, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    code, report, _ = inspect(bundle.extension_id, manager_env(blocker / "x.json", verified_host))
    # Nothing to read there: the manager would see no state, so nothing is enabled.
    assert report["manager_state"] == {
        "path": str(blocker / "x.json"),
        "enabled": False,
        "problem": None,
    }
    assert code == 1 and report["launch_environment"] == {ENABLED_BUNDLES_ENVS[0]: ""}


# --- point 7: an import_only bundle --------------------------------------------------------------


def test_an_import_only_bundle_is_refused_a_launch_with_the_managers_words(bundle):
    with pytest.raises(BundleError) as error:
        manager_launch.activation_environment([with_status(bundle, "import_only")], clean_env())
    assert str(error.value) == (
        f"{bundle.manifest_path}: refusing to launch {bundle.extension_id!r}: extension is "
        "descriptor-only and cannot be enabled (implementation status: import_only)"
    )


# --- a deliberate difference: this project validates more strictly than the manager --------------


def _mutated(bundle: installed.Bundle, change) -> installed.Bundle:
    manifest = json.loads(json.dumps(bundle.manifest))
    change(manifest)
    return dataclasses.replace(bundle, manifest=manifest)


STRICTER = {
    "open-ended-range": (
        lambda m: m["host"].update(version_range=">=0"),
        "host.version_range",
    ),
    "schema-0.3": (lambda m: m.update(schema_version="0.3"), "schema_version"),
    "unresolvable-reference": (
        lambda m: m["implementation"][0].update(object="no_such_object"),
        "implementation[0].object",
    ),
    "vllm-plugins-in-environment": (
        lambda m: m["activation"]["environment"].update(VLLM_PLUGINS="x"),
        "activation.environment.VLLM_PLUGINS",
    ),
    "empty-environment-value": (
        lambda m: m["activation"]["environment"].update(SOME_SETTING=""),
        "activation.environment.SOME_SETTING",
    ),
    "dollar-environment-value": (
        lambda m: m["activation"]["environment"].update(SOME_SETTING="$HOME"),
        "activation.environment.SOME_SETTING",
    ),
    "version-not-the-distributions": (
        lambda m: m.update(extension_version="9.9.9"),
        "extension_version",
    ),
}


@pytest.mark.parametrize(("change", "field"), STRICTER.values(), ids=STRICTER)
def test_validate_refuses_what_the_manager_accepts(bundle, change, field):
    with pytest.raises(BundleError) as error:
        installed.validate(_mutated(bundle, change))
    assert f": {field} = " in str(error.value)


# --- launches predicted from the host range -----------------------------------------------------


def test_launch_is_refused_when_the_host_is_not_installed(bundle):
    active = with_status(bundle, "active")
    active.manifest["host"]["name"] = "vllm-host-that-is-not-installed"
    with pytest.raises(BundleError) as error:
        manager_launch.activation_environment([active], clean_env())
    assert str(error.value) == (
        f"{bundle.manifest_path}: refusing to launch {bundle.extension_id!r}: "
        "host vllm-host-that-is-not-installed is not installed (unknown)"
    )


def test_bundles_that_disagree_on_a_variable_cannot_be_enabled_together(
    bundle, switch, verified_host, monkeypatch
):
    monkeypatch.syspath_prepend(str(verified_host))
    first = with_status(bundle, "active")
    second = dataclasses.replace(
        with_status(bundle, "active"),
        extension_id="org.example.other",
        manifest_path=Path("other.json"),
    )
    second.manifest["activation"]["environment"] = {switch: "0"}
    with pytest.raises(BundleError) as error:
        manager_launch.activation_environment([first, second], clean_env())
    assert str(error.value) == (
        f'other.json: activation.environment.{switch} = "0": conflicts with "1" '
        f"from {bundle.extension_id}; enable only one of them"
    )


def test_env_refuses_a_launch_the_manager_would_refuse(bundle, tmp_path, state_file):
    host = fake_host_distribution(tmp_path, "vllm", "0.0.1")
    result = run([TOOL, "env", bundle.extension_id], env=manager_env(state_file, host))
    assert result.returncode == 1
    assert result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert line.startswith(
        f"vllm-hust-bundle: error: {bundle.manifest_path}: refusing to launch "
        f"{bundle.extension_id!r}"
    )
    assert "host vllm 0.0.1 is outside host.version_range" in line


def test_the_manifest_file_name_is_the_contracts(bundle):
    assert bundle.manifest_path.name == RENDERED_FILENAME
