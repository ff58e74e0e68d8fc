"""A tiny RL loop: three weight pushes into a running engine, each changing its greedy
continuation. Run it with the carrier enabled on a checkpoint folder holding one
model.safetensors: ``SPARK2_5_PLUGIN_ENABLE=1 python rl_loop.py FOLDER``."""

import shutil
import sys
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from vllm import LLM, SamplingParams


def main(checkpoint: Path) -> None:
    llm = LLM(model=str(checkpoint), dtype="float32", max_model_len=256)
    greedy = SamplingParams(temperature=0.0, max_tokens=12)
    prompt = "The weather in Paris"
    print("step 0:", llm.generate([prompt], greedy)[0].outputs[0].token_ids)

    weights = load_file(checkpoint / "model.safetensors")
    noise = torch.Generator().manual_seed(0)
    pushed = Path(tempfile.mkdtemp())
    shutil.copy(checkpoint / "config.json", pushed)
    for step in range(1, 4):
        with torch.no_grad():  # stands in for an optimizer step
            for tensor in weights.values():
                tensor.add_(torch.randn(tensor.shape, generator=noise), alpha=0.05)
        save_file(weights, pushed / "model.safetensors")
        llm.collective_rpc("reload_weights", kwargs={"weights_path": str(pushed)})
        print(f"step {step}:", llm.generate([prompt], greedy)[0].outputs[0].token_ids)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
