"""Default-off smoke on real ``vllm serve``: an installed but disabled carrier changes
nothing. This is the first piece of evidence a carrier needs before ``active``."""

from __future__ import annotations

import re

import pytest

from carrier_harness.logs import lines_by_pid, pid_logging_env
from carrier_harness.project import PROJECT_ROOT
from carrier_harness.server import VllmServer, run_vllm_serve_expecting_failure
from spark2_5_dev.carrier import BUNDLE_ID, ENABLE_ENV, LOAD_LINE, clean_env

pytestmark = pytest.mark.serve

PROMPTS = ["hello", "The quick brown fox", "<tool_call>get_weather<arg_key>city"]
# `-X importtime` on every vLLM process: each import is logged with its module name.
IMPORT_LINE = re.compile(r"import time:\s+\d+ \|\s+\d+ \|\s+(\S+)")


def greedy_completions(model, env, log_path) -> tuple[list[list[int]], str]:
    with VllmServer(model, env=env, log_path=log_path) as server:
        client = server.openai_client()
        reply = client.completions.create(
            model=str(model),
            prompt=PROMPTS,
            max_tokens=16,
            temperature=0,
            extra_body={"return_token_ids": True},
        )
        ordered = sorted(reply.choices, key=lambda c: c.index)
        return [c.token_ids for c in ordered], server.log()


@pytest.fixture(scope="module")
def disabled_and_excluded(tiny_llama, tmp_path_factory):
    logs = tmp_path_factory.mktemp("default-off")
    disabled = greedy_completions(
        tiny_llama,
        clean_env(PYTHONPROFILEIMPORTTIME="1", **pid_logging_env(logs)),
        logs / "disabled.log",
    )
    # The baseline: vLLM told to load no general plugin but a name that is not ours.
    excluded = greedy_completions(
        tiny_llama, clean_env(VLLM_PLUGINS="not-the-spark-carrier"), logs / "excluded.log"
    )
    return disabled, excluded


def test_disabled_carrier_gives_identical_greedy_outputs(disabled_and_excluded):
    (disabled_tokens, _), (excluded_tokens, excluded_log) = disabled_and_excluded
    assert "vllm-spark2_5-plugin loaded" not in excluded_log
    assert all(len(tokens) == 16 for tokens in disabled_tokens)
    assert disabled_tokens == excluded_tokens


def test_disabled_carrier_logs_enabled_0_once_per_process(disabled_and_excluded):
    (_, log), _ = disabled_and_excluded
    per_pid, logging_pids, lines = lines_by_pid(log, LOAD_LINE)
    assert len(per_pid) >= 3  # API server, engine core, worker
    assert set(per_pid.values()) == {1}, lines
    assert logging_pids == set(per_pid)
    assert all("enabled=0" in line for line in lines)


def test_disabled_carrier_imports_only_its_switch(disabled_and_excluded):
    (_, log), _ = disabled_and_excluded
    imported = {m.group(1) for m in IMPORT_LINE.finditer(log)}
    assert "vllm.plugins" in imported  # the probe works: imports are being logged
    ours = {name for name in imported if name.split(".")[0].startswith("vllm_") and "." in name}
    assert "vllm_hust_bundle_kit.switch" in ours  # the entry point did run
    # The carrier's bundle package (its manifest), its settings, the toolkit's switch.
    assert ours <= {
        "vllm_spark2_5_plugin.bundles",
        "vllm_spark2_5_plugin.bundles.spark2_5",
        "vllm_spark2_5_plugin.settings",
        "vllm_hust_bundle_kit.contract",
        "vllm_hust_bundle_kit.entry",
        "vllm_hust_bundle_kit.switch",
    }, ours


def test_disabled_carrier_cannot_serve_spark2_5_and_says_how_to_enable(spark_chat_model):
    result = run_vllm_serve_expecting_failure(spark_chat_model, env=clean_env(), timeout=240)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    # Without the carrier vLLM does not know model_type spark2_5 and stops at the
    # checkpoint's remote-code pointer (as the README's troubleshooting quotes); the
    # carrier's load line names the real fix.
    readme = " ".join((PROJECT_ROOT / "README.md").read_text(encoding="utf-8").split())
    for quoted in (
        "contains custom code which must be executed",
        "Please pass the argument `trust_remote_code=True` to allow custom code to be run.",
    ):
        assert quoted in output and quoted in readme
    (line,) = [ln for ln in output.splitlines() if "vllm-spark2_5-plugin loaded" in ln]
    assert "enabled=0" in line
    assert f"{ENABLE_ENV}=1" in line and BUNDLE_ID in line
