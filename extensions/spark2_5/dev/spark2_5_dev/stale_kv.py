"""vLLM's CPU attention and stale KV-cache slots, reproduced on in-tree Llama alone.

Why the carrier writes only finite keys and values on vLLM's CPU build
(``cpu_platform.attention_reads_stale_kv_slots``). No Spark2_5 code runs here: a tiny
random in-tree ``LlamaForCausalLM`` serves a plain prompt, then a request through
a LoRA adapter whose ``v_proj`` update is NaN (vLLM loads such an adapter for
in-tree models), then the plain prompt again, in one engine without prefix
caching whose KV cache holds one full-length request: the adapter's request
fills every block, so the second plain request reuses them whatever order vLLM
hands free blocks out in (0.23.0 and 0.27.1 hand out unused ones first). Where
the attention reads the unused slots of a reused block with weight zero,
0 x NaN = NaN and the plain prompt's tokens change: ``"changed": true``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from spark2_5_dev.checkpoints import build_llama_checkpoint, read_config
from spark2_5_dev.drivers import driver_main
from spark2_5_dev.engines import in_process_llm

PLAIN = [5, 17, 29, 41]
MAX_MODEL_LEN = 256
OUTPUT_TOKENS = 16
# With its output, as long as the engine allows: it fills every block of the cache.
POISONING = list(range(3, 3 + MAX_MODEL_LEN - OUTPUT_TOKENS))
RANK = 8
# vLLM's CPU block size; two hold one full-length request, plus the null block.
BLOCK_SIZE = 128
BLOCKS = MAX_MODEL_LEN // BLOCK_SIZE + 1


def write_nan_adapter(model: Path, path: Path) -> Path:
    """A PEFT adapter of ``model``'s layer-0 ``v_proj`` whose ``lora_B`` is NaN."""
    import torch
    from safetensors.torch import save_file

    config = read_config(model)
    head_dim = config["hidden_size"] // config["num_attention_heads"]
    prefix = "base_model.model.model.layers.0.self_attn.v_proj"
    tensors = {
        f"{prefix}.lora_A.weight": torch.ones(RANK, config["hidden_size"]),
        f"{prefix}.lora_B.weight": torch.full(
            (config["num_key_value_heads"] * head_dim, RANK), float("nan")
        ),
    }
    path.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path / "adapter_model.safetensors"))
    adapter_config = {
        "peft_type": "LORA",
        "r": RANK,
        "lora_alpha": RANK,
        "target_modules": ["v_proj"],
        "base_model_name_or_path": str(model),
    }
    (path / "adapter_config.json").write_text(json.dumps(adapter_config))
    return path


def run(workdir: Path) -> dict[str, Any]:
    from vllm import SamplingParams
    from vllm.lora.request import LoRARequest

    model = build_llama_checkpoint(workdir / "llama", seed=3)
    adapter = write_nan_adapter(model, workdir / "nan-adapter")
    llm = in_process_llm(
        str(model),
        dtype="float32",
        max_model_len=MAX_MODEL_LEN,
        enforce_eager=True,
        enable_lora=True,
        max_lora_rank=RANK,
        enable_prefix_caching=False,
        block_size=BLOCK_SIZE,
        num_gpu_blocks_override=BLOCKS,
    )
    params = SamplingParams(temperature=0.0, max_tokens=OUTPUT_TOKENS, ignore_eos=True)

    def generate(prompt: list[int], lora: Any = None) -> list[int]:
        (output,) = llm.generate(
            [{"prompt_token_ids": prompt}], params, lora_request=lora, use_tqdm=False
        )
        return list(output.outputs[0].token_ids)

    before = generate(PLAIN)
    generate(POISONING, LoRARequest("nan", 1, str(adapter)))
    after = generate(PLAIN)
    return {"before": before, "after": after, "changed": before != after}


if __name__ == "__main__":
    driver_main(
        __spec__.name,
        __doc__.splitlines()[0],
        run,
        lambda result: {"changed": result["changed"]},
    )
