"""Faulty PEFT adapters, each made from a good one by changing one thing.

The LoRA fault tests load them into a serving Spark2_5 model beside good
adapters: :data:`REFUSED_BY_THE_CARRIER` are refused by the carrier's adapter
checks, naming :attr:`Fault.tensor`; :data:`REFUSED_BY_VLLM` fail in vLLM's own
loading before the carrier sees them; :data:`LOADED` load and run, and must
change no other request's output.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spark2_5_dev.lora import PEFT_PREFIX

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
QKV_B = f"{PEFT_PREFIX}model.layers.1.self_attn.q_k_v_proj.lora_B.weight"
UP_A = f"{PEFT_PREFIX}model.layers.2.mlp.up_proj.lora_A.weight"
DOWN_B = f"{PEFT_PREFIX}model.layers.0.mlp.down_proj.lora_B.weight"


@dataclass(frozen=True)
class Fault:
    """How to damage a good adapter directory, and what the error must name."""

    damage: Callable[[Path], None]
    tensor: str = ""


def _edit_tensors(edit: Callable[[dict[str, Any]], None]) -> Callable[[Path], None]:
    def damage(path: Path) -> None:
        from safetensors.torch import load_file, save_file

        tensors = load_file(str(path / WEIGHTS_FILE))
        edit(tensors)
        save_file({k: t.contiguous() for k, t in tensors.items()}, str(path / WEIGHTS_FILE))

    return damage


def _edit_config(edit: Callable[[dict[str, Any]], None]) -> Callable[[Path], None]:
    def damage(path: Path) -> None:
        config = json.loads((path / CONFIG_FILE).read_text())
        edit(config)
        (path / CONFIG_FILE).write_text(json.dumps(config))

    return damage


def _one_nan(tensors: dict[str, Any]) -> None:
    tensors[DOWN_B][0, 0] = float("nan")


def _row_short(tensors: dict[str, Any]) -> None:
    tensors[QKV_B] = tensors[QKV_B][:-1]


def _rank_4_pair(tensors: dict[str, Any]) -> None:
    """``up_proj`` of layer 2 trained at rank 4 while the config says 8."""
    down_a = UP_A.replace("lora_A", "lora_B")
    tensors[UP_A], tensors[down_a] = tensors[UP_A][:4], tensors[down_a][:, :4]


def _overflowing(tensors: dict[str, Any]) -> None:
    """Finite weights whose products overflow float32 activations."""
    for name in tensors:
        if ".lora_B." in name:
            tensors[name] = tensors[name] * 1e36


def _truncate(path: Path) -> None:
    weights = path / WEIGHTS_FILE
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])


def _remove(name: str) -> Callable[[Path], None]:
    return lambda path: (path / name).unlink()


REFUSED_BY_THE_CARRIER: dict[str, Fault] = {
    "nan-weight": Fault(_edit_tensors(_one_nan), DOWN_B),
    "qkv-lora-b-row-short": Fault(_edit_tensors(_row_short), QKV_B),
    "lora-a-rank-4-of-8": Fault(_edit_tensors(_rank_4_pair), UP_A),
}
REFUSED_BY_VLLM: dict[str, Fault] = {
    "config-not-json": Fault(lambda path: (path / CONFIG_FILE).write_text("{'r': 8,")),
    "dora": Fault(_edit_config(lambda config: config.update(use_dora=True))),
    "rank-above-max-lora-rank": Fault(_edit_config(lambda config: config.update(r=64))),
    "no-weights": Fault(_remove(WEIGHTS_FILE)),
    "truncated-weights": Fault(_truncate),
    "no-config": Fault(_remove(CONFIG_FILE)),
}
LOADED: dict[str, Fault] = {"overflowing": Fault(_edit_tensors(_overflowing))}


def faulty_adapter(good: str | Path, fault: Fault, out: str | Path) -> Path:
    """A copy of the adapter ``good`` at ``out`` with ``fault`` applied."""
    out = Path(out)
    shutil.copytree(good, out)
    fault.damage(out)
    return out
