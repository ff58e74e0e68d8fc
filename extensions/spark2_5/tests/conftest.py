"""Session fixtures of the Spark2_5 carrier's tests: tiny checkpoints built once."""

from __future__ import annotations

import pytest


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
