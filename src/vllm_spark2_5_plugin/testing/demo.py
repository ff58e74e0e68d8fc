"""The README's main command: serve a tiny model with the carrier enabled."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import openai

from vllm_spark2_5_plugin.testing.checkpoints import build_llama_checkpoint
from vllm_spark2_5_plugin.testing.server import VllmServer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workdir", type=Path, help="where to build the model and the log")
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="spark2_5-demo-"))

    model = build_llama_checkpoint(workdir / "tiny-llama")
    print(f"serving {model} with SPARK2_5_PLUGIN_ENABLE=1 ...", flush=True)
    with VllmServer(
        model, env={"SPARK2_5_PLUGIN_ENABLE": "1"}, log_path=workdir / "serve.log"
    ) as server:
        client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused")
        reply = client.chat.completions.create(
            model=str(model), messages=[{"role": "user", "content": "hello"}], max_tokens=8
        )
        print("chat reply:", reply.choices[0].message.content)
        for line in server.log().splitlines():
            if "vllm-spark2_5-plugin loaded" in line:
                print(line)


if __name__ == "__main__":
    main()
