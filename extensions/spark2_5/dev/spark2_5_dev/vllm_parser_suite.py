"""``spark25`` in vLLM's own shared tool-parser tests (``ToolParserTests`` of vLLM's
``tests/tool_parsers/common_tests.py``).

Not collected by this project's suite: ``test_tool_parser_vllm_suite.py`` copies it
into the ``tests/tool_parsers/`` of the installed release's source distribution and
runs it there with pytest, the way vLLM runs the suite for its in-tree parsers.
The parser is made with its tools declared (vLLM's serving layer makes it with the
request's), on the project's tiny tokenizer, whose call tags are special tokens as
in the real one.
"""

from pathlib import Path

import pytest
from tests.tool_parsers.common_tests import ToolParserTestConfig, ToolParserTests
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionToolsParam
from vllm.tokenizers import get_tokenizer
from vllm.tool_parsers import ToolParserManager

import vllm_spark2_5_plugin._registration as registration

# The project's tokenizer, written beside this module where it runs.
TOKENIZER = Path(__file__).with_name("spark25_tokenizer")


def call(name, **pairs):
    body = "".join(f"<arg_key>{k}</arg_key><arg_value>{v}</arg_value>" for k, v in pairs.items())
    return f"<tool_call>{name}{body}</tool_call>"


def tool(name, properties):
    parameters = {"type": "object", "properties": properties}
    return {"type": "function", "function": {"name": name, "parameters": parameters}}


TYPES = {
    "string_field": {"type": "string"},
    "int_field": {"type": "integer"},
    "float_field": {"type": "number"},
    "bool_field": {"type": "boolean"},
    "null_field": {"type": ["string", "null"]},
    "array_field": {"type": "array"},
    "object_field": {"type": "object"},
}
TOOLS = [
    tool("get_weather", {"city": {"type": "string"}, "days": {"type": "integer"}}),
    tool("get_time", {"timezone": {"type": "string"}}),
    tool("typed", TYPES),
    tool("ping", {}),
    tool("echo", {"text": {"type": "string"}}),
]
CONFIG = ToolParserTestConfig(
    parser_name=registration.TOOL_PARSER_NAME,
    no_tool_calls_output="The weather in Tokyo is sunny today.",
    single_tool_call_output=call("get_weather", city="Tokyo"),
    parallel_tool_calls_output=call("get_weather", city="Tokyo")
    + "\n"
    + call("get_time", timezone="Asia/Tokyo"),
    various_data_types_output=call(
        "typed",
        string_field="hello",
        int_field="42",
        float_field="3.5",
        bool_field="true",
        null_field="null",
        array_field='["a", 1]',
        object_field='{"k": "v"}',
    ),
    empty_arguments_output=call("ping"),
    surrounding_text_output="Let me check. " + call("get_weather", city="Oslo") + " Done.",
    escaped_strings_output=call("echo", text='He said "hi" \\ then\nleft'),
    malformed_input_outputs=[
        "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Tok",
        "<tool_call>",
        "</tool_call> stray",
        "<tool_call>no_such_tool<arg_key>x</arg_key><arg_value>1</arg_value></tool_call>",
        "<arg_key>city</arg_key><arg_value>Paris</arg_value>",
        call("get_weather", city="Paris") + "<tool_call>get_time",
    ],
)


class TestSpark25ToolParser(ToolParserTests):
    @pytest.fixture
    def test_config(self):
        return CONFIG

    @pytest.fixture
    def tokenizer(self):
        return get_tokenizer(str(TOKENIZER))

    @pytest.fixture
    def tool_parser(self, test_config, tokenizer):
        registration.register_tool_parser(
            registration.TOOL_PARSER_NAME,
            registration.TOOL_PARSER_MODULE,
            registration.TOOL_PARSER_CLASS,
        )
        tools = [ChatCompletionToolsParam(**declared) for declared in TOOLS]
        return ToolParserManager.get_tool_parser(test_config.parser_name)(tokenizer, tools)
