"""The GPU run's parity step: Spark2_5 and an in-tree control, each served eager and
compiled, each against its own reference.

The control is an in-tree ``LlamaForCausalLM`` of the same dimensions (full
attention, SiLU MLP, no gate), random weights of the same spread, scored against
transformers' own Llama. It runs exactly as Spark2_5 does, so a miss that both
show comes from the GPU stack (kernels, precision), not from the carrier.

Float32: TF32 is off everywhere (vLLM's matmuls, Triton's ``tl.dot`` in the
attention kernels, the references), and each model must give the reference's
greedy tokens with log-probs within the project's float32 tolerance. Bfloat16:
Spark2_5's deviation from its float32 reference is judged against the band the
control measures on the same GPU. Both dtypes: the compiled engine (CUDA graphs)
must give the eager engine's tokens.
"""

from __future__ import annotations

import gc
import os
from pathlib import Path
from typing import Any

import torch
from bench_serving import LLAMA_SHAPE_KEYS
from model_engine import offline_llm

from spark2_5_dev.reference import Spark2_5Reference

MODELS = ("spark2_5", "control")
MODES = ("eager", "compiled")
# Set for the float32 steps before anything imports vLLM or Triton.
PRECISE_FLOAT32_ENV = {"VLLM_FLOAT32_MATMUL_PRECISION": "highest", "TRITON_F32_DEFAULT": "ieee"}
# Spark2_5 in bfloat16 may deviate from its float32 reference this many times as
# much as the control does (plus a floor for a control that happens to be exact),
# and agree on the argmax at most this much less often.
BF16_BAND = 2.0
BF16_FLOOR = 0.05
BF16_AGREEMENT_SLACK = 0.05


def control_config(config: dict[str, Any]) -> dict[str, Any]:
    """The in-tree control's config: Spark2_5's dimensions, full attention only."""
    shape = {k: config[k] for k in LLAMA_SHAPE_KEYS if k in config}
    shape.pop("layer_types", None)
    shape.pop("sliding_window", None)
    theta = config["rope_parameters"]["full_attention"]["rope_theta"]
    return {**shape, "hidden_act": "silu", "rope_theta": theta, "max_position_embeddings": 4096}


def build_control(path: Path, config: dict[str, Any], std: float, seed: int, device: str) -> Path:
    """A random ``LlamaForCausalLM`` of :func:`control_config`, saved in bfloat16."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from spark2_5_dev.checkpoints import write_tokenizer

    torch.manual_seed(seed)
    llama_config = LlamaConfig(architectures=["LlamaForCausalLM"], **control_config(config))
    with torch.device(device):
        model = LlamaForCausalLM(llama_config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.uniform_(0.8, 1.2)
            else:
                param.normal_(0.0, std)
    model.to(torch.bfloat16).save_pretrained(str(path))
    write_tokenizer(path)
    return path


class HFReference(torch.nn.Module):
    """transformers' own model of a checkpoint, scored as ``Spark2_5Reference`` is."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    @classmethod
    def from_pretrained(cls, path: Path) -> HFReference:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(
            str(path), torch_dtype=torch.float32, attn_implementation="eager"
        )
        return cls(model).eval()

    def as_input(self, tokens: list[int]) -> torch.Tensor:
        return torch.tensor(tokens, device=self.model.get_input_embeddings().weight.device)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.model(tokens[None]).logits[0].float()

    generate = Spark2_5Reference.generate
    score = Spark2_5Reference.score


def attention_backend(model: Any) -> str:
    """The attention backend vLLM gave the model's first layer."""
    for module in model.modules():
        backend = getattr(module, "attn_backend", None)
        if backend is not None:
            return backend.get_name()
    return "unknown"


def serve(path: Path, dtype: str, batch: list[list[int]], mode: str) -> dict[str, Any]:
    """Greedy continuations with log-probs from one engine, and its attention backend."""
    from vllm import SamplingParams

    from spark2_5_dev.parity import NEW_TOKENS, completion_record

    cuda = torch.cuda.is_available()
    # Half the GPU, so that the reference fits beside an engine not yet torn down.
    memory = {"gpu_memory_utilization": 0.5} if cuda else {}
    llm = offline_llm(str(path), 2048, dtype, enforce_eager=mode == "eager", **memory)
    params = SamplingParams(
        temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True, logprobs=1, detokenize=False
    )
    outputs = llm.generate([{"prompt_token_ids": p} for p in batch], params, use_tqdm=False)
    served = {
        "backend": llm.apply_model(attention_backend)[0],
        "outputs": [completion_record(output) for output in outputs],
    }
    del llm
    gc.collect()
    return served


def reference_of(model: str, path: Path) -> Any:
    """The model's float32 reference, on the GPU when there is one."""
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        if model == "spark2_5":
            return Spark2_5Reference.from_pretrained(path)
        return HFReference.from_pretrained(path)


def compared(
    model: str, path: Path, dtype: str, batch: list[list[int]], served: dict[str, Any]
) -> dict[str, Any]:
    """Each mode's continuations scored by the model's reference, and the compiled
    tokens against the eager ones."""
    from spark2_5_dev import parity
    from spark2_5_dev.hybrid import compare_teacher_forced

    reference = reference_of(model, path)
    result: dict[str, Any] = {}
    for mode in MODES:
        outputs = served[mode]["outputs"]
        if dtype == "float32":
            prompts = [
                {
                    "prompt_len": len(prompt),
                    **compare_teacher_forced(reference.score(prompt, out["tokens"]), **out),
                }
                for prompt, out in zip(batch, outputs, strict=True)
            ]
            result[mode] = {
                "tokens_match": all(p["tokens_match"] for p in prompts),
                "max_abs_logprob_diff": max(p["max_abs_logprob_diff"] for p in prompts),
                "prompts": prompts,
            }
        else:
            result[mode] = parity._compare_teacher_forced(reference, batch, outputs)
        result[mode]["attention_backend"] = served[mode]["backend"]
    eager, compiled = (served[mode]["outputs"] for mode in MODES)
    result["compiled_equals_eager"] = [
        e["tokens"] == c["tokens"] for e, c in zip(eager, compiled, strict=True)
    ]
    del reference
    gc.collect()
    return result


def verdict(dtype: str, results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Whether Spark2_5 passes, and whether the control says the GPU stack could."""
    from spark2_5_dev import parity

    spark, control = results["spark2_5"], results["control"]

    def within(result: dict[str, Any], bound: float) -> bool:
        return result["tokens_match"] and result["max_abs_logprob_diff"] <= bound

    if dtype == "float32":
        bound = parity.FP32_LOGPROB_TOLERANCE
        control_ok = all(within(control[mode], bound) for mode in MODES)
        spark_ok = all(within(spark[mode], bound) for mode in MODES)
        band = {"logprob_tolerance": bound}
    else:
        worst = max(control[mode]["max_abs_logprob_diff"] for mode in MODES)
        agreement = min(control[mode]["argmax_agreement"] for mode in MODES)
        band = {
            "max_abs_logprob_diff": BF16_BAND * worst + BF16_FLOOR,
            "min_argmax_agreement": agreement - BF16_AGREEMENT_SLACK,
        }
        control_ok = True  # the control defines the band
        spark_ok = all(
            spark[mode]["max_abs_logprob_diff"] <= band["max_abs_logprob_diff"]
            and spark[mode]["argmax_agreement"] >= band["min_argmax_agreement"]
            for mode in MODES
        )
    spark_ok = spark_ok and all(spark["compiled_equals_eager"])
    return {
        "band": band,
        "control_within": control_ok,
        "compiled_equals_eager": {m: all(results[m]["compiled_equals_eager"]) for m in MODELS},
        "within_tolerance": spark_ok,
        "conclusive": control_ok,
    }


def parity_phase(
    workdir: Path, dtype: str, prompt_lengths: tuple[int, ...], seed: int
) -> dict[str, Any]:
    """Both models served eager and compiled, each against its reference."""
    from spark2_5_dev.checkpoints import read_config
    from spark2_5_dev.parity import prompts

    if dtype == "float32":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    paths = {"spark2_5": workdir / "checkpoint", "control": workdir / "control"}
    batch = prompts(seed, read_config(paths["spark2_5"])["vocab_size"], prompt_lengths)
    results = {}
    for model, path in paths.items():
        served = {mode: serve(path, dtype, batch, mode) for mode in MODES}
        results[model] = compared(model, path, dtype, batch, served)
    cuda = torch.cuda.is_available()
    return {
        "device": torch.cuda.get_device_name(0) if cuda else "cpu",
        "dtype": dtype,
        "precision_env": {k: os.environ.get(k) for k in PRECISE_FLOAT32_ENV},
        "results": results,
        **verdict(dtype, results),
    }
