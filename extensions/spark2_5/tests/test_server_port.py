"""carrier_harness/server.py hands ``vllm serve`` a port no parallel test can take first.

The port is reserved (bound with SO_REUSEADDR, never listening) from the moment a
``VllmServer`` exists until it stops: no other bind gets it, ``bind(0)`` included,
while vLLM, which binds its server socket with SO_REUSEADDR, does;
``test_vllm_serve_binds_the_reserved_port`` shows it with a real ``vllm serve``.
The ports vLLM picks for its own processes it cannot hold: a start that lost one
of those is tried again, a bounded number of times, on the same reserved port.
"""

from __future__ import annotations

import errno
import socket
import sys

import pytest

from carrier_harness.server import START_ATTEMPTS, ServerFailed, VllmServer, reserve_port

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the reservation relies on Linux bind rules"
)


def _bind_error(port: int, reuse_address: bool = False) -> int | None:
    """The errno a fresh bind to ``port`` on loopback gets, None if it succeeds."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        if reuse_address:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError as exc:
            return exc.errno
    return None


def test_a_reserved_port_refuses_other_binds_until_released():
    reservation = reserve_port()
    port = reservation.getsockname()[1]
    assert _bind_error(port) == errno.EADDRINUSE
    reservation.close()
    assert _bind_error(port) is None


def test_a_server_socket_as_vllm_binds_it_takes_a_reserved_port():
    """vLLM's create_server_socket: SO_REUSEADDR, bind, then uvicorn listens."""
    with reserve_port() as reservation:
        port = reservation.getsockname()[1]
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
            server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            server.bind(("127.0.0.1", port))
            server.listen()
            with socket.create_connection(("127.0.0.1", port), timeout=5):
                pass
            # Once it listens, not even a second SO_REUSEADDR bind gets the port.
            assert _bind_error(port, reuse_address=True) == errno.EADDRINUSE


@pytest.mark.parametrize("reuse_address", [False, True])
def test_bind_to_port_zero_never_returns_a_reserved_port(reuse_address: bool):
    """With 200 of the ~28k ephemeral ports reserved, 3,000 draws would hit one
    about 20 times if the kernel did not skip them."""
    reservations = [reserve_port() for _ in range(200)]
    try:
        held = {r.getsockname()[1] for r in reservations}
        assert len(held) == len(reservations)
        drawn = []
        for _ in range(3000):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                if reuse_address:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind(("127.0.0.1", 0))
                drawn.append(sock.getsockname()[1])
        assert held.isdisjoint(drawn)
    finally:
        for reservation in reservations:
            reservation.close()


def test_a_server_holds_its_port_from_construction_until_stop(tmp_path):
    servers = [VllmServer(tmp_path / "model", log_path=tmp_path / f"{i}.log") for i in range(20)]
    ports = [server.port for server in servers]
    assert len(set(ports)) == len(ports)
    assert all(_bind_error(port) == errno.EADDRINUSE for port in ports)
    for server in servers:
        assert server.stop() is None  # never started
    assert all(_bind_error(port) is None for port in ports)


def test_a_server_that_fails_to_start_frees_its_port(tmp_path):
    server = VllmServer(tmp_path / "no-such-model", log_path=tmp_path / "serve.log")
    with pytest.raises(ServerFailed, match="vllm serve exited"):
        server.start()
    assert _bind_error(server.port) is None


@pytest.mark.serve
def test_vllm_serve_binds_the_reserved_port(tiny_llama, tmp_path):
    with VllmServer(tiny_llama, log_path=tmp_path / "serve.log") as server:
        # The server answering is ours, on the port it was handed.
        client = server.openai_client()
        assert [model.id for model in client.models.list().data] == [str(tiny_llama)]
        assert _bind_error(server.port, reuse_address=True) == errno.EADDRINUSE
    # Stopped: nothing listens there any more (the closed connections' TIME_WAIT
    # still refuses a bind without SO_REUSEADDR, as for any server).
    assert _bind_error(server.port, reuse_address=True) is None


def test_an_option_the_caller_sets_replaces_the_cpu_default(tmp_path):
    """scripts/demo serves with fixture.SERVE_ARGS: each option reaches `vllm serve` once."""
    from spark2_5_dev import fixture

    server = VllmServer(tmp_path, fixture.SERVE_ARGS, log_path=tmp_path / "serve.log")
    try:
        options = [arg for arg in server.command if arg.startswith("--")]
        assert len(options) == len(set(options)), server.command
        limit = server.command[server.command.index("--max-model-len") + 1]
        assert limit == fixture.SERVE_ARGS[fixture.SERVE_ARGS.index("--max-model-len") + 1]
        assert "--enforce-eager" in server.command
    finally:
        server.stop()


# A stand-in for `vllm serve` that loses vLLM's port race (the error torch's store
# raises) its first `losses` starts, then answers /health on the port it is given.
STAND_IN = r"""
import http.server, pathlib, sys
port, starts, losses = int(sys.argv[1]), pathlib.Path(sys.argv[2]), int(sys.argv[3])
count = int(starts.read_text() or 0) + 1 if starts.exists() else 1
starts.write_text(str(count))
if count <= losses:
    print("torch.distributed.DistNetworkError: The server socket has failed to listen on any "
          "local network address. port: 46579, code: -98, name: EADDRINUSE, "
          "message: address already in use", flush=True)
    sys.exit(1)
if losses < 0:
    sys.exit("RuntimeError: some other start failure")
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers()
http.server.HTTPServer.allow_reuse_address = True
http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
"""


class StandInServer(VllmServer):
    def __init__(self, tmp_path, losses: int) -> None:
        super().__init__(tmp_path, log_path=tmp_path / "serve.log", startup_timeout=60)
        self.starts = tmp_path / "starts"
        self.losses = losses

    @property
    def command(self) -> list[str]:
        return [sys.executable, "-c", STAND_IN, str(self.port), str(self.starts), str(self.losses)]


def test_a_start_that_lost_a_port_race_inside_vllm_is_tried_again_on_the_same_port(tmp_path):
    server = StandInServer(tmp_path, losses=START_ATTEMPTS - 1)
    port = server.port
    with server:
        assert server.port == port
        assert int(server.starts.read_text()) == START_ATTEMPTS
        kept = sorted(path.name for path in tmp_path.glob("serve.attempt*.log"))
        assert kept == [f"serve.attempt{n}.log" for n in range(1, START_ATTEMPTS)]
        assert "EADDRINUSE" in (tmp_path / "serve.attempt1.log").read_text()
    # Stopped and released (the health checks' TIME_WAIT refuses only a plain bind).
    assert _bind_error(port, reuse_address=True) is None


def test_starts_are_bounded_and_other_failures_are_not_retried(tmp_path):
    for losses, starts in ((START_ATTEMPTS + 5, START_ATTEMPTS), (-1, 1)):
        workdir = tmp_path / str(losses)
        workdir.mkdir()
        server = StandInServer(workdir, losses=losses)
        with pytest.raises(ServerFailed, match="vllm serve exited with 1"):
            server.start()
        assert int(server.starts.read_text()) == starts
        assert _bind_error(server.port) is None
