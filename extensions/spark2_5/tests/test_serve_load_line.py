"""A real ``vllm serve`` proves the carrier was discovered: one load line per process."""

from __future__ import annotations

import pytest

from carrier_harness.logs import lines_by_pid, pid_logging_env
from carrier_harness.server import VllmServer
from spark2_5_dev.carrier import ENABLE_ENV, LOAD_LINE, clean_env

pytestmark = pytest.mark.serve


def serve_and_chat(model, env, log_path) -> str:
    with VllmServer(model, env=env, log_path=log_path) as server:
        client = server.openai_client()
        reply = client.chat.completions.create(
            model=str(model),
            messages=[{"role": "user", "content": "hello"}],
            max_tokens=4,
            temperature=0,
        )
        assert reply.choices[0].finish_reason in {"stop", "length"}
        assert reply.usage.completion_tokens >= 1
    return server.log()


def test_every_vllm_process_logs_the_load_line_once(tiny_llama, tmp_path):
    """Enabled here; the disabled case is part of the default-off smoke."""
    env = clean_env(**{ENABLE_ENV: "1"}, **pid_logging_env(tmp_path))
    log = serve_and_chat(tiny_llama, env, tmp_path / "serve.log")

    per_pid, logging_pids, lines = lines_by_pid(log, LOAD_LINE)
    # API server, engine core and worker all load general plugins.
    assert len(per_pid) >= 3, log[-4000:]
    assert set(per_pid.values()) == {1}, lines
    assert logging_pids == set(per_pid), "a vLLM process logged but never loaded the carrier"
    assert all("enabled=1" in line for line in lines), lines
    # Each piece is registered at once where the process has loaded its registry
    # before its plugins (vLLM 0.32 serve: every process, every registry), else
    # when the registry loads; either way the line accounts for it.
    for line in lines:
        for item in ("config:spark2_5", "model:Spark2_5ForCausalLM", "tool_parser:spark25"):
            assert item in line, line
