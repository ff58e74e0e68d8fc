# SPDX-License-Identifier: Apache-2.0
"""What a Spark2_5 checkpoint must be before any of its tensors loads.

A checkpoint that does not match its ``config.json`` never loads: vLLM's weight
loaders copy a larger tensor's leading rows without complaint and cast any
dtype, so these checks run on each tensor as the loader streams it, before
vLLM's loaders see it.

* **Shape**: every tensor's full shape, as the file holds it (each
  tensor-parallel rank slices its part later, so every rank compares the whole
  tensor with the whole shape the config implies), and on every pipeline
  stage, including tensors another stage loads.
* **Dtype**: floating point only.
* **Values**: no NaN or infinity, when ``SPARK2_5_PLUGIN_CHECK_FINITE=1``. Off
  by default: on the 4B's shapes in bf16 on a shared 2-core CPU it added 37% to
  94% to the load time (medians of four runs of
  ``extensions/spark2_5/benchmarks/bench_checkpoint_checks.py``), which is not small against
  loading.
* **Files**: a damaged ``.safetensors`` file is named.

Quantized checkpoints carry integer tensors (packed weights, zero points,
``g_idx``) and scales in shapes each scheme defines. When vLLM runs the model
with a quantization config, only the tensors of layers Spark2_5 builds
unquantized whatever the scheme (the RMSNorms and the head-wise gate
``g_proj``) are checked; without one, every tensor is.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import torch

from vllm_spark2_5_plugin.spark2_5_config import Spark2_5Config
from vllm_spark2_5_plugin.spark2_5_names import (
    ALWAYS_UNQUANTIZED,
    CHECKPOINT_SHAPES,
    G_PROJ,
    layer_generic,
)

T = TypeVar("T")
_CONFIG_KEY = re.compile(r"[a-z_]+")


class Spark2_5CheckpointError(ValueError):
    """A checkpoint that does not match its ``config.json``, or a damaged file; the
    message names the tensor or file."""


class TensorChecks:
    """Shape, dtype and (when ``check_finite``) value checks of checkpoint tensors
    against one config."""

    def __init__(self, config: Spark2_5Config, quantized: bool, check_finite: bool) -> None:
        self.config = config
        self.quantized = quantized
        self.check_finite = check_finite

    def _applies(self, shape_key: str) -> bool:
        return not self.quantized or shape_key in ALWAYS_UNQUANTIZED

    def check_layout(self, name: str, tensor: torch.Tensor) -> None:
        """Refuse a tensor whose dtype is not floating point or whose shape is not the
        one ``config.json`` implies for ``name``."""
        shape_key = layer_generic(name)
        if not self._applies(shape_key):
            return
        if not tensor.is_floating_point() and self.quantized and G_PROJ in name:
            raise quantized_g_proj_error(name)
        if not tensor.is_floating_point():
            raise Spark2_5CheckpointError(
                f"Checkpoint tensor {name!r} has dtype {tensor.dtype}; Spark2_5 weights are "
                "floating point (bfloat16, float16 or float32), and vLLM would cast these "
                "values silently. Re-export the checkpoint, or, if it is quantized, say so in "
                "config.json's quantization_config"
            )
        dims = CHECKPOINT_SHAPES.get(shape_key)
        if dims is None:
            return  # not a Spark2_5 tensor: the loader refuses it by name
        expected = [dim.size(self.config) for dim in dims]
        if list(tensor.shape) != expected:
            keys = sorted({key for dim in dims for key in _CONFIG_KEY.findall(dim.formula)})
            settings = ", ".join(f"{key}={getattr(self.config, key)}" for key in keys)
            raise Spark2_5CheckpointError(
                f"Checkpoint tensor {name!r} has shape {list(tensor.shape)}, but config.json "
                f"implies {expected} = [{', '.join(dim.formula for dim in dims)}] with "
                f"{settings}. The checkpoint does not match its config.json: fix whichever "
                "of the two is wrong"
            )

    def check_values(self, name: str, tensor: torch.Tensor) -> None:
        """Refuse a floating tensor holding NaN or infinity, if asked to check."""
        shape_key = layer_generic(name)
        if not (self.check_finite and tensor.is_floating_point() and self._applies(shape_key)):
            return
        if has_non_finite(tensor):
            raise Spark2_5CheckpointError(
                f"Checkpoint tensor {name!r} {non_finite_counts(tensor)}; the model would "
                "compute NaN. The checkpoint is damaged: re-download or re-export it"
            )


def quantized_g_proj_error(name: str) -> Spark2_5CheckpointError:
    """The error for a checkpoint tensor showing that g_proj was quantized."""
    return Spark2_5CheckpointError(
        f"Tensor {name!r}: this checkpoint quantizes g_proj, which Spark2_5 keeps in float "
        "(g_proj.weight). Quantize it again with g_proj left out (compressed-tensors: add "
        "'re:.*g_proj$' to 'ignore'; GPTQ: leave it out of 'modules_in_block_to_quantize')"
    )


def has_non_finite(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` holds a NaN or an infinity.

    ``torch.aminmax`` reads the tensor once without allocating a mask (several
    times faster than ``isfinite().all()`` on CPU): a NaN makes both extremes
    NaN and an infinity is one of them. Unlike a sum it cannot overflow, so it
    is exact for every floating dtype.
    """
    if tensor.numel() == 0:
        return False
    if tensor.element_size() == 1:  # float8: aminmax lacks kernels; float16 keeps NaN/Inf
        tensor = tensor.to(torch.float16)
    low, high = torch.aminmax(tensor)
    return not bool(torch.isfinite(low) & torch.isfinite(high))


def non_finite_counts(tensor: torch.Tensor) -> str:
    """``holds N NaN and M infinite values (of T)``, for an error naming the tensor."""
    nan, inf = int(torch.isnan(tensor).sum()), int(torch.isinf(tensor).sum())
    return f"holds {nan} NaN and {inf} infinite values (of {tensor.numel()})"


# --- damaged safetensors files ------------------------------------------------------


def safetensors_damage(path: Path) -> str | None:
    """What is wrong with the safetensors file at ``path``, or None if safetensors
    reads its header and the tensor data covers the rest of the file exactly."""
    return _opened(path, lambda _: None)[1]


def _opened(path: Path, read: Callable[[Any], T]) -> tuple[T | None, str | None]:
    """``read(file)`` of the safetensors file opened at ``path`` and None, or None and
    what is wrong with the file."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as file:
            return read(file), None
    except OSError as exc:
        return None, f"it cannot be read ({exc.strerror or exc})"
    except SafetensorError as exc:
        return None, f"it is truncated or damaged (safetensors: {exc})"


def checkpoint_folder(model: str, revision: str | None, download_dir: str | None) -> Path | None:
    """The local folder vLLM reads ``model``'s weights from: the path itself, or the
    Hugging Face cache snapshot it downloaded; None where neither is found."""
    if os.path.isdir(model):
        return Path(model)
    try:
        from huggingface_hub import snapshot_download

        folder = snapshot_download(
            model, revision=revision, cache_dir=download_dir, local_files_only=True
        )
    except Exception:  # not a cached repository: nothing to diagnose
        return None
    return Path(folder)


def described_tensors(folder: Path | None) -> list[tuple[str, torch.Tensor]] | None:
    """Every tensor of ``folder``'s safetensors checkpoint as a data-less ("meta")
    tensor of its name, shape and dtype, read from the headers alone (the files an
    index lists, else every ``*.safetensors``); None where the folder has no such
    checkpoint or a file cannot be read (loading then names the damage)."""
    if folder is None:
        return None
    index = folder / "model.safetensors.index.json"
    try:
        if index.is_file():
            files = sorted(
                {folder / name for name in json.loads(index.read_text())["weight_map"].values()}
            )
        else:
            files = sorted(folder.glob("*.safetensors"))
        described = []
        for path in files:
            tensors, damage = _opened(path, _meta_tensors)
            if damage is not None:
                return None
            described += tensors
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RuntimeError):
        return None
    return described or None


def _meta_tensors(file: Any) -> list[tuple[str, torch.Tensor]]:
    described = []
    for name in file.keys():  # noqa: SIM118 (a safetensors file is not iterable)
        part = file.get_slice(name)
        dtype = _SAFETENSORS_DTYPES[part.get_dtype()]  # KeyError: described as unreadable
        described.append((name, torch.empty(part.get_shape(), dtype=dtype, device="meta")))
    return described


# safetensors dtype names -> torch dtypes, for tensors described by a header.
_SAFETENSORS_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}


def refuse_damaged_files(folder: Path) -> None:
    """Raise the error naming the first damaged safetensors file of ``folder``, if any
    (headers and sizes only).

    One of ``Spark2_5Config.folder_checks`` once the carrier registers the config:
    vLLM reads every safetensors header right after the config (for the dtype and
    the tied head) and would fail there with an error naming no file."""
    damaged = _first_damaged_file(folder)
    if damaged is not None:
        raise _damaged_file_error(*damaged)


def naming_damaged_files(
    weights: Iterable[tuple[str, torch.Tensor]], folder: Callable[[], Path | None]
) -> Iterator[tuple[str, torch.Tensor]]:
    """``weights``, except that an error reading them becomes one naming the damaged
    safetensors file of ``folder()`` it comes from (other errors pass unchanged)."""
    iterator = iter(weights)
    while True:
        try:
            item = next(iterator)
        except StopIteration:
            return
        except Exception as exc:
            damaged = _first_damaged_file(folder())
            if damaged is None:
                raise
            raise _damaged_file_error(*damaged) from exc
        yield item


def _first_damaged_file(folder: Path | None) -> tuple[Path, str] | None:
    if folder is None:
        return None
    for path in sorted(folder.glob("*.safetensors")):
        damage = safetensors_damage(path)
        if damage is not None:
            return path, damage
    return None


def _damaged_file_error(path: Path, damage: str) -> Spark2_5CheckpointError:
    return Spark2_5CheckpointError(
        f"Checkpoint file {str(path)!r} cannot be read: {damage}. Re-download or re-copy it"
    )
