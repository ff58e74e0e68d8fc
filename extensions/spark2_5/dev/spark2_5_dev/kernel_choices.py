"""What vLLM chose for Spark2_5 on this process's CPU class: its kernel library,
torch's dispatch, how each bfloat16 projection and the attention compute, and
how each quantized format's layers compute or that the carrier refused them.

One bfloat16 engine of the fixture's shape, then one per quantized format, each
answering one greedy request (so every chosen kernel ran). The test
(``test_cpu_classes.py``) holds the result to what each class is expected to
choose; the class comes from the environment (``carrier_harness.cpu_classes``).

    python -m spark2_5_dev.kernel_choices --workdir DIR --out RESULT.json
"""

from __future__ import annotations

import gc
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spark2_5_dev.drivers import driver_main
from spark2_5_dev.parity import ENGINE_ENV
from spark2_5_dev.quantize import FORMATS, GPTQ_INT4, W8A8_INT8, quantize_checkpoint
from spark2_5_dev.weight_updates import kernel_libraries, offline_engine, quantized_kernels


@dataclass(frozen=True)
class Choices:
    """What vLLM chooses for the fixture's shape on one CPU class (every vLLM of the range)."""

    projections: tuple[str, ...]
    attention: tuple[str, ...]
    # Per quantized format, how its layers compute; None: the carrier refuses it.
    quantized: dict[str, tuple[str, ...] | None]


_ONEDNN_INT8 = ("_apply_weights_onednn",)
# Measured with scripts/as-cpu-class on an AVX-512 BF16 machine. AMX is not listed:
# no AMX machine ran this, and where a CPU's class has no entry only its kernel
# library and torch's dispatch are checked.
EXPECTED = {
    "avx2": Choices(("torch linear",), ("vec",), {W8A8_INT8: _ONEDNN_INT8, GPTQ_INT4: None}),
    "avx512": Choices(("oneDNN",), ("vec",), {W8A8_INT8: _ONEDNN_INT8, GPTQ_INT4: ("gptq_w4a16",)}),
    "avx512_bf16": Choices(
        ("oneDNN",), ("vec",), {W8A8_INT8: _ONEDNN_INT8, GPTQ_INT4: ("gptq_w4a16",)}
    ),
}


def refuses(fmt: str, cpu_class: str) -> bool:
    """Whether the carrier refuses ``fmt`` on ``cpu_class``, as :data:`EXPECTED` says:
    the tests that serve quantized checkpoints accept a refusal only there."""
    return cpu_class in EXPECTED and EXPECTED[cpu_class].quantized[fmt] is None


# What a CPU projection's ``cpu_linear`` calls, by the name vLLM's set-up gave it.
PROJECTION_KERNELS = {
    "onednn_mm": "oneDNN",
    "weight_packed_linear_cpu": "AMX (SGL)",
    "linear": "torch linear",
}


def _projection_kernel(cpu_linear: Any) -> str:
    names = getattr(getattr(cpu_linear, "__code__", None), "co_names", ())
    found = [kernel for name, kernel in PROJECTION_KERNELS.items() if name in names]
    return found[0] if found else f"other: {cpu_linear!r}"


def _float_choices(model: Any) -> dict[str, list[str]]:
    projections, attention = set(), set()
    for module in model.modules():
        if hasattr(module, "cpu_linear"):
            projections.add(_projection_kernel(module.cpu_linear))
        if hasattr(module, "impl") and hasattr(module, "isa"):  # set by CPU attention
            attention.add(module.isa)
    return {"projections": sorted(projections), "attention": sorted(attention)}


def _builders_isa(worker: Any) -> list[str]:
    groups = getattr(worker.model_runner, "attn_groups", [])
    builders = [b for group in groups for g in group for b in g.metadata_builders]
    return sorted({b.isa for b in builders if hasattr(b, "isa")})


def _attention_isa(llm: Any, on_layers: list[str]) -> list[str]:
    """The ISA CPU attention runs with: newer vLLM marks it on each layer, vLLM
    0.23 keeps it only in its metadata builders, read there in the worker."""
    return on_layers or llm.collective_rpc(_builders_isa)[0]


def _answers(llm: Any) -> bool:
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=4, temperature=0)
    (output,) = llm.generate([{"prompt_token_ids": [17, 40, 99, 120, 33]}], params)
    return len(output.outputs[0].token_ids) > 0


def run(workdir: Path) -> dict[str, Any]:
    for name, value in ENGINE_ENV.items():
        os.environ.setdefault(name, value)
    import torch

    from spark2_5_dev.checkpoints import build_spark2_5_checkpoint
    from spark2_5_dev.fixture import FIXTURE_CONFIG_OVERRIDES

    torch.set_num_threads(1)
    float_path = build_spark2_5_checkpoint(workdir / "float", seed=3, **FIXTURE_CONFIG_OVERRIDES)
    llm = offline_engine(float_path, dtype="bfloat16")
    result: dict[str, Any] = {
        "torch_capability": torch.backends.cpu.get_cpu_capability(),
        "bfloat16": {**llm.apply_model(_float_choices)[0], "answers": _answers(llm)},
    }
    on_layers = result["bfloat16"]["attention"]
    result["bfloat16"]["attention"] = _attention_isa(llm, on_layers)
    del llm
    gc.collect()
    for fmt in FORMATS:
        path = quantize_checkpoint(float_path, workdir / fmt, fmt)
        try:
            llm = offline_engine(path, dtype="bfloat16")
        except RuntimeError as refused:  # no kernel for it on this CPU, the carrier says
            result[fmt] = {"refused": str(refused)}
            continue
        result[fmt] = {"kernels": quantized_kernels(llm), "answers": _answers(llm)}
        del llm
        gc.collect()
    return {**result, "kernel_libraries": kernel_libraries()}


def main() -> None:
    driver_main(__spec__.name, __doc__.splitlines()[0], run, summary=lambda result: result)


if __name__ == "__main__":
    main()
