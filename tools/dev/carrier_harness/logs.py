"""Reading a multi-process ``vllm serve`` log: which process logged which line."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

PID = re.compile(r"\bpid=(\d+)\)")


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


def lines_by_pid(log: str, marker: str) -> tuple[Counter, set[str], list[str]]:
    """Lines containing ``marker`` counted per process, every process that logged, the lines."""
    lines = [line for line in log.splitlines() if marker in line]
    per_pid = Counter(PID.search(line).group(1) for line in lines)
    logging_pids = {match.group(1) for match in PID.finditer(log)}
    return per_pid, logging_pids, lines
