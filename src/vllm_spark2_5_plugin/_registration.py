"""What the enabled carrier registers with vLLM (imported only after the gate)."""

from __future__ import annotations

from dataclasses import dataclass, field

from vllm_spark2_5_plugin import OVERRIDE_ENV, compat

ARCHITECTURE = "Spark2_5ForCausalLM"
MODEL_TYPE = "spark2_5"
TOOL_PARSER_NAME = "spark25"
MODEL_TARGET = "vllm_spark2_5_plugin.spark2_5:Spark2_5ForCausalLM"
TOOL_PARSER_MODULE = "vllm_spark2_5_plugin.spark2_5_tool_parser"
TOOL_PARSER_CLASS = "Spark25ToolParser"


@dataclass
class RegistrationReport:
    registered: list[str] = field(default_factory=list)
    stood_down: list[str] = field(default_factory=list)
    deferred: list[str] = field(default_factory=list)

    def claim(self, item: str, host_has_it: bool, override: bool) -> bool:
        """Whether to register ``item``: not where vLLM has it, unless overridden."""
        if host_has_it and not override:
            self.stood_down.append(item)
            return False
        self.registered.append(item)
        return True

    def load_line_details(self) -> list[str]:
        details = [f"registered={','.join(self.registered) or 'nothing'}"]
        if self.deferred:
            details.append(
                f"deferred={','.join(self.deferred)} (registered if this process loads "
                "vLLM's tool parsers)"
            )
        if self.stood_down:
            details.append(
                f"stood_down={','.join(self.stood_down)} (vLLM already provides them; "
                f"set {OVERRIDE_ENV}=1 to use this carrier's)"
            )
        return details


def register_enabled(override: bool) -> RegistrationReport:
    """Register config and architecture now; the tool parser where it is used.

    Stands down where vLLM has an implementation, unless ``override``. The tool
    parser registry is imported only by the processes that parse tool calls (the
    API server), so the parser is registered when that registry loads, not here:
    engine and worker processes never pay for importing it.
    """
    from vllm import ModelRegistry

    from vllm_spark2_5_plugin.spark2_5_config import Spark2_5Config

    report = RegistrationReport()
    if report.claim(f"config:{MODEL_TYPE}", MODEL_TYPE in compat.host_config_registry(), override):
        compat.register_config(MODEL_TYPE, Spark2_5Config)
    if report.claim(
        f"model:{ARCHITECTURE}", ARCHITECTURE in ModelRegistry.get_supported_archs(), override
    ):
        ModelRegistry.register_model(ARCHITECTURE, MODEL_TARGET)

    parser = f"tool_parser:{TOOL_PARSER_NAME}"
    waiting = RegistrationReport()

    def register_parser() -> None:
        if waiting.claim(parser, TOOL_PARSER_NAME in compat.registered_tool_parsers(), override):
            compat.register_tool_parser(TOOL_PARSER_NAME, TOOL_PARSER_MODULE, TOOL_PARSER_CLASS)

    if compat.when_tool_parsers_load(register_parser):
        report.registered += waiting.registered
        report.stood_down += waiting.stood_down
    else:
        report.deferred.append(parser)
    return report
