"""The tools the Spark2_5 tests declare: defined once, varied explicitly where a test needs it."""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any


def function_tool(
    name: str, description: str, properties: dict[str, Any], required: Iterable[str] = ()
) -> dict[str, Any]:
    """A Chat Completions function tool."""
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": properties,
                "required": list(required),
            },
        },
    }


def with_parameters(
    tool: dict[str, Any], properties: dict[str, Any], required: Iterable[str] = (), **function: Any
) -> dict[str, Any]:
    """``tool`` (same name and description) with other parameters, and ``function`` keys
    (e.g. ``strict=True``) set."""
    varied = copy.deepcopy(tool)
    varied["function"]["parameters"].update(properties=properties, required=list(required))
    varied["function"].update(function)
    return varied


# The tools the trained fixture learned to call (spark2_5_dev.fixture).
WEATHER_TOOL = function_tool(
    "get_weather",
    "Weather forecast for a city.",
    {
        "city": {"type": "string", "description": "City name"},
        "days": {"type": "integer", "description": "Number of days"},
    },
    required=("city", "days"),
)
TIME_TOOL = function_tool(
    "get_time",
    "Current local time in a timezone.",
    {"timezone": {"type": "string"}},
    required=("timezone",),
)
