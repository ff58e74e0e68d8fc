# SPDX-License-Identifier: Apache-2.0
"""``spark25``: vLLM tool-call parser for Spark2_5's XML/KV call format.

Spark2_5 writes a call as::

    <tool_call>NAME<arg_key>KEY</arg_key><arg_value>VALUE</arg_value>...</tool_call>

The chat template renders this compact form; models also put newlines or other
whitespace between the tags. The tags are special tokens of the real tokenizer,
but the parser reads text, so tags spelled out character by character parse the
same way. ``extensions/spark2_5/docs/tool-calling.md`` says what becomes of
every output.

One concern per module:

* ``values``: a value's text to JSON by its parameter's schema (``$ref`` followed);
* ``scanner``: the incremental reader of the output (content and closed calls);
* ``schema``: the checks a request's tools pass before vLLM compiles a grammar;
* ``adapter``: ``Spark25ToolParser``, the scanner behind vLLM's parser interface.

The first three import no vLLM: they take the tools as plain ``(name, schema)``
data, which the adapter resolves from the request once.

vLLM loads the parser from this package (``vllm_spark2_5_plugin.spark2_5_tool_parser:
Spark25ToolParser``), the import path the carrier registers and users configure.
"""

from vllm_spark2_5_plugin.spark2_5_tool_parser.adapter import (
    DeltaMessage,
    Spark25ToolParser,
    check_tools,
)
from vllm_spark2_5_plugin.spark2_5_tool_parser.scanner import MAX_IDENTIFIER_CHARS
from vllm_spark2_5_plugin.spark2_5_tool_parser.schema import (
    MAX_GRAMMAR_SCHEMA_CHARS,
    MAX_PINNED_PROPERTIES,
    MAX_SCHEMA_DEPTH,
)
from vllm_spark2_5_plugin.spark2_5_tool_parser.values import (
    MAX_INTEGER_DIGITS,
    MAX_JSON_DEPTH,
    MAX_REF_HOPS,
    schema_types,
    value_json,
)

__all__ = [
    "MAX_GRAMMAR_SCHEMA_CHARS",
    "MAX_IDENTIFIER_CHARS",
    "MAX_INTEGER_DIGITS",
    "MAX_JSON_DEPTH",
    "MAX_PINNED_PROPERTIES",
    "MAX_REF_HOPS",
    "MAX_SCHEMA_DEPTH",
    "DeltaMessage",
    "Spark25ToolParser",
    "check_tools",
    "schema_types",
    "value_json",
]
