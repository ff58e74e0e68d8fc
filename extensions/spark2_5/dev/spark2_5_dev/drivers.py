"""Running a driver module of ``spark2_5_dev`` (parity, hybrid) in a fresh process,
whose engines run in that process, and reading back the JSON it writes."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from spark2_5_dev.parity import ENGINE_ENV, FP32_LOGPROB_TOLERANCE, NEW_TOKENS


def run_driver(
    module: str,
    args: Sequence[str],
    workdir: Path,
    timeout: float,
    name: str = "result",
    env: Mapping[str, str] | None = None,
) -> Any:
    """``python -m module *args --workdir workdir --out workdir/<name>.json`` with
    :data:`ENGINE_ENV` and ``env``; its log (``<name>.log``) is in the assertion
    message when it fails."""
    out, log = workdir / f"{name}.json", workdir / f"{name}.log"
    command = [sys.executable, "-m", module, *args, "--workdir", str(workdir), "--out", str(out)]
    with open(log, "w") as log_file:
        done = subprocess.run(
            command,
            env={**os.environ, **ENGINE_ENV, **(env or {})},
            stdout=log_file,
            stderr=subprocess.STDOUT,
            timeout=timeout,
            start_new_session=True,
        )
    assert done.returncode == 0, (
        f"exit code {done.returncode}\n" + log.read_text(errors="replace")[-8000:]
    )
    return json.loads(out.read_text())


def driver_main(
    prog: str, description: str, run: Callable[[Path], Any], summary: Callable[[Any], Any]
) -> None:
    """The command line of a driver with no options of its own: ``run(--workdir)``,
    its ``summary`` printed, the whole result written to ``--out`` as JSON."""
    parser = argparse.ArgumentParser(prog=f"python -m {prog}", description=description)
    parser.add_argument("--workdir", type=Path, required=True, help="where checkpoints go")
    parser.add_argument("--out", type=Path, required=True, help="JSON file for the results")
    args = parser.parse_args()
    result = run(args.workdir)
    print(summary(result))
    args.out.write_text(json.dumps(result, indent=2) + "\n")


def common_prefix(a: list[int], b: list[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share."""
    return next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )


def assert_matches_reference(result: dict[str, Any]) -> None:
    """A float32 parity result: every prompt's greedy tokens are the reference's and
    the log-probs within ``FP32_LOGPROB_TOLERANCE``."""
    for prompt in result["prompts"]:
        assert prompt["new_tokens"] >= NEW_TOKENS
        assert prompt["tokens_match"], (
            f"prompt of {prompt['prompt_len']} tokens diverges at new token "
            f"{prompt['first_mismatch']}: vLLM {prompt['vllm_tokens']} "
            f"vs reference {prompt['reference_tokens']} (closest greedy tie in the "
            f"reference: {prompt['min_greedy_margin']:.1e})"
        )
    assert result["max_abs_logprob_diff"] <= FP32_LOGPROB_TOLERANCE
