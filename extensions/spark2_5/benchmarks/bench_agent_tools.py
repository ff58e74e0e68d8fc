"""An agent's request, priced against an in-tree parser: 50 tools of 6 properties
(and the same tools with ``"strict": true``) under ``tool_choice`` auto, required
and named, streamed, sent to two ``vllm serve`` of one Spark2_5 checkpoint side by
side on one machine, one parsing with ``spark25``, the other with vLLM's ``glm45``
(the same tag format). The requests alternate between the servers, each after
both engines went idle.

Per scenario and server: time to first token and to the last, and the tokens
generated, of the first request (its call grammar compiled then), the median and
the fastest of the repeats (vLLM has the grammar cached). Then, on each server, forced requests of
one new strict tool of ever more properties, and while each compiles a small
forced request: what one request's compile costs the requests queued behind it,
where ``glm45`` compiles any size and ``spark25`` refuses tools beyond
``MAX_PINNED_PROPERTIES`` with a 400 naming the tool and the limit.

    python extensions/spark2_5/benchmarks/bench_agent_tools.py [--quick] [--runs N] \
        [--out PATH.json]
"""

from __future__ import annotations

import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import common  # noqa: F401  (puts the dev helpers on the path)
from common import Record, base_parser, positive_int, table

from carrier_harness.server import VllmServer
from spark2_5_dev.carrier import clean_env
from spark2_5_dev.checkpoints import build_spark2_5_checkpoint
from spark2_5_dev.tools import function_tool

TOOLS, PROPERTIES = 50, 6
PARSERS = ("spark25", "glm45")
CHOICES = ("auto", "required", "named")
# A vLLM CPU engine keeps a core busy for a while after a request: each request waits
# this long first, so that the other server's engine has gone idle.
IDLE_S = 1.5
# Enough context for the 50 tools the chat template renders into the prompt.
MAX_MODEL_LEN = 32768
MAX_TOKENS = 48
PROPERTY_TYPES = (
    {"type": "string"},
    {"type": "integer"},
    {"type": "number"},
    {"type": "boolean"},
    {"type": "string", "enum": ["low", "medium", "high"]},
    {"type": "array", "items": {"type": "string"}},
)


def agent_tools(strict: bool, prefix: str = "tool") -> list[dict[str, Any]]:
    """``TOOLS`` function tools of ``PROPERTIES`` typed properties each, all required."""
    tools = []
    for index in range(TOOLS):
        properties = {f"arg_{k}": dict(PROPERTY_TYPES[k]) for k in range(PROPERTIES)}
        tool = function_tool(f"{prefix}_{index:02d}", "Does one thing.", properties, properties)
        tool["function"]["strict"] = strict
        tools.append(tool)
    return tools


def one_request(client: Any, model: str, tools: list, choice: str) -> dict[str, float]:
    """Seconds to the first streamed chunk with text or a call and to the end, and
    the tokens generated (the parsers' grammars may steer the model differently)."""
    tool_choice: Any = choice
    if choice == "named":
        tool_choice = {"type": "function", "function": {"name": tools[0]["function"]["name"]}}
    started = time.perf_counter()
    first = None
    stream = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Do the first thing."}],
        tools=tools,
        tool_choice=tool_choice,
        temperature=0,
        max_tokens=MAX_TOKENS,
        stream=True,
        stream_options={"include_usage": True},
    )
    tokens = 0
    for chunk in stream:
        delta = chunk.choices[0].delta if chunk.choices else None
        if first is None and delta is not None and (delta.content or delta.tool_calls):
            first = time.perf_counter() - started
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
    total = time.perf_counter() - started
    return {"ttft_s": first if first is not None else total, "total_s": total, "tokens": tokens}


def scenarios(runs: int, clients: dict[str, Any], models: dict[str, str]) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for strict in (False, True):
        tools = agent_tools(strict)
        for choice in CHOICES:
            name = f"{choice}{', strict' if strict else ''}"
            samples: dict[str, list[dict[str, float]]] = {parser: [] for parser in PARSERS}
            for run in range(runs + 1):  # the first is the cold one
                order = PARSERS if run % 2 == 0 else PARSERS[::-1]
                for parser in order:
                    time.sleep(IDLE_S)
                    samples[parser].append(
                        one_request(clients[parser], models[parser], tools, choice)
                    )
            results[name] = {parser: _summary(samples[parser]) for parser in PARSERS}
            print(name, {p: results[name][p]["warm_total_s"] for p in PARSERS}, flush=True)
    return results


def _summary(samples: list[dict[str, float]]) -> dict[str, Any]:
    warm = samples[1:]
    return {
        "cold_ttft_s": samples[0]["ttft_s"],
        "cold_total_s": samples[0]["total_s"],
        "warm_ttft_s": statistics.median(s["ttft_s"] for s in warm),
        "warm_total_s": statistics.median(s["total_s"] for s in warm),
        "fastest_total_s": min(s["total_s"] for s in warm),
        "warm_tokens": statistics.median(s["tokens"] for s in warm),
        "samples": samples,
    }


def strict_tool_sizes(client: Any, model: str, sizes: list[int]) -> list[dict[str, Any]]:
    """Per size, a forced request of one new strict tool of that many properties and,
    sent while it compiles, a forced request of one new small tool: the seconds of
    each (the second's is what the first costs the requests queued behind it)."""
    import openai

    rows = []
    for size in sizes:
        properties = {f"p{k:05d}": dict(PROPERTY_TYPES[k % 2]) for k in range(size)}
        big = function_tool(f"big_{size}", "Many parameters.", properties)
        big["function"]["strict"] = True
        small = function_tool(f"small_{size}", "One parameter.", {"q": {"type": "string"}})
        outcome: dict[str, Any] = {}

        def send_big(big: dict[str, Any] = big, outcome: dict[str, Any] = outcome) -> None:
            started = time.perf_counter()
            try:
                one_request(client, model, [big], "required")
                outcome["big"] = "served"
            except openai.BadRequestError as refused:
                outcome["big"] = f"refused: {str(refused)[:120]}"
            outcome["big_s"] = time.perf_counter() - started

        thread = threading.Thread(target=send_big)
        thread.start()
        time.sleep(0.2)
        small_s = one_request(client, model, [small], "required")["total_s"]
        thread.join()
        rows.append({"properties": size, **outcome, "small_meanwhile_s": small_s})
        print(rows[-1], flush=True)
    return rows


SHOWN = ("warm_ttft_s", "warm_total_s", "fastest_total_s", "warm_tokens")


def main() -> None:
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--runs", type=positive_int, default=5, help="repeats after the first")
    args = parser.parse_args()
    runs = 2 if args.quick else args.runs
    sizes = [100, 300, 600] if args.quick else [100, 300, 600, 800, 1000, 1100, 1400]
    record = Record("agent-tools", {"runs": runs, "tools": TOOLS, "properties": PROPERTIES})
    with tempfile.TemporaryDirectory() as workdir:
        model_path = build_spark2_5_checkpoint(
            Path(workdir) / "model", seed=0, max_position_embeddings=MAX_MODEL_LEN
        )
        env = clean_env(SPARK2_5_PLUGIN_ENABLE="1")
        servers = {
            name: VllmServer(
                model_path,
                ["--max-model-len", str(MAX_MODEL_LEN), "--enable-auto-tool-choice",
                 "--tool-call-parser", name],
                env=env,
                log_path=Path(workdir) / f"{name}.log",
            )
            for name in PARSERS
        }  # fmt: skip
        with servers["spark25"], servers["glm45"]:
            clients = {name: server.openai_client() for name, server in servers.items()}
            models = {name: client.models.list().data[0].id for name, client in clients.items()}
            results = scenarios(runs, clients, models)
            sizes_result = {
                name: strict_tool_sizes(clients[name], models[name], sizes) for name in PARSERS
            }
    rows = [
        [name, *(r[p][k] for p in PARSERS for k in SHOWN),
         r["spark25"]["cold_total_s"], r["glm45"]["cold_total_s"]]
        for name, r in results.items()
    ]  # fmt: skip
    headers = [
        "tool_choice", "spark25 TTFT s", "spark25 total s", "spark25 fastest s", "spark25 tokens",
        "glm45 TTFT s", "glm45 total s", "glm45 fastest s", "glm45 tokens", "spark25 first s",
        "glm45 first s",
    ]  # fmt: skip
    print(table(headers, rows))
    for name, sized in sizes_result.items():
        print(f"\n{name}: one strict tool forced, and a small forced request sent meanwhile")
        print(table(["strict properties", "seconds", "outcome", "small request meanwhile s"],
                    [[r["properties"], r["big_s"], r["big"][:40], r["small_meanwhile_s"]]
                     for r in sized]))  # fmt: skip
    record.finish(args.out, results={"scenarios": results, "strict_tool_sizes": sizes_result})


if __name__ == "__main__":
    main()
