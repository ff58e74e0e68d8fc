"""The extension manager's enable/run contract, driven against the built wheel and real vLLM.

The manager (``vllm-hust-ext``) is not on PyPI, so ``bundle.py`` implements its
documented contract and these tests drive it. Where the ``vllm_hust_ext`` package
is importable the contract tests also run through it; otherwise they are
reported as skipped with the reason.
"""

from __future__ import annotations

import configparser
import dataclasses
import importlib.util
import json
import os
import stat
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest
from bundle_support import (
    PROJECT_ROOT,
    fake_host_distribution,
    manifest_source,
    our_bundles,
    pyproject,
    with_status,
)
from conftest import clean_env

from vllm_spark2_5_plugin import _gate, bundle
from vllm_spark2_5_plugin.bundle import BundleError
from vllm_spark2_5_plugin.testing.server import CPU_SERVE_ENV, VllmServer

LOAD_LINE = "vllm-spark2_5-plugin loaded ("
REAL_MANAGER_MISSING = (
    "vllm_hust_ext is not importable here (not on PyPI; install it from its git repository "
    "to run the contract through the real manager)"
)


def run(argv, env, **kwargs) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, env=env, capture_output=True, text=True, timeout=300, check=False, **kwargs
    )


@pytest.fixture(scope="module")
def spark_bundle():
    (found,) = [item for item in our_bundles() if item.extension_id == _gate.BUNDLE_ID]
    return found


@pytest.fixture
def verified_host(tmp_path, monkeypatch):
    """Launch checks see a verified vLLM whichever release runs the suite: the tests
    using this are about what is injected; test_launch_follows_the_host_range checks
    the range itself."""
    (source,) = [b for b in manifest_source()["bundle"] if b["extension_id"] == _gate.BUNDLE_ID]
    verified = source["host"]["verified_on"][0]
    monkeypatch.syspath_prepend(str(fake_host_distribution(tmp_path / "host", "vllm", verified)))


@pytest.fixture
def state_file(tmp_path, monkeypatch):
    path = tmp_path / "config" / "vllm-hust-ext.json"
    monkeypatch.setenv(bundle.STATE_ENV, str(path))
    return path


# --- the built wheel ---------------------------------------------------------------


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    result = run(
        [sys.executable, "-m", "build", "--wheel", "--outdir", str(out), str(PROJECT_ROOT)],
        env=clean_env(),
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (built,) = out.glob("*.whl")
    return built


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


def test_wheel_carries_the_manifest_and_both_entry_point_groups(wheel, spark_bundle):
    project = pyproject()
    manifest = spark_bundle.manifest_path.relative_to(spark_bundle.distribution.package_root)
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        (dist_info,) = {name.split("/")[0] for name in names if ".dist-info/" in name}
        assert archive.read(manifest.as_posix()) == spark_bundle.manifest_path.read_bytes()
        assert "vllm_spark2_5_plugin/manifest.schema.json" in names
        entry_points = configparser.ConfigParser(delimiters=("=",))
        entry_points.optionxform = str
        entry_points.read_string(archive.read(f"{dist_info}/entry_points.txt").decode())
        record = archive.read(f"{dist_info}/RECORD").decode()
    assert manifest.as_posix() in record
    for group in (bundle.BUNDLE_GROUP, bundle.VLLM_PLUGIN_GROUP):
        assert dict(entry_points[group]) == project["entry-points"][group]
    assert dict(entry_points["console_scripts"]) == project["scripts"]


DISCOVERY_PROBE = """
    import importlib.util, json, sys
    target, extension_id = sys.argv[1:]
    sys.path.insert(0, target)
    # bundle.py from the installed wheel, loaded by path so that the package is not imported.
    spec = importlib.util.spec_from_file_location(
        "bundle_discovery_probe", f"{target}/vllm_spark2_5_plugin/bundle.py"
    )
    module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    (found,) = module.select(module.discover(), [extension_id])
    module.validate(found)
    print(json.dumps({
        "manifest_path": str(found.manifest_path),
        "distribution_version": found.distribution.version,
        "blocker": module.activation_blocker(found.manifest),
        "imported": sorted(
            name for name in sys.modules
            if name.split(".")[0] in ("vllm_spark2_5_plugin", "vllm", "torch", "transformers")
        ),
    }))
"""

REAL_DISCOVERY_PROBE = """
    import json, sys
    target, extension_id = sys.argv[1:]
    sys.path.insert(0, target)
    from vllm_hust_ext.discovery import discover_bundles
    (found,) = discover_bundles((extension_id,))
    print(json.dumps({
        "manifest_path": str(found.manifest_path),
        "imported": sorted(
            name for name in sys.modules
            if name.split(".")[0] in ("vllm_spark2_5_plugin", "vllm", "torch", "transformers")
        ),
    }))
"""


@pytest.mark.parametrize("manager", ["contract", "vllm_hust_ext"])
def test_discovery_from_the_installed_wheel_imports_nothing(installed_wheel, spark_bundle, manager):
    if manager == "vllm_hust_ext" and importlib.util.find_spec("vllm_hust_ext") is None:
        pytest.skip(REAL_MANAGER_MISSING)
    probe = DISCOVERY_PROBE if manager == "contract" else REAL_DISCOVERY_PROBE
    probe_args = [str(installed_wheel), _gate.BUNDLE_ID]
    result = run([sys.executable, "-I", "-c", textwrap.dedent(probe), *probe_args], env=clean_env())
    assert result.returncode == 0, result.stderr[-3000:]
    found = json.loads(result.stdout)
    manifest = "vllm_spark2_5_plugin/bundles/spark2_5/" + bundle.RENDERED_FILENAME
    assert found["manifest_path"] == str(installed_wheel / manifest)
    (record,) = installed_wheel.glob("vllm_spark2_5_plugin-*.dist-info/RECORD")
    assert manifest in record.read_text()
    assert found["imported"] == []
    if manager == "contract":
        assert found["distribution_version"] == pyproject()["version"]
        assert found["blocker"] == bundle.activation_blocker(spark_bundle.manifest)


# --- enable state file ------------------------------------------------------------------


def manager_cli(manager: str) -> list[str]:
    """The command line of the contract implementation under test."""
    if manager == "contract":
        return [str(Path(sys.executable).with_name("spark2-5-bundle"))]
    executable = Path(sys.executable).with_name("vllm-hust-ext")
    if importlib.util.find_spec("vllm_hust_ext") is None or not executable.exists():
        pytest.skip(REAL_MANAGER_MISSING)
    return [str(executable), "extension"]


@pytest.mark.parametrize("manager", ["contract", "vllm_hust_ext"])
def test_enable_follows_the_installed_carrier_status(manager, spark_bundle, state_file):
    result = run([*manager_cli(manager), "enable", _gate.BUNDLE_ID], env=dict(os.environ))
    blocker = bundle.activation_blocker(spark_bundle.manifest)
    if blocker is None:
        assert result.returncode == 0, result.stderr
        assert bundle.enabled_ids(bundle.read_state(state_file)) == [_gate.BUNDLE_ID]
        return
    assert result.returncode == 2
    (line,) = result.stderr.splitlines()
    assert line.endswith(f"cannot enable {_gate.BUNDLE_ID!r}: {blocker}")
    assert not state_file.exists()


@pytest.mark.parametrize("status", ["import_only", "legacy_unregistered"])
def test_enable_is_refused_for_a_descriptor_only_bundle(spark_bundle, state_file, status):
    with pytest.raises(BundleError) as error:
        bundle.set_enabled(state_file, with_status(spark_bundle, status), True)
    assert str(error.value) == (
        f"cannot enable {_gate.BUNDLE_ID!r}: extension is descriptor-only and cannot be "
        f"enabled (implementation status: {status})"
    )
    assert not state_file.exists()


@pytest.mark.parametrize("manager", ["contract", "vllm_hust_ext"])
def test_state_file_is_written_atomically_owner_only_and_keeps_other_entries(manager, state_file):
    state_file.parent.mkdir()
    other = {"enabled": True, "configuration": {"window": 8}}
    state_file.write_text(
        json.dumps({"schema_version": 2, "extensions": {"org.example.other": other}})
    )
    result = run([*manager_cli(manager), "disable", _gate.BUNDLE_ID], env=dict(os.environ))
    assert result.returncode == 0, result.stderr
    assert json.loads(state_file.read_text()) == {
        "schema_version": 2,
        "extensions": {
            "org.example.other": other,
            _gate.BUNDLE_ID: {"enabled": False, "configuration": {}},
        },
    }
    assert stat.S_IMODE(state_file.stat().st_mode) == 0o600
    assert [path.name for path in state_file.parent.iterdir()] == [state_file.name]


def test_enabling_an_active_bundle_records_intent_only(spark_bundle, state_file):
    active = with_status(spark_bundle, "active")
    bundle.set_enabled(state_file, active, True)
    state = bundle.read_state(state_file)
    assert state["extensions"][_gate.BUNDLE_ID] == {"enabled": True, "configuration": {}}
    assert bundle.enabled_ids(state) == [_gate.BUNDLE_ID]
    assert stat.S_IMODE(state_file.stat().st_mode) == 0o600
    bundle.set_enabled(state_file, active, False)
    assert bundle.enabled_ids(bundle.read_state(state_file)) == []


def test_a_malformed_state_file_is_one_clear_error(spark_bundle, state_file):
    state_file.parent.mkdir()
    state_file.write_text(json.dumps({"schema_version": 2, "extensions": {"x": {"enabled": "on"}}}))
    with pytest.raises(BundleError) as error:
        bundle.set_enabled(state_file, spark_bundle, False)
    assert str(error.value) == f'{state_file}: extensions.x.enabled = "on": must be true or false'


# --- the injected environment -------------------------------------------------------------


@pytest.mark.parametrize(
    ("allowed_plugins", "expected"),
    [
        (None, None),  # unset: vLLM loads every plugin already
        ("lora_filesystem_resolver", "lora_filesystem_resolver,spark2_5"),
        ("spark2_5,lora_filesystem_resolver", "spark2_5,lora_filesystem_resolver"),
        ("", "spark2_5"),  # set but empty: vLLM would load none
    ],
)
@pytest.mark.usefixtures("verified_host")
def test_enable_injects_the_gate_the_bundle_list_and_extends_vllm_plugins(
    spark_bundle, allowed_plugins, expected
):
    environ = clean_env() if allowed_plugins is None else clean_env(VLLM_PLUGINS=allowed_plugins)
    injected = bundle.activation_environment([with_status(spark_bundle, "active")], environ)
    assert injected.pop(_gate.ENABLE_ENV) == "1"
    assert injected.pop(_gate.ENABLED_BUNDLES_ENVS[0]) == _gate.BUNDLE_ID
    assert injected.pop(bundle.PLUGINS_ENV, None) == expected
    assert injected == {}


def test_the_real_manager_injects_the_same_environment(spark_bundle, state_file):
    cli = manager_cli("vllm_hust_ext")
    blocker = bundle.activation_blocker(spark_bundle.manifest)
    if blocker:
        pytest.skip(f"the real manager refuses to enable {_gate.BUNDLE_ID}: {blocker}")
    env = clean_env(VLLM_PLUGINS="lora_filesystem_resolver")
    enabled = run([*cli, "enable", _gate.BUNDLE_ID], env=env)
    assert enabled.returncode == 0, enabled.stderr
    dry_run = run([cli[0], "run", "--dry-run", "--", "true"], env=env)
    assert dry_run.returncode == 0, dry_run.stderr
    injected = json.loads(dry_run.stdout)["environment"]
    assert injected[_gate.ENABLE_ENV] == "1"
    assert injected[_gate.ENABLED_BUNDLES_ENVS[0]] == _gate.BUNDLE_ID
    plugins = injected[bundle.PLUGINS_ENV].split(",")
    assert plugins[0] == "lora_filesystem_resolver"
    assert "spark2_5" in plugins


@pytest.mark.usefixtures("verified_host")
def test_bundles_that_disagree_on_a_variable_cannot_be_enabled_together(spark_bundle):
    first = with_status(spark_bundle, "active")
    second = dataclasses.replace(
        with_status(spark_bundle, "active"),
        extension_id="org.example.other",
        manifest_path=Path("other.json"),
    )
    second.manifest["activation"]["environment"] = {_gate.ENABLE_ENV: "0"}
    with pytest.raises(BundleError) as error:
        bundle.activation_environment([first, second], clean_env())
    assert str(error.value) == (
        f'other.json: activation.environment.{_gate.ENABLE_ENV} = "0": conflicts with "1" '
        f"from {_gate.BUNDLE_ID}; enable only one of them"
    )


def test_launch_is_refused_for_a_descriptor_only_bundle(spark_bundle):
    with pytest.raises(BundleError) as error:
        bundle.activation_environment([with_status(spark_bundle, "import_only")], clean_env())
    assert str(error.value) == (
        f"refusing to launch {_gate.BUNDLE_ID!r}: extension is descriptor-only and cannot be "
        "enabled (implementation status: import_only)"
    )


def test_env_command_follows_the_installed_carrier_and_host(spark_bundle, state_file):
    """Launchable exactly when the carrier's status and the installed vLLM allow it."""
    result = run([*manager_cli("contract"), "env", _gate.BUNDLE_ID], env=dict(os.environ))
    blocker = bundle.launch_refusal(spark_bundle)
    if blocker is None:
        assert result.returncode == 0, result.stderr
        assert f"export {_gate.ENABLE_ENV}=1\n" in result.stdout
        return
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr == (
        f"spark2-5-bundle: error: refusing to launch {_gate.BUNDLE_ID!r}: {blocker}\n"
    )


HOST_VERSIONS = {
    "0.32.0+cpu": "compatible",  # the verified CPU build's metadata version
    "0.32.1rc1.dev3": "incompatible",  # prereleases are outside unless the range names one
    "0.26.0": "incompatible",  # below every run-verified release
    "0.33.0": "incompatible",
}


@pytest.mark.parametrize(("host_version", "state"), HOST_VERSIONS.items(), ids=HOST_VERSIONS)
def test_launch_follows_the_host_range(spark_bundle, tmp_path, monkeypatch, host_version, state):
    monkeypatch.syspath_prepend(str(fake_host_distribution(tmp_path, "vllm", host_version)))
    active = with_status(spark_bundle, "active")
    compatibility = bundle.host_compatibility(active.manifest)
    assert (compatibility.host_version, compatibility.state) == (host_version, state)
    if state == "compatible":
        assert _gate.ENABLE_ENV in bundle.activation_environment([active], clean_env())
        return
    with pytest.raises(BundleError) as error:
        bundle.activation_environment([active], clean_env())
    assert str(error.value) == (
        f"refusing to launch {_gate.BUNDLE_ID!r}: host vllm {host_version} is outside "
        f"host.version_range {active.manifest['host']['version_range']!r} (incompatible)"
    )


@pytest.mark.parametrize("manager", ["contract", "vllm_hust_ext"])
@pytest.mark.parametrize(("host_version", "state"), HOST_VERSIONS.items(), ids=HOST_VERSIONS)
def test_installed_host_compatibility_is_reported(tmp_path, manager, host_version, state):
    cli = manager_cli(manager)
    host = fake_host_distribution(tmp_path, "vllm", host_version)
    env = clean_env(PYTHONPATH=str(host))
    if manager == "contract":
        result = run([*cli, "inspect", _gate.BUNDLE_ID], env=env)
        assert result.returncode == 0, result.stderr
        (report,) = json.loads(result.stdout)
        assert report["host"]["installed"] == host_version
        assert report["host"]["compatibility"] == state
    else:
        result = run([*cli, "check", _gate.BUNDLE_ID], env=env)
        assert result.returncode == 0, result.stderr
        assert state in json.loads(result.stdout)["states"]


def test_launch_is_refused_when_the_host_is_not_installed(spark_bundle):
    active = with_status(spark_bundle, "active")
    active.manifest["host"]["name"] = "vllm-host-that-is-not-installed"
    with pytest.raises(BundleError) as error:
        bundle.activation_environment([active], clean_env())
    assert str(error.value) == (
        f"refusing to launch {_gate.BUNDLE_ID!r}: "
        "host vllm-host-that-is-not-installed is not installed (unknown)"
    )


# --- a real vLLM launched with exactly the injected environment --------------------------------


@pytest.mark.serve
@pytest.mark.usefixtures("verified_host")
def test_vllm_serve_with_the_injected_environment_loads_the_carrier_enabled(
    spark_bundle, tiny_llama, tmp_path
):
    active = with_status(spark_bundle, "active")
    state_path = tmp_path / "vllm-hust-ext.json"
    bundle.set_enabled(state_path, active, True)
    enabled = bundle.select([active], bundle.enabled_ids(bundle.read_state(state_path)))
    # Another plugin allow-listed by the operator: enabling must extend the list, not replace it.
    launch_env = clean_env(VLLM_PLUGINS="lora_filesystem_resolver", **CPU_SERVE_ENV)
    injected = bundle.activation_environment(enabled, launch_env)
    assert injected == {
        _gate.ENABLE_ENV: "1",
        _gate.ENABLED_BUNDLES_ENVS[0]: _gate.BUNDLE_ID,
        bundle.PLUGINS_ENV: "lora_filesystem_resolver,spark2_5",
    }
    launch_env.update(injected)

    server = VllmServer(tiny_llama, env=launch_env, log_path=tmp_path / "serve.log")
    assert server.env == launch_env
    with server:
        pass
    lines = [line for line in server.log().splitlines() if LOAD_LINE in line]
    assert lines, server.log()[-4000:]
    version_range = spark_bundle.manifest["host"]["version_range"]
    for line in lines:
        assert "enabled=1" in line, line
        assert f"verified={version_range}" in line, line
