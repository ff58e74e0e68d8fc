"""carrier_harness/server.py hands ``vllm serve`` a port no parallel test can take first.

The port is reserved (bound with SO_REUSEADDR, never listening) from the moment a
``VllmServer`` exists until it stops: no other bind gets it, ``bind(0)`` included,
while vLLM, which binds its server socket with SO_REUSEADDR, does. The last test
shows it with a real ``vllm serve``.
"""

from __future__ import annotations

import errno
import socket
import sys

import openai
import pytest

from carrier_harness.server import ServerFailed, VllmServer, reserve_port

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
        client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused")
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
