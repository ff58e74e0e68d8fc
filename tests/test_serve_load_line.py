"""A real ``vllm serve`` proves the carrier was discovered: one load line per process."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import openai
import pytest
from conftest import clean_env

from vllm_spark2_5_plugin._gate import ENABLE_ENV
from vllm_spark2_5_plugin.testing.server import VllmServer

pytestmark = pytest.mark.serve

PID = re.compile(r"\bpid=(\d+)\)")
LOAD_LINE = "vllm-spark2_5-plugin loaded ("


def pid_logging_env(directory: Path) -> dict[str, str]:
    """vLLM's logging with every line naming its process. vLLM 0.32 prefixes each
    process's lines itself; 0.27 does so only after a process has loaded its
    plugins, so without this the early load lines could not be told apart."""
    config = directory / "pid-logging.json"
    config.write_text(
        json.dumps(
            {
                "version": 1,
                "disable_existing_loggers": False,
                "formatters": {"pid": {"format": "(%(processName)s pid=%(process)d) %(message)s"}},
                "handlers": {
                    "pid": {
                        "class": "logging.StreamHandler",
                        "formatter": "pid",
                        "stream": "ext://sys.stdout",
                    }
                },
                "loggers": {"vllm": {"handlers": ["pid"], "level": "INFO", "propagate": False}},
            }
        ),
        encoding="utf-8",
    )
    return {"VLLM_LOGGING_CONFIG_PATH": str(config)}


def load_lines_by_pid(log: str) -> tuple[Counter, set[str], list[str]]:
    """Load lines counted per process, every process that logged, the load lines."""
    lines = [ln for ln in log.splitlines() if LOAD_LINE in ln]
    per_pid = Counter(PID.search(ln).group(1) for ln in lines)
    logging_pids = {m.group(1) for m in PID.finditer(log)}
    return per_pid, logging_pids, lines


def serve_and_chat(model, env, log_path) -> str:
    with VllmServer(model, env=env, log_path=log_path) as server:
        client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused")
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

    per_pid, logging_pids, lines = load_lines_by_pid(log)
    # API server, engine core and worker all load general plugins.
    assert len(per_pid) >= 3, log[-4000:]
    assert set(per_pid.values()) == {1}, lines
    assert logging_pids == set(per_pid), "a vLLM process logged but never loaded the carrier"
    assert all("enabled=1" in line for line in lines), lines
    assert all("registered=config:spark2_5" in line for line in lines)
