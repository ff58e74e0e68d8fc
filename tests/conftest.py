"""Shared fixtures: tiny checkpoints built once per session, carrier environments."""

from __future__ import annotations

import os

import pytest

from vllm_spark2_5_plugin._gate import ENABLE_ENV, ENABLED_BUNDLES_ENVS, OVERRIDE_ENV

CARRIER_ENVS = (ENABLE_ENV, OVERRIDE_ENV, *ENABLED_BUNDLES_ENVS, "VLLM_PLUGINS")


def clean_env(**overrides: str) -> dict[str, str]:
    """The test process environment without any carrier switch, plus ``overrides``."""
    env = {k: v for k, v in os.environ.items() if k not in CARRIER_ENVS}
    env.update(overrides)
    return env


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory):
    """A random in-tree Llama checkpoint with the project's tiny tokenizer."""
    from vllm_spark2_5_plugin.testing.checkpoints import build_llama_checkpoint

    return build_llama_checkpoint(tmp_path_factory.mktemp("tiny-llama"), seed=0)


@pytest.fixture(scope="session")
def spark_chat_model():
    """The trained Spark2_5 fixture (built once per machine, then cached)."""
    from vllm_spark2_5_plugin.testing.fixture import build_fixture

    return build_fixture()
