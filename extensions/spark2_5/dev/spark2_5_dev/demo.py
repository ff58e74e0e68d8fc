"""The README's main command: a Spark2_5 model answering a chat and calling a tool.

Builds (or reuses) the trained tiny Spark2_5 fixture, serves it with
``vllm serve --enable-auto-tool-choice --tool-call-parser spark25`` and the
carrier enabled, asks one plain question and one that needs a tool through the
``openai`` client, prints what came back, and stops the server.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import openai

from carrier_harness.server import VllmServer
from spark2_5_dev import fixture


def main() -> None:
    parser = argparse.ArgumentParser(
        prog=f"python -m {__spec__.name}", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--model", type=Path, help="a Spark2_5 checkpoint (default: the fixture)")
    parser.add_argument("--log", type=Path, help="where to keep the vllm serve log")
    args = parser.parse_args()

    model = args.model or fixture.build_fixture()
    log = args.log or Path(tempfile.mkdtemp(prefix="spark2_5-demo-")) / "serve.log"
    server = VllmServer(
        model, fixture.SERVE_ARGS, env={"SPARK2_5_PLUGIN_ENABLE": "1"}, log_path=log
    )
    print("$ SPARK2_5_PLUGIN_ENABLE=1", " ".join(server.command), flush=True)
    with server:
        for line in server.log().splitlines():
            if "vllm-spark2_5-plugin loaded" in line:
                print(line.strip())
                break
        client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused")
        served = client.models.list().data[0].id

        question = fixture.CAPITAL_QUESTION
        reply = client.chat.completions.create(
            model=served, messages=[{"role": "user", "content": question}], temperature=0
        )
        print(f"\nuser: {question}")
        print(f"assistant ({reply.choices[0].finish_reason}): {reply.choices[0].message.content}")

        question = fixture.PARIS_QUESTION
        reply = client.chat.completions.create(
            model=served,
            messages=[{"role": "user", "content": question}],
            tools=[fixture.WEATHER_TOOL],
            temperature=0,
        )
        choice = reply.choices[0]
        print(f"\nuser: {question}   (tools: get_weather)")
        print(f"assistant ({choice.finish_reason}):")
        for call in choice.message.tool_calls or []:
            print(json.dumps(call.model_dump(), indent=2, ensure_ascii=False))
    print(f"\nserver stopped; its log is {log}")


if __name__ == "__main__":
    main()
