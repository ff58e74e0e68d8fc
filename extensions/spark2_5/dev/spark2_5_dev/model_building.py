"""Building the real vLLM ``Spark2_5ForCausalLM`` in the test process, at any
tensor/pipeline parallel rank, without an engine: for weight-loading and
sharding tests that compare each rank's parameters with the checkpoint."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from spark2_5_dev.reference import checkpoint_tensors

__all__ = [
    "build_model",
    "build_model_and_config",
    "checkpoint_tensors",
    "parallel_rank",
    "vllm_model_env",
]


@pytest.fixture(scope="session")
def vllm_model_env(tmp_path_factory: pytest.TempPathFactory) -> None:
    """vLLM's distributed state for one process (world size 1, gloo) and the
    carrier's registrations, set up once for the session."""
    from vllm_spark2_5_plugin._registration import register_enabled

    register_enabled(override=False)

    from vllm.distributed import parallel_state

    if parallel_state.model_parallel_is_initialized():
        return
    from vllm.config import VllmConfig, set_current_vllm_config

    init_file = tmp_path_factory.mktemp("vllm-dist") / "init"
    with set_current_vllm_config(VllmConfig()):
        parallel_state.init_distributed_environment(
            world_size=1,
            rank=0,
            distributed_init_method=f"file://{init_file}",
            local_rank=0,
            backend="gloo",
        )
        parallel_state.initialize_model_parallel(1, 1)


@contextlib.contextmanager
def parallel_rank(
    monkeypatch: pytest.MonkeyPatch, *, tp: tuple[int, int] = (0, 1), pp: tuple[int, int] = (0, 1)
) -> Iterator[None]:
    """Make this process look like rank ``tp[0]`` of ``tp[1]`` tensor-parallel and
    rank ``pp[0]`` of ``pp[1]`` pipeline-parallel workers while building and
    loading (no collective runs in either)."""
    from vllm.distributed import parallel_state

    with monkeypatch.context() as patch:
        for group, (rank, size) in (
            (parallel_state.get_tp_group(), tp),
            (parallel_state.get_pp_group(), pp),
        ):
            patch.setattr(group, "world_size", size)
            patch.setattr(group, "rank_in_group", rank)
            patch.setattr(group, "ranks", list(range(size)))
            patch.setattr(group, "rank", rank)
        yield


def build_model(checkpoint: Path, max_model_len: int = 128, dtype: str = "float32"):
    """``Spark2_5ForCausalLM`` for ``checkpoint``'s config (and its quantization
    config, if any), with a fresh vLLM config (attention layers register their
    names in it, so one per model)."""
    return build_model_and_config(checkpoint, max_model_len, dtype)[0]


def build_model_and_config(
    checkpoint: Path, max_model_len: int = 128, dtype: str = "float32"
) -> tuple[Any, Any]:
    """:func:`build_model` and the vLLM config it was built in (a forward pass needs it)."""
    import torch
    from vllm.config import ModelConfig, VllmConfig, set_current_vllm_config

    from vllm_spark2_5_plugin.spark2_5 import Spark2_5ForCausalLM

    vllm_config = VllmConfig(
        model_config=ModelConfig(model=str(checkpoint), dtype=dtype, max_model_len=max_model_len)
    )
    if vllm_config.quant_config is not None:
        # As vLLM's model loader does: fused layers are matched through the model's
        # packed_modules_mapping.
        from vllm.model_executor.model_loader.utils import configure_quant_config

        configure_quant_config(vllm_config.quant_config, Spark2_5ForCausalLM)
    with set_current_vllm_config(vllm_config), torch.device("cpu"):
        return Spark2_5ForCausalLM(vllm_config=vllm_config), vllm_config
