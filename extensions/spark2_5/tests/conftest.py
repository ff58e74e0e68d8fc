"""Fixtures the Spark2_5 carrier's tests share: tiny checkpoints built once, the tiny
tokenizer, ``vllm serve`` with the carrier enabled, an openai client of a module's
``server``, the benchmarks importable."""

from __future__ import annotations

from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory):
    """A random in-tree Llama checkpoint with the project's tiny tokenizer."""
    from spark2_5_dev.checkpoints import build_llama_checkpoint

    return build_llama_checkpoint(tmp_path_factory.mktemp("tiny-llama"), seed=0)


@pytest.fixture(scope="session")
def spark_chat_model():
    """The trained Spark2_5 fixture (built once per machine, then cached)."""
    from spark2_5_dev.fixture import build_fixture

    return build_fixture()


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory):
    """The tiny tokenizer the tool-parser tests parse with."""
    from spark2_5_dev.tool_parsing import load_tokenizer

    return load_tokenizer(tmp_path_factory.mktemp("tokenizer"))


@pytest.fixture(scope="module")
def carrier_enabled_server(request: pytest.FixtureRequest, tmp_path_factory):
    """A factory: ``carrier_enabled_server(model, args, **env)`` is ``vllm serve model
    args`` (a ``VllmServer``, not yet started) with the carrier enabled and ``env``, in
    this process's environment without any other carrier switch; its log is in a new
    folder named after the requesting module."""
    from carrier_harness.server import VllmServer
    from spark2_5_dev.carrier import ENABLE_ENV, clean_env

    def serve(model, args, **env: str) -> VllmServer:
        log = tmp_path_factory.mktemp(request.module.__name__.rpartition(".")[2]) / "serve.log"
        return VllmServer(model, args, env=clean_env(**{ENABLE_ENV: "1"}, **env), log_path=log)

    return serve


@pytest.fixture(scope="module")
def client(server):
    """An openai client of the ``server`` fixture of the requesting module."""
    return server.openai_client()


@pytest.fixture
def benchmarks_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(BENCHMARKS))
