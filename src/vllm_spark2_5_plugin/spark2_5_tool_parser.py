"""Placeholder: the spark25 tool-call parser lands with the parser issue."""

from vllm_spark2_5_plugin.compat import tool_parser_base

ToolParser = tool_parser_base()


class Spark25ToolParser(ToolParser):
    def __init__(self, *args, **kwargs):
        raise NotImplementedError("the spark25 tool parser is not implemented yet in this build")
