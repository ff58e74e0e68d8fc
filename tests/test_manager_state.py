"""What the extension manager does in the state it is in, and how `inspect` and `env` report it.

First the points of docs/bundle.md that hang on the state file and the caller's
environment, then seven states a user can reach in which the toolkit used to answer
unlike the manager. Each outcome is recorded from the manager's public source (its
``vllm_hust_ext/config.py`` reads the state file; ``providers/vllm.py`` and
``providers/base.py`` apply an entry's configuration; ``runtime_evidence.py`` and
``cli.py`` refuse the caller's runtime-evidence variables) and checked two ways, as
in tests/test_bundle_contract.py: ``recorded`` against this toolkit's prediction, and
``vllm_hust_ext`` through the real manager where that package is installed.

The outcomes compare so: the manager launches (``run`` exits 0, injecting what
``run --dry-run`` shows) where ``inspect --json`` reports no ``launch_refusal`` and
that same ``launch_environment`` (exit 0, or 1 with the reason when the state leaves
the bundle out) and ``env`` exits 0; the manager refuses (exit 2, its words on
stderr) where ``inspect`` and ``env`` exit 1 (a launch the manager would refuse)
with one line naming the file, the field and the fix.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import sys
import tempfile
import types
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

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
from carrier_harness.project import manifest_source
from vllm_hust_bundle_kit import cli, manager_state
from vllm_hust_bundle_kit.contract import (
    ENABLED_BUNDLES_ENVS,
    PLUGINS_ENV,
    RUNTIME_EVIDENCE_ENVS,
    STATE_ENV,
)

SWITCH_PROBE = (
    "import json, os, sys; from vllm_hust_bundle_kit.switch import CarrierSwitch; "
    "switch = CarrierSwitch.from_bundle_package(*sys.argv[1:4]); d = switch.decide(); "
    "seen = os.environ.get(switch.enable_env); "
    "print(json.dumps({'enabled': d.enabled, 'source': d.source, 'seen': seen}))"
)


def switch_probe(bundle) -> list[str]:
    """A command printing the carrier switch's decision in the process it runs in."""
    package = bundle.manifest_path.parent.relative_to(bundle.distribution.package_root)
    (carrier,) = bundle.carriers()
    return [sys.executable, "-c", SWITCH_PROBE, ".".join(package.parts), carrier, "UNUSED_OVERRIDE"]


@dataclass(frozen=True)
class Launches:
    """``run`` starts the command, injecting what ``run --dry-run`` shows."""

    injected: dict[str, str]


@dataclass(frozen=True)
class Refuses:
    """``run`` exits 2: ``words`` are the manager's (several: in this order, with its
    notes between them), ``field`` what the toolkit names."""

    words: str | tuple[str, ...]
    field: str


def environment(state_file, host, **extra: str) -> dict[str, str]:
    """The manager's environment for ``state_file`` and ``host``, without any
    runtime-evidence variable the caller's own environment may hold."""
    env = manager_env(state_file, host, **extra)
    for name in set(RUNTIME_EVIDENCE_ENVS) - set(extra):
        env.pop(name, None)
    return env


def with_bundle(bundle, switch, plugin, value: str = "1") -> dict[str, str]:
    """What a launch with ``bundle`` enabled injects (measured: tests/test_bundle_contract.py)."""
    return {
        switch: value,
        PLUGINS_ENV: f"ascend,{plugin}",
        ENABLED_BUNDLES_ENVS[0]: bundle.extension_id,
    }


NOTHING = {ENABLED_BUNDLES_ENVS[0]: ""}


def assert_toolkit(bundle, env, expected, enabled: bool) -> None:
    """``inspect --json`` and ``env`` in ``env`` agree with the manager's ``expected``."""
    code, report, err = inspect(bundle.extension_id, env)
    env_result = run([TOOL, "env", "--json", bundle.extension_id], env=env)
    if isinstance(expected, Launches):
        assert report["launch_refusal"] is None, report["launch_refusal"]
        assert report["launch_environment"] == expected.injected
        assert report["manager_state"]["enabled"] is enabled
        assert report["manager_state"]["problem"] is None
        assert code == (0 if enabled else 1), err
        if not enabled:  # the one finding: the state leaves the bundle out, and says so
            (line,) = err.splitlines()
            assert "enabled is not true, so vllm-hust-ext run leaves this bundle out" in line
        assert env_result.returncode == 0, env_result.stderr
        if enabled:
            assert json.loads(env_result.stdout) == expected.injected
        return
    assert code == 1 and env_result.returncode == 1
    assert report["launch_environment"] is None
    assert expected.field in report["launch_refusal"]
    assert env_result.stdout == ""
    for stderr in (err, env_result.stderr):
        (line,) = stderr.splitlines()
        assert line.startswith("vllm-hust-bundle: error: ") and expected.field in line


def assert_answer(manager_kind, bundle, env, expected, enabled: bool) -> None:
    """The toolkit's answer (``recorded``) or the real manager's, against ``expected``."""
    if manager_kind == "recorded":
        assert_toolkit(bundle, env, expected, enabled=enabled)
    else:
        assert_manager(env, expected)


def assert_manager(env, expected, *, launch: bool = False) -> None:
    """The real manager in ``env``: ``run --dry-run`` (``launch``: a real ``run``)."""
    cli_path = real_manager()
    argv = (
        [cli_path, "run", "--", "true"] if launch else [cli_path, "run", "--dry-run", "--", "true"]
    )
    result = run(argv, env=env)
    if isinstance(expected, Launches):
        assert result.returncode == 0, result.stderr
        if not launch:
            assert json.loads(result.stdout)["environment"] == expected.injected
        return
    assert result.returncode == 2, result.stdout + result.stderr
    words = (expected.words,) if isinstance(expected.words, str) else expected.words
    pattern = ".*".join(re.escape(fragment) for fragment in words)
    assert re.search(pattern, result.stderr), (words, result.stderr)


def write(state_file, document) -> None:
    state_file.parent.mkdir(parents=True, exist_ok=True)
    state_file.write_text(json.dumps(document))


# --- point 6: the state file is platformdirs' user_config_path, as the manager finds it ----


@pytest.mark.parametrize("manager_kind", MANAGERS)
@pytest.mark.parametrize("state_env", [None, ""], ids=["unset", "empty"])
def test_the_state_file_follows_xdg_config_home(
    manager_kind, bundle, verified_host, tmp_path, state_env
):
    from platformdirs import user_config_path

    config_home = tmp_path / "xdg"
    env = manager_env(None, verified_host, XDG_CONFIG_HOME=str(config_home))
    if state_env is not None:
        env[STATE_ENV] = state_env  # empty counts as unset, for the manager too
    # What platformdirs answers in that environment: asked, never re-implemented.
    probe = "import sys; from platformdirs import user_config_path as p; print(p(sys.argv[1]))"
    folder = run([sys.executable, "-c", probe, "vllm-hust-ext"], env=env).stdout.strip()
    expected = config_home / "vllm-hust-ext" / "config.json"
    assert folder == str(expected.parent) != str(user_config_path("vllm-hust-ext"))
    if manager_kind == "recorded":
        enable_in(expected, bundle.extension_id)
    else:
        result = run([real_manager(), "extension", "enable", bundle.extension_id], env=env)
        assert result.returncode == 0, result.stderr
        assert expected.exists()
    code, report, err = inspect(bundle.extension_id, env)
    assert report["manager_state"] == {"path": str(expected), "enabled": True, "problem": None}
    assert code == 0, err


# --- point 2: the manifest's switch replaces the caller's; after `--` it is the operator's ---


@pytest.mark.parametrize("manager_kind", MANAGERS)
@pytest.mark.parametrize("after_dashes", [False, True], ids=["before-run", "after-dashes"])
def test_one_launch_without_the_carrier_sets_the_switch_after_the_dashes(
    manager_kind, bundle, switch, verified_host, state_file, after_dashes
):
    env = manager_env(state_file, verified_host, **{switch: "0"})
    command = switch_probe(bundle)
    if after_dashes:
        command = ["env", f"{switch}=0", *command]
    if manager_kind == "recorded":
        enable_in(state_file, bundle.extension_id)
        code, report, _ = inspect(bundle.extension_id, env)
        assert code == 0
        assert report["launch_overrides"] == {switch: "0"}
        assert report["switch_off_for_one_launch"] == (
            f"vllm-hust-ext run -- env {switch}=0 COMMAND..."
        )
        launched = run(command, env={**env, **report["launch_environment"]})
    else:
        cli = real_manager()
        assert run([cli, "extension", "enable", bundle.extension_id], env=env).returncode == 0
        launched = run([cli, "run", "--", *command], env=env)
    assert launched.returncode == 0, launched.stderr
    decision = json.loads(launched.stdout.splitlines()[-1])
    if after_dashes:
        assert decision == {"enabled": False, "source": f"{switch}=0", "seen": "0"}
    else:  # the manager replaced the caller's 0; the bundle list gets the credit
        assert decision == {
            "enabled": True,
            "source": f"{ENABLED_BUNDLES_ENVS[0]} lists {bundle.extension_id}",
            "seen": "1",
        }


# --- point 4 and `inspect`/`env` answering for the state as it stands -------------------------


STALE = {"org.example.other": {"enabled": True, "configuration": {}}}


@pytest.mark.parametrize(
    "state",
    ["{", json.dumps({"schema_version": 2, "extensions": STALE})],
    ids=["corrupt", "stale-entry"],
)
def test_no_launch_line_for_a_launch_the_manager_refuses(bundle, verified_host, state_file, state):
    state_file.parent.mkdir(parents=True)
    state_file.write_text(state)
    env = manager_env(state_file, verified_host)
    result = run([TOOL, "inspect", bundle.extension_id], env=env)
    assert result.returncode == 1
    assert "would inject" not in result.stdout
    (refused,) = [line for line in result.stdout.splitlines() if "launch:" in line]
    assert refused.startswith(f"  launch: refused: {state_file}: ")
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"vllm-hust-bundle: error: {state_file}: ")
    # env refuses too, as the manager's run does (it exits 2 there: test_bundle_contract.py).
    env_result = run([TOOL, "env", bundle.extension_id], env=env)
    assert env_result.returncode == 1 and env_result.stdout == ""
    (line,) = env_result.stderr.splitlines()
    assert line.startswith(f"vllm-hust-bundle: error: {state_file}: ")
    if "org.example.other" in state:
        assert "extensions.org.example.other.enabled = true" in line


@pytest.mark.parametrize("manager_kind", MANAGERS)
def test_a_mistyped_id_is_told_apart_from_a_stale_entry(manager_kind, bundle, state_file):
    typo = bundle.extension_id + "x"
    env = manager_env(state_file)
    if manager_kind == "recorded":
        result = run([TOOL, "inspect", typo], env=env)
        assert result.returncode == 2
        (line,) = result.stderr.splitlines()
        assert line.startswith(f"vllm-hust-bundle: error: extension {typo!r} is not installed")
        return
    # The manager's own words are the same as for a stale entry (docs/bundle.md, point 4).
    result = run([real_manager(), "extension", "enable", typo], env=env)
    assert result.returncode == 2
    assert f"enabled Bundles are not installed: [{typo!r}]" in result.stderr
    assert not state_file.exists()


# --- every problem is one line on stderr ------------------------------------------------------

ALIAS = str(Path(sys.executable).with_name("spark2-5-bundle"))


@pytest.mark.parametrize(
    "argv",
    [["env"], ["frobnicate"], ["inspect", "--no-such-option"]],
    ids=["missing-argument", "unknown-command", "unknown-option"],
)
@pytest.mark.parametrize("tool", [TOOL, ALIAS], ids=["vllm-hust-bundle", "deprecated-alias"])
def test_bad_arguments_are_one_line_without_argparse_usage(state_file, tool, argv):
    result = run([tool, *argv], env=manager_env(state_file))
    assert result.returncode == 2 and result.stdout == ""
    (line,) = result.stderr.splitlines()
    prog = Path(tool).name
    assert line.startswith(f"{prog}: error: ") and f"see `{prog}" in line
    assert ("is deprecated, use vllm-hust-bundle" in line) == (tool == ALIAS)


def test_a_refused_launch_names_the_manifest_field_and_value(bundle, tmp_path, state_file):
    from carrier_harness.project import fake_host_distribution

    enable_in(state_file, bundle.extension_id)
    host = fake_host_distribution(tmp_path / "host", "vllm", "0.0.1")
    result = run([TOOL, "inspect", bundle.extension_id], env=manager_env(state_file, host))
    assert result.returncode == 1
    (line,) = result.stderr.splitlines()
    version_range = bundle.manifest["host"]["version_range"]
    assert line == (
        f"vllm-hust-bundle: error: {bundle.manifest_path}: refusing to launch "
        f"{bundle.extension_id!r}: host vllm 0.0.1 is outside host.version_range "
        f"{version_range!r} (incompatible)"
    )


def test_a_bundle_not_enabled_is_left_out_and_says_why_enabling_it_would_fail(
    bundle, tmp_path, state_file
):
    from carrier_harness.project import fake_host_distribution

    host = fake_host_distribution(tmp_path / "host", "vllm", "0.0.1")
    code, report, err = inspect(bundle.extension_id, manager_env(state_file, host))
    assert code == 1
    # The manager launches without it: no refusal, only the empty bundle list.
    assert report["launch_refusal"] is None
    assert report["launch_environment"] == {ENABLED_BUNDLES_ENVS[0]: ""}
    assert "host vllm 0.0.1 is outside" in report["launch_refusal_once_enabled"]
    (line,) = err.splitlines()
    assert "leaves this bundle out; and enabling it would not help: " in line


# --- 1. the legacy state file: schema_version 1 and an `enabled` list --------------------------


@pytest.mark.parametrize("manager_kind", MANAGERS)
@pytest.mark.parametrize("copies", [1, 2], ids=["listed-once", "listed-twice"])
def test_a_legacy_state_file_enables_the_bundles_it_lists(
    manager_kind, bundle, switch, plugin, verified_host, state_file, copies
):
    write(state_file, {"schema_version": 1, "enabled": [bundle.extension_id] * copies})
    env = environment(state_file, verified_host)
    expected = Launches(with_bundle(bundle, switch, plugin))
    assert_answer(manager_kind, bundle, env, expected, enabled=True)


# --- 2. schema_version 2 without `extensions`; 3. an entry without `enabled` -----------------


@pytest.mark.parametrize("manager_kind", MANAGERS)
def test_a_state_file_without_extensions_enables_nothing(
    manager_kind, bundle, verified_host, state_file
):
    write(state_file, {"schema_version": 2})
    env = environment(state_file, verified_host)
    assert_answer(manager_kind, bundle, env, Launches(NOTHING), enabled=False)


@pytest.mark.parametrize("manager_kind", MANAGERS)
@pytest.mark.parametrize("entry", [{}, {"configuration": {}}], ids=["empty", "configured"])
def test_an_entry_without_enabled_is_not_enabled(
    manager_kind, bundle, verified_host, state_file, entry
):
    write_state(state_file, {bundle.extension_id: entry})
    env = environment(state_file, verified_host)
    assert_answer(manager_kind, bundle, env, Launches(NOTHING), enabled=False)


# --- 4. a dangling symlink at the state path ------------------------------------------------


@pytest.mark.parametrize("manager_kind", MANAGERS)
def test_a_dangling_symlink_is_no_state_file(
    manager_kind, bundle, verified_host, state_file, tmp_path
):
    state_file.parent.mkdir(parents=True)
    state_file.symlink_to(tmp_path / "removed.json")
    env = environment(state_file, verified_host)
    if manager_kind == "recorded":
        assert_toolkit(bundle, env, Launches(NOTHING), enabled=False)
        assert state_file.is_symlink() and not state_file.exists()  # read, never written
    else:
        assert_manager(env, Launches(NOTHING))


# --- 5. an entry with a key the manager does not know ------------------------------------------


@pytest.mark.parametrize("manager_kind", MANAGERS)
@pytest.mark.parametrize("whose", ["this-bundle", "another-entry"])
def test_an_unknown_key_in_any_entry_makes_the_manager_refuse(
    manager_kind, bundle, verified_host, state_file, whose
):
    entries = {bundle.extension_id: {"enabled": True, "configuration": {}}}
    owner = bundle.extension_id if whose == "this-bundle" else "org.example.other"
    entries.setdefault(owner, {"enabled": False})["enable"] = True
    write_state(state_file, entries)
    env = environment(state_file, verified_host)
    expected = Refuses("config has unknown keys: ['enable']", f"extensions.{owner}.enable = true")
    assert_answer(manager_kind, bundle, env, expected, enabled=False)


# --- 6. the entry's configuration (`vllm-hust-ext extension configure`) ---------------------


def configured(bundle, switch, plugin, verified: str) -> dict[str, tuple[dict, object]]:
    field = f"extensions.{bundle.extension_id}.configuration"
    return {
        "switch-off": (
            {"environment": {switch: "0"}},
            Launches(with_bundle(bundle, switch, plugin, "0")),
        ),
        "verified-host-version": (
            {"host_version": verified},
            Launches(with_bundle(bundle, switch, plugin)),
        ),
        "incompatible-host-version": (
            {"host_version": "0.40.0"},
            Refuses(  # the manager notes how it probed the host between the two
                (
                    f"refusing to launch incompatible extension {bundle.extension_id!r}: ",
                    "host version 0.40.0 is outside",
                ),
                f'{field}.host_version = "0.40.0"',
            ),
        ),
        "unknown-launch-option": (
            {"launch_options": {"max_model_len": 4096}},
            Refuses(
                "unsupported vLLM launch_options: ['max_model_len']",
                f"{field}.launch_options.max_model_len = 4096",
            ),
        ),
        "undeclared-variable": (
            {"environment": {"VLLM_LOGGING_LEVEL": "DEBUG"}},
            Refuses(
                "environment overrides must be declared by the manifest: ['VLLM_LOGGING_LEVEL']",
                f'{field}.environment.VLLM_LOGGING_LEVEL = "DEBUG"',
            ),
        ),
    }


CONFIGURED = [
    "switch-off",
    "verified-host-version",
    "incompatible-host-version",
    "unknown-launch-option",
    "undeclared-variable",
]


@pytest.mark.parametrize("manager_kind", MANAGERS)
@pytest.mark.parametrize("case", CONFIGURED)
def test_the_entry_configuration_is_applied_as_the_manager_applies_it(
    manager_kind, bundle, switch, plugin, verified_host, state_file, tmp_path, case
):
    verified = manifest_source()["bundle"][0]["host"]["verified_on"][0]
    configuration, expected = configured(bundle, switch, plugin, verified)[case]
    env = environment(state_file, verified_host)
    if manager_kind == "recorded":
        write_state(
            state_file,
            {bundle.extension_id: {"enabled": True, "configuration": configuration}},
        )
        assert_toolkit(bundle, env, expected, enabled=True)
        return
    cli_path = real_manager()
    chosen = tmp_path / "configuration.json"
    chosen.write_text(json.dumps(configuration))
    for argv in (
        ["enable", bundle.extension_id],
        ["configure", bundle.extension_id, "--file", str(chosen)],
    ):
        result = run([cli_path, "extension", *argv], env=env)
        assert result.returncode == 0, result.stderr
    assert json.loads(state_file.read_text())["extensions"][bundle.extension_id] == {
        "enabled": True,
        "configuration": configuration,
    }
    assert_manager(env, expected)


def test_a_bundle_not_enabled_names_the_configuration_that_would_refuse_it(
    bundle, verified_host, state_file
):
    """Not enabled, with a configuration `run` would refuse: enabling it would not help."""
    write_state(
        state_file,
        {bundle.extension_id: {"enabled": False, "configuration": {"launch_options": []}}},
    )
    code, report, err = inspect(bundle.extension_id, environment(state_file, verified_host))
    assert code == 1 and report["launch_environment"] == NOTHING
    assert (
        "configuration.launch_options = []: must be an object"
        in (report["launch_refusal_once_enabled"])
    )
    (line,) = err.splitlines()
    assert "enabling it would not help" in line


# --- 7. the caller's environment holds one of the manager's runtime-evidence variables ----------


@pytest.mark.parametrize("manager_kind", MANAGERS)
@pytest.mark.parametrize(
    ("name", "value"),
    [*((name, "set-by-hand") for name in RUNTIME_EVIDENCE_ENVS), (RUNTIME_EVIDENCE_ENVS[2], "")],
    ids=[*RUNTIME_EVIDENCE_ENVS, f"{RUNTIME_EVIDENCE_ENVS[2]}-empty"],
)
def test_a_runtime_evidence_variable_in_the_callers_environment_makes_run_refuse(
    manager_kind, bundle, switch, plugin, verified_host, state_file, name, value
):
    env = environment(state_file, verified_host, **{name: value})
    expected = Refuses(
        f"vllm-hust-ext owns runtime evidence environment variables: [{name!r}]",
        f"environment: {name} = {json.dumps(value)}",
    )
    if manager_kind == "recorded":
        enable_in(state_file, bundle.extension_id)
        assert_toolkit(bundle, env, expected, enabled=True)
        _, report, _ = inspect(bundle.extension_id, env)
        assert f"unset {name} before vllm-hust-ext run" in report["launch_refusal"]
        return
    result = run([real_manager(), "extension", "enable", bundle.extension_id], env=env)
    assert result.returncode == 0, result.stderr
    assert_manager(env, expected, launch=True)
    # Its dry run does not look at them; `inspect` answers for a real run.
    assert_manager(env, Launches(with_bundle(bundle, switch, plugin)))


@pytest.mark.parametrize("manager_kind", MANAGERS)
def test_with_nothing_enabled_run_starts_whatever_the_evidence_variables_hold(
    manager_kind, bundle, verified_host, state_file
):
    name = RUNTIME_EVIDENCE_ENVS[2]
    env = environment(state_file, verified_host, **{name: "set-by-hand"})
    if manager_kind == "vllm_hust_ext":
        assert_manager(env, Launches(NOTHING), launch=True)
        return
    code, report, _ = inspect(bundle.extension_id, env)
    assert code == 1 and report["launch_refusal"] is None
    assert report["launch_environment"] == NOTHING
    assert f"environment: {name} = " in report["launch_refusal_once_enabled"]


# --- where the manager is installed, its own reading of the state file decides --------------------


def installed_manager(monkeypatch, load_config) -> None:
    """A stand-in ``vllm_hust_ext`` whose ``config.load_config`` is ``load_config``: the
    manager's public reading call, as every public version of it spells it."""
    package, config = types.ModuleType("vllm_hust_ext"), types.ModuleType("vllm_hust_ext.config")
    config.load_config = load_config
    package.config = config
    monkeypatch.setitem(sys.modules, "vllm_hust_ext", package)
    monkeypatch.setitem(sys.modules, "vllm_hust_ext.config", config)


def test_the_installed_managers_refusal_of_its_state_file_stands(bundle, monkeypatch, state_file):
    enable_in(state_file, bundle.extension_id)  # a file the re-implementation accepts

    def load_config(path):
        assert path.read_text() == state_file.read_text()
        raise ValueError("vllm-hust-ext config has an unsupported schema")

    installed_manager(monkeypatch, load_config)
    state = manager_state.read_state(state_file, [bundle])
    assert state.enabled == ()
    assert state.problem == (
        f"{state_file}: vllm-hust-ext refuses this extension manager's state file "
        "(ValueError: vllm-hust-ext config has an unsupported schema); fix the file or remove it"
    )


def test_what_the_installed_manager_enables_stands(bundle, monkeypatch, state_file):
    write(state_file, {"schema_version": 2, "extensions": {bundle.extension_id: {"on": 1}}})
    configuration = {"environment": {}}
    reading = types.SimpleNamespace(
        enabled=(bundle.extension_id,),
        extensions={bundle.extension_id: types.SimpleNamespace(configuration=configuration)},
    )
    installed_manager(monkeypatch, lambda path: reading)
    state = manager_state.read_state(state_file, [bundle])
    assert (state.enabled, state.problem) == ((bundle.extension_id,), None)
    assert state.configuration(bundle.extension_id) == configuration


def test_both_readings_are_of_one_read_of_the_state_file(bundle, monkeypatch, state_file):
    """The manager is handed what the toolkit read: a file rewritten in between (an
    `enable` or `disable` running meanwhile) cannot make the two readings disagree."""
    enable_in(state_file, bundle.extension_id)

    def load_config(path):
        write(state_file, {"schema_version": 2, "extensions": {}})  # rewritten meanwhile
        entries = json.loads(path.read_text())["extensions"]
        return types.SimpleNamespace(
            enabled=tuple(i for i, entry in entries.items() if entry.get("enabled")),
            extensions={i: types.SimpleNamespace(configuration={}) for i in entries},
        )

    installed_manager(monkeypatch, load_config)
    state = manager_state.read_state(state_file, [bundle])
    assert (state.enabled, state.problem) == ((bundle.extension_id,), None)


def test_without_room_for_the_managers_copy_the_toolkits_reading_answers(
    bundle, monkeypatch, state_file, tmp_path
):
    enable_in(state_file, bundle.extension_id)
    installed_manager(monkeypatch, lambda path: pytest.fail("asked without a copy"))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "no-such-folder"))
    state = manager_state.read_state(state_file, [bundle])
    assert (state.enabled, state.problem) == ((bundle.extension_id,), None)


# --- any state file: an answer, never a traceback ------------------------------------------------

SOURCE = manifest_source()["bundle"][0]
BUNDLE_ID = SOURCE["extension_id"]
(SWITCH,) = [name for name, value in SOURCE["activation"]["environment"].items() if value == "1"]
LEAVES = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(max_size=8)
    | st.sampled_from([1, 2, 1.0, BUNDLE_ID, "0.32.0", "0.40.0", "0", "\u2028", "\ud800", "\0"])
)
KEYS = st.sampled_from(
    [
        "enabled",
        "configuration",
        "environment",
        "host_version",
        "launch_options",
        "protocol_versions",
        "speculative_config",
        "scheduler_reserve_output_budget",
        SWITCH,
        BUNDLE_ID,
    ]
) | st.text(max_size=6)
VALUES = st.recursive(
    LEAVES,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(KEYS, inner, max_size=4),
    max_leaves=12,
)
ENTRIES = VALUES | st.fixed_dictionaries(
    {},
    optional={"enabled": st.booleans() | LEAVES, "configuration": VALUES, "colour": LEAVES},
)
STATES = st.fixed_dictionaries(
    {"schema_version": st.sampled_from([1, 2, 1.0, 2.0, True, False, 3, "2"]) | LEAVES},
    optional={
        "enabled": st.lists(st.sampled_from([BUNDLE_ID, "org.example.other"]) | LEAVES),
        "extensions": st.dictionaries(
            st.sampled_from([BUNDLE_ID, "org.example.other"]) | st.text(max_size=6),
            ENTRIES,
            max_size=3,
        )
        | LEAVES,
        "other": LEAVES,
    },
)
# The entry `vllm-hust-ext extension configure` writes for this bundle, any configuration.
CONFIGURATIONS = st.fixed_dictionaries(
    {},
    optional={
        "environment": st.dictionaries(KEYS, LEAVES, max_size=3) | LEAVES,
        "host_version": LEAVES,
        "launch_options": st.dictionaries(KEYS, VALUES, max_size=3) | LEAVES,
        "protocol_versions": st.dictionaries(KEYS, LEAVES, max_size=3) | LEAVES,
        "other": VALUES,
    },
)
CONFIGURED_STATES = st.builds(
    lambda configuration: {
        "schema_version": 2,
        "extensions": {BUNDLE_ID: {"enabled": True, "configuration": configuration}},
    },
    CONFIGURATIONS,
)
CONTENTS = st.one_of(
    (STATES | CONFIGURED_STATES | VALUES).map(lambda document: json.dumps(document).encode()),
    st.binary(max_size=24),
    st.text(max_size=24).map(lambda text: text.encode("utf-8", "surrogatepass")),
)


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    return tmp_path_factory.mktemp("hostile") / "config.json"


def in_process(argv: list[str], state: str, extra: dict[str, str]) -> tuple[int, str, str]:
    """``vllm-hust-bundle ARGV`` in this process, with its own environment and streams."""
    env = {k: v for k, v in os.environ.items() if k not in RUNTIME_EVIDENCE_ENVS}
    env.update({STATE_ENV: state, **extra})
    out, err = io.StringIO(), io.StringIO()
    with (
        mock.patch.dict(os.environ, env, clear=True),
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(err),
    ):
        code = cli.main(argv)
    return code, out.getvalue(), err.getvalue()


def configured_state(**configuration) -> bytes:
    entry = {"enabled": True, "configuration": configuration}
    return json.dumps({"schema_version": 2, "extensions": {BUNDLE_ID: entry}}).encode()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(content=CONTENTS, evidence=st.sampled_from([None, *RUNTIME_EVIDENCE_ENVS]))
# Values no stdout or environment can hold, and keys that would break the line.
@example(content=configured_state(environment={SWITCH: "\ud800"}), evidence=None)
@example(content=configured_state(environment={SWITCH: "a\0b"}), evidence=None)
@example(content=configured_state(host_version="\ud800\n"), evidence=None)
@example(content=configured_state(protocol_versions={"p\u2028": "\ud800"}), evidence=None)
@example(content=configured_state(launch_options={"\ud800\x85": 1}), evidence=None)
@example(content=json.dumps({"schema_version": 1, "enabled": ["a\nb"]}).encode(), evidence=None)
@example(
    content=json.dumps({"schema_version": True, "enabled": [BUNDLE_ID]}).encode(), evidence=None
)
def test_no_state_file_makes_inspect_or_env_raise(scratch, content, evidence):
    scratch.write_bytes(content)
    extra = {evidence: "1"} if evidence else {}
    for argv in (["inspect", "--json", BUNDLE_ID], ["inspect", BUNDLE_ID], ["env", BUNDLE_ID]):
        code, out, err = in_process(argv, str(scratch), extra)
        assert code in (0, 1, 2)
        out.encode("utf-8")  # what a UTF-8 stdout can print
        if code == 0:
            assert err == ""
        else:
            (line,) = err.splitlines()
            assert line.startswith("vllm-hust-bundle: error: ")
        if argv[1] == "--json" and code != 2:
            (report,) = json.loads(out)
            assert report["extension_id"] == BUNDLE_ID
