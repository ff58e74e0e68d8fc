"""Start and stop a real ``vllm serve`` process for tests, the demo and benchmarks."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

# Settings that make vLLM fit the 2-core CPU machines the project runs on.
CPU_SERVE_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_TARGET_DEVICE": "cpu",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}
CPU_SERVE_ARGS = ("--max-model-len", "512", "--enforce-eager")


def serve_args(args: Sequence[str]) -> list[str]:
    """``CPU_SERVE_ARGS`` and then ``args``, each option once: one that ``args`` sets
    (``--max-model-len 1024``) replaces the default instead of following it."""
    given = {arg.split("=", 1)[0] for arg in args if arg.startswith("--")}
    defaults: list[str] = []
    for index, arg in enumerate(CPU_SERVE_ARGS):
        option = arg if arg.startswith("--") else CPU_SERVE_ARGS[index - 1]
        if option not in given:
            defaults.append(arg)
    return [*defaults, *args]


def reserve_port(host: str = "127.0.0.1") -> socket.socket:
    """A socket bound to a free port of ``host``, held to hand that port to ``vllm serve``.

    It sets SO_REUSEADDR, as vLLM's own server socket does, and never listens, so
    on Linux vLLM binds and listens on the same port while it is held; until it
    is closed the kernel gives the port to no other bind (``bind(0)`` included).
    Binding and closing at once would leave a window in which a parallel test
    could take the port before vLLM binds it; ``--port 0`` would close it too,
    but vLLM then logs port 0 and the real one is only in its socket table.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    return sock


# vLLM picks the ports of its own processes (torch.distributed's store, ZMQ
# sockets) by binding port 0 and closing it, then binds that port again: any
# process on the machine can take it in between, and the engine fails to start.
# Seen with two test suites side by side; the next attempt draws other ports.
START_ATTEMPTS = 3


def lost_a_port_race(log: str) -> bool:
    """Whether a failed ``vllm serve`` log shows a port taken from under vLLM."""
    return "address already in use" in log.lower()


def vllm_executable() -> str:
    return str(Path(sys.executable).with_name("vllm"))


class ServerFailed(RuntimeError):
    """``vllm serve`` exited or never became healthy; the message ends with its log."""


class VllmServer:
    """``vllm serve MODEL`` on a reserved loopback port, in its own process group.

    The port is held (``reserve_port``) from construction until ``stop()``. Use as
    a context manager; the whole process group is stopped on exit.
    """

    def __init__(
        self,
        model: str | os.PathLike[str],
        args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        log_path: str | os.PathLike[str] | None = None,
        startup_timeout: float = 300.0,
    ) -> None:
        self.model = str(model)
        self._port_reservation = reserve_port()
        self.port: int = self._port_reservation.getsockname()[1]
        self.args = serve_args(args)
        self.env = {**os.environ, **CPU_SERVE_ENV, **(env or {})}
        self.log_path = Path(log_path) if log_path else Path(f"vllm-serve-{self.port}.log")
        self.startup_timeout = startup_timeout
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def command(self) -> list[str]:
        return [
            vllm_executable(),
            "serve",
            self.model,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            *self.args,
        ]

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def openai_client(self) -> Any:
        """An ``openai`` client of this server that retries no failed request."""
        import openai

        return openai.OpenAI(base_url=f"{self.base_url}/v1", api_key="unused", max_retries=0)

    def start(self) -> VllmServer:
        """Start ``vllm serve`` and wait until it is healthy. A start that lost a
        port race inside vLLM (:func:`lost_a_port_race`) is tried again, on the
        same reserved port, up to ``START_ATTEMPTS`` times; each failed attempt's
        log is kept beside the log (``serve.attempt1.log``)."""
        attempt = 1
        while True:
            try:
                self._start_once()
                return self
            except ServerFailed:
                if attempt == START_ATTEMPTS or not lost_a_port_race(self.log()):
                    self.stop()
                    raise
                self._stop_process()
                self.log_path.rename(self.log_path.with_suffix(f".attempt{attempt}.log"))
                attempt += 1
            except BaseException:
                self.stop()  # the process group and the port, whatever failed
                raise

    def _start_once(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as log_file:
            self.process = subprocess.Popen(
                self.command,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,
            )
        self._wait_healthy()

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ServerFailed(
                    f"vllm serve exited with {self.process.returncode}; log:\n{self.log()[-6000:]}"
                )
            try:
                with urllib.request.urlopen(f"{self.base_url}/health", timeout=2) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.5)
        raise ServerFailed(
            f"vllm serve not healthy after {self.startup_timeout:.0f}s; log:\n{self.log()[-6000:]}"
        )

    def stop(self, grace: float = 20.0) -> int | None:
        """SIGTERM the server's process group, then SIGKILL what is left; free the port."""
        self._port_reservation.close()
        return self._stop_process(grace)

    def _stop_process(self, grace: float = 20.0) -> int | None:
        if self.process is None:
            return None
        pgid = self.process.pid
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=grace)
        # Workers of the group may outlive the API server.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
        self.process.wait()
        return self.process.returncode

    def __enter__(self) -> VllmServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def run_vllm_serve_expecting_failure(
    model: str | os.PathLike[str],
    args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    timeout: float = 300.0,
) -> subprocess.CompletedProcess[str]:
    """Run ``vllm serve`` that is expected to exit by itself; return its output."""
    server = VllmServer(model, args, env)
    try:
        return subprocess.run(
            server.command,
            env=server.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            start_new_session=True,
        )
    finally:
        server.stop()
