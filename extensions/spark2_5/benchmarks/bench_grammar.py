"""What one forced tool call asks vLLM to compile: xgrammar's compile time of the
structural tag ``spark25`` gets for ``tool_choice="required"``, by the tag's size.

For tools of growing parameter schemas (one tool of N short properties, string
and integer alternating; and the same with 200-character descriptions), the
structural tag is built exactly as ``vllm serve`` builds it (vLLM's serving-layer
``Parser.adjust_request`` around ``spark25``), then compiled the way vLLM's
xgrammar backend compiles it (``GrammarCompiler(..., max_threads=8)
.compile_structural_tag``, the compiler's cache off so each size is compiled
afresh). Two vocabularies: the project's tiny test tokenizer, and a synthetic
one of ``--vocab`` distinct tokens (random lowercase strings of 2 to 10
characters), the size of real models' vocabularies, on which xgrammar's
per-token work is realistic.

Printed per size: the tag's characters, the wall-clock seconds of the compile
(best of ``--repeats``; xgrammar uses several threads), and seconds per 100,000
characters. The limit ``MAX_GRAMMAR_SCHEMA_CHARS`` in
``spark2_5_tool_parser/schema.py`` is chosen from this table.

    .venv/bin/python extensions/spark2_5/benchmarks/bench_grammar.py
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import platform
import random
import string
import tempfile
import time

import common  # noqa: F401  (puts the dev helpers on the path)
import vllm
import xgrammar as xgr
from transformers import AutoTokenizer

from spark2_5_dev.checkpoints import write_tokenizer
from spark2_5_dev.tool_parsing import chat_request, serving_parser_cls
from spark2_5_dev.tools import function_tool


def forced_structural_tag(tokenizer, properties: int, description: str) -> str:
    schema = {
        f"p{index:05d}": {"type": "integer" if index % 2 else "string", "description": description}
        for index in range(properties)
    }
    tool = function_tool("big", "A tool with many parameters.", schema)
    request = chat_request(tools=[tool], tool_choice="required")
    parser = serving_parser_cls(tokenizer)(tokenizer, request.tools)
    return parser.adjust_request(request).structured_outputs.structural_tag


def synthetic_tokenizer_info(size: int) -> xgr.TokenizerInfo:
    rng = random.Random(0)
    vocab: set[str] = set()
    while len(vocab) < size:
        vocab.add("".join(rng.choices(string.ascii_lowercase, k=rng.randint(2, 10))))
    return xgr.TokenizerInfo(sorted(vocab), vocab_type=xgr.VocabType.RAW)


def compile_seconds(compiler: xgr.GrammarCompiler, tag: str, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        compiler.compile_structural_tag(tag)
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vocab", type=int, default=150_000)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 1000, 3000, 10000])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        write_tokenizer(directory)
        tokenizer = AutoTokenizer.from_pretrained(directory)
    vocabularies = {
        f"tiny ({len(tokenizer)} tokens)": xgr.TokenizerInfo.from_huggingface(tokenizer),
        f"synthetic ({args.vocab:,} tokens)": synthetic_tokenizer_info(args.vocab),
    }
    xgrammar_version = importlib.metadata.version("xgrammar")
    machine = platform.processor() or platform.machine()
    print(f"vLLM {vllm.__version__}, xgrammar {xgrammar_version}, {machine}, {os.cpu_count()} CPUs")
    header = ("properties", 11), ("descr.", 7), ("tag chars", 12), ("seconds", 9), ("s/100k", 8)
    print(f"{'vocabulary':<28}" + "".join(f"{name:>{width}}" for name, width in header))
    for label, info in vocabularies.items():
        compiler = xgr.GrammarCompiler(info, max_threads=8, cache_enabled=False)
        for description in ("", "d" * 200):
            for size in args.sizes:
                tag = forced_structural_tag(tokenizer, size, description)
                seconds = compile_seconds(compiler, tag, args.repeats)
                print(
                    f"{label:<28}{size:>11,}{len(description):>7}{len(tag):>12,}"
                    f"{seconds:>9.2f}{seconds / len(tag) * 100_000:>8.2f}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
