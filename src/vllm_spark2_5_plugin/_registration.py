"""What the enabled carrier registers with vLLM (imported only after the gate)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from importlib import resources

from vllm_spark2_5_plugin import compat

ARCHITECTURE = "Spark2_5ForCausalLM"
MODEL_TYPE = "spark2_5"
TOOL_PARSER_NAME = "spark25"
MODEL_TARGET = "vllm_spark2_5_plugin.spark2_5:Spark2_5ForCausalLM"
TOOL_PARSER_MODULE = "vllm_spark2_5_plugin.spark2_5_tool_parser"
TOOL_PARSER_CLASS = "Spark25ToolParser"
MANIFEST_PACKAGE = "vllm_spark2_5_plugin.bundles.spark2_5"
MANIFEST_NAME = "vllm-hust-extension-v0.2.json"


@dataclass
class RegistrationReport:
    registered: list[str] = field(default_factory=list)
    stood_down: list[str] = field(default_factory=list)


def verified_host_range() -> str:
    """The vLLM range this release was verified on, from the rendered manifest."""
    manifest = resources.files(MANIFEST_PACKAGE).joinpath(MANIFEST_NAME)
    try:
        return json.loads(manifest.read_text(encoding="utf-8"))["host"]["version_range"]
    except (OSError, ValueError, KeyError):
        return "unknown (manifest not rendered)"


def register_enabled(override: bool) -> RegistrationReport:
    """Register config, architecture and tool parser; stand down where vLLM has them.

    ``override`` replaces an in-tree implementation instead of standing down.
    """
    from vllm import ModelRegistry

    from vllm_spark2_5_plugin.spark2_5_config import Spark2_5Config

    report = RegistrationReport()

    def claim(item: str, host_has_it: bool) -> bool:
        if host_has_it and not override:
            report.stood_down.append(item)
            return False
        report.registered.append(item)
        return True

    if claim(f"config:{MODEL_TYPE}", MODEL_TYPE in compat.host_config_registry()):
        compat.register_config(MODEL_TYPE, Spark2_5Config)
    if claim(f"model:{ARCHITECTURE}", ARCHITECTURE in ModelRegistry.get_supported_archs()):
        ModelRegistry.register_model(ARCHITECTURE, MODEL_TARGET)
    if claim(
        f"tool_parser:{TOOL_PARSER_NAME}", TOOL_PARSER_NAME in compat.registered_tool_parsers()
    ):
        compat.register_tool_parser(TOOL_PARSER_NAME, TOOL_PARSER_MODULE, TOOL_PARSER_CLASS)
    return report
