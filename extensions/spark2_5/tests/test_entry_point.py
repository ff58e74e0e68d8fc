"""The ``vllm.general_plugins`` entry point, run in fresh interpreters.

Each test runs ``register()`` in a subprocess so that ``sys.modules``, vLLM's
registries and the one-line-per-process guarantee are observed from scratch.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from importlib.metadata import entry_points

import pytest

from spark2_5_dev.carrier import BUNDLE_ID, ENABLE_ENV, clean_env
from vllm_hust_bundle_kit.contract import ENABLED_BUNDLES_ENVS
from vllm_spark2_5_plugin import OVERRIDE_ENV

LOAD_LINE = "vllm-spark2_5-plugin loaded ("


def run_python(code: str, cwd=None, **env: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter with only the given carrier switches set."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=clean_env(**env),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
        check=False,
    )


def load_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if LOAD_LINE in line]


def test_entry_point_is_declared_under_the_seed_name():
    (plugin,) = [ep for ep in entry_points(group="vllm.general_plugins") if ep.name == "spark2_5"]
    assert plugin.value == "vllm_spark2_5_plugin:register"


DISABLED_PROBE = """
    import json, os, sys
    from importlib.metadata import entry_points
    (plugin,) = [ep for ep in entry_points(group="vllm.general_plugins") if ep.name == "spark2_5"]
    before = set(sys.modules)
    files_before = set(os.listdir("."))
    plugin.load()()
    plugin.load()()  # a second call in the same process stays silent
    print(json.dumps({
        "loaded": sorted(set(sys.modules) - before),
        "new_files": sorted(set(os.listdir(".")) - files_before),
    }))
"""
# What register() may import before its switch is on: the carrier's package and its
# bundle manifest's package, its settings and the toolkit's standard-library-only
# switch modules.
SWITCH_MODULES = {
    "vllm_spark2_5_plugin",
    "vllm_spark2_5_plugin.bundles",
    "vllm_spark2_5_plugin.bundles.spark2_5",
    "vllm_spark2_5_plugin.settings",
    "vllm_hust_bundle_kit",
    "vllm_hust_bundle_kit.contract",
    "vllm_hust_bundle_kit.entry",
    "vllm_hust_bundle_kit.switch",
}


@pytest.mark.parametrize("switch", [None, "0", "off", "", "garbage"])
def test_disabled_register_imports_nothing_heavy_and_writes_nothing(switch, tmp_path):
    env = {} if switch is None else {ENABLE_ENV: switch}
    result = run_python(DISABLED_PROBE, cwd=tmp_path, **env)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.splitlines()[-1])
    ours = {name for name in report["loaded"] if name.split(".")[0].startswith("vllm_")}
    assert ours <= SWITCH_MODULES, ours - SWITCH_MODULES
    heavy = [n for n in report["loaded"] if n.split(".")[0] in ("vllm", "torch", "transformers")]
    assert heavy == []
    assert report["new_files"] == []
    (line,) = load_lines(result.stdout)
    assert "enabled=0" in line
    assert f"{ENABLE_ENV}=1" in line and BUNDLE_ID in line  # says how to enable
    warnings = [ln for ln in result.stdout.splitlines() if "WARNING" in ln]
    if switch == "garbage":
        (warning,) = warnings
        assert ENABLE_ENV in warning and "'garbage'" in warning
    else:
        assert warnings == []


REGISTER_AND_REPORT = """
    import json, logging
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    {prelude}
    import vllm_spark2_5_plugin
    vllm_spark2_5_plugin.register()
    from vllm import ModelRegistry
    from vllm.transformers_utils.config import _CONFIG_REGISTRY
    from vllm.tool_parsers.abstract_tool_parser import ToolParserManager
    print("REPORT", json.dumps({{
        "arch": "Spark2_5ForCausalLM" in ModelRegistry.get_supported_archs(),
        "model_target": repr(ModelRegistry.models.get("Spark2_5ForCausalLM")),
        "config": "spark2_5" in _CONFIG_REGISTRY,
        "parser": "spark25" in ToolParserManager.list_registered(),
    }}))
"""


def registration_report(prelude: str = "", **env: str) -> tuple[dict, list[str], str]:
    code = textwrap.dedent(REGISTER_AND_REPORT).format(prelude=textwrap.dedent(prelude))
    result = run_python(code, **env)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    report_line = next(ln for ln in result.stdout.splitlines() if ln.startswith("REPORT "))
    return json.loads(report_line.removeprefix("REPORT ")), load_lines(output), output


@pytest.mark.parametrize(
    "env",
    [
        {ENABLE_ENV: "1"},
        {ENABLE_ENV: "true"},
        {ENABLED_BUNDLES_ENVS[0]: BUNDLE_ID},
        {ENABLED_BUNDLES_ENVS[1]: BUNDLE_ID},
        {ENABLE_ENV: "", ENABLED_BUNDLES_ENVS[0]: BUNDLE_ID},
    ],
    ids=["env-var", "env-var-true", "bundle-list", "legacy-bundle-list", "empty-var-and-list"],
)
def test_enabled_register_registers_config_model_and_parser(env):
    report, lines, _ = registration_report(**env)
    assert report == {
        "arch": True,
        "model_target": report["model_target"],
        "config": True,
        "parser": True,
    }
    assert "vllm_spark2_5_plugin.spark2_5" in report["model_target"]  # lazy "module:Class"
    (line,) = lines
    assert "enabled=1" in line
    # This process had loaded none of vLLM's registries when the plugin ran: each
    # piece waits for its registry and is registered when the report imports it.
    assert "registered=nothing yet" in line
    assert "deferred=config:spark2_5,model:Spark2_5ForCausalLM,tool_parser:spark25" in line
    assert "vllm=" in line and "verified=" in line


REGISTRIES_FIRST = """
    import vllm.model_executor.models.registry, vllm.tool_parsers, vllm.transformers_utils.config
"""


def test_registries_already_loaded_get_their_pieces_at_once():
    report, (line,), _ = registration_report(REGISTRIES_FIRST, **{ENABLE_ENV: "1"})
    assert report["arch"] and report["config"] and report["parser"]
    assert "registered=config:spark2_5,model:Spark2_5ForCausalLM,tool_parser:spark25" in line
    assert "deferred" not in line


def test_disabled_register_leaves_vllm_registries_untouched():
    report, lines, _ = registration_report()
    assert report == {
        "arch": False,
        "model_target": "None",
        "config": False,
        "parser": False,
    }
    (line,) = lines
    assert "enabled=0" in line


IN_TREE_SPARK = """
    import vllm.transformers_utils.config
    from vllm import ModelRegistry
    ModelRegistry.register_model("Spark2_5ForCausalLM", "in_tree_spark:Spark2_5ForCausalLM")
"""


def test_stands_down_when_vllm_already_provides_the_model():
    report, (line,), _ = registration_report(IN_TREE_SPARK, **{ENABLE_ENV: "1"})
    assert "in_tree_spark" in report["model_target"]
    assert "stood_down=model:Spark2_5ForCausalLM" in line
    assert OVERRIDE_ENV in line  # tells how to use the carrier's model instead
    assert "registered=config:spark2_5" in line


def test_override_replaces_the_in_tree_model():
    report, (line,), _ = registration_report(IN_TREE_SPARK, **{ENABLE_ENV: "1", OVERRIDE_ENV: "1"})
    assert "vllm_spark2_5_plugin.spark2_5" in report["model_target"]
    assert "stood_down" not in line


REFUSING_CONFIG_REGISTRY = """
    import vllm_spark2_5_plugin.host_hooks as host_hooks
    def refuse(*args, **kwargs):
        raise RuntimeError("config registry is read-only")
    host_hooks.register_config = refuse
"""


def test_a_failure_at_plugin_load_logs_one_error_and_never_raises():
    prelude = REFUSING_CONFIG_REGISTRY + "    import vllm.transformers_utils.config\n"
    report, lines, output = registration_report(prelude, **{ENABLE_ENV: "1"})
    assert lines == []
    assert not report["arch"]  # nothing registered after the failure
    (error,) = [ln for ln in output.splitlines() if ln.startswith("ERROR")]
    assert "RuntimeError: config registry is read-only" in error
    assert "Fix:" in error and ENABLE_ENV in error


def test_a_failure_when_a_registry_loads_later_is_logged_and_the_rest_registers():
    report, (line,), output = registration_report(REFUSING_CONFIG_REGISTRY, **{ENABLE_ENV: "1"})
    assert "enabled=1" in line and "deferred=config:spark2_5," in line
    assert report["arch"] and report["parser"] and not report["config"]
    (error,) = [ln for ln in output.splitlines() if ln.startswith("ERROR")]
    assert "failed to register config" in error
    assert "RuntimeError: config registry is read-only" in error
