"""What the manager does in the state it is in, and how `inspect` and `env` report it.

Each test runs on the recorded behaviour (the toolkit's prediction) and, where
the ``vllm_hust_ext`` package is installed, through the real manager.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from carrier_harness.manager import (
    MANAGERS,
    TOOL,
    enable_in,
    inspect,
    manager_env,
    real_manager,
    run,
)
from vllm_hust_bundle_kit.contract import ENABLED_BUNDLES_ENVS, STATE_ENV

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
