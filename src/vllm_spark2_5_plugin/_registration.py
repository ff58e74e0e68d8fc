# SPDX-License-Identifier: Apache-2.0
"""What the enabled carrier registers with vLLM (imported only once the switch is on).

Each piece goes into the vLLM registry that knows it: the config, the model
architecture and the tool parser. A registry this process has already imported
gets its piece right away (``vllm serve`` imports all three in every process
before it loads plugins); any other gets it the moment vLLM imports it, before
first use. The carrier itself never imports a registry, so enabling it costs a
process no import that vLLM would not make anyway.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from vllm_spark2_5_plugin import OVERRIDE_ENV, compat

ARCHITECTURE = "Spark2_5ForCausalLM"
MODEL_TYPE = "spark2_5"
TOOL_PARSER_NAME = "spark25"
MODEL_TARGET = "vllm_spark2_5_plugin.spark2_5:Spark2_5ForCausalLM"
TOOL_PARSER_MODULE = "vllm_spark2_5_plugin.spark2_5_tool_parser"
TOOL_PARSER_CLASS = "Spark25ToolParser"

logger = logging.getLogger("vllm.spark2_5_plugin")


@dataclass
class RegistrationReport:
    override: bool
    registered: list[str] = field(default_factory=list)
    stood_down: list[str] = field(default_factory=list)
    deferred: list[str] = field(default_factory=list)
    copied_to_ray: list[str] = field(default_factory=list)

    def claim(self, item: str, host_has_it: bool) -> bool:
        """Whether to register ``item``: not where vLLM has it, unless overridden."""
        if host_has_it and not self.override:
            self.stood_down.append(item)
            return False
        self.registered.append(item)
        return True

    def load_line_details(self) -> list[str]:
        details = [f"registered={','.join(self.registered) or 'nothing yet'}"]
        if self.deferred:
            details.append(
                f"deferred={','.join(self.deferred)} (registered when this process loads "
                "those vLLM registries)"
            )
        if self.stood_down:
            details.append(f"stood_down={','.join(self.stood_down)} ({_stand_down_reason()})")
        if self.copied_to_ray:
            details.append(f"ray_actors_copy={','.join(self.copied_to_ray)}")
        return details


def _stand_down_reason() -> str:
    return f"vLLM already provides them; set {OVERRIDE_ENV}=1 to use this carrier's"


def _register_config(report: RegistrationReport) -> None:
    from vllm_spark2_5_plugin.spark2_5_checkpoint import refuse_damaged_files
    from vllm_spark2_5_plugin.spark2_5_config import Spark2_5Config

    if report.claim(f"config:{MODEL_TYPE}", MODEL_TYPE in compat.host_config_registry()):
        Spark2_5Config.folder_checks = (refuse_damaged_files,)
        compat.register_config(MODEL_TYPE, Spark2_5Config)


def _register_model(report: RegistrationReport) -> None:
    registry = compat.model_registry()
    if report.claim(f"model:{ARCHITECTURE}", ARCHITECTURE in registry.get_supported_archs()):
        registry.register_model(ARCHITECTURE, MODEL_TARGET)


def _register_tool_parser(report: RegistrationReport) -> None:
    parsers = compat.registered_tool_parsers()
    if report.claim(f"tool_parser:{TOOL_PARSER_NAME}", TOOL_PARSER_NAME in parsers):
        compat.register_tool_parser(TOOL_PARSER_NAME, TOOL_PARSER_MODULE, TOOL_PARSER_CLASS)


REGISTRATIONS: tuple[tuple[str, str, Callable[[RegistrationReport], None]], ...] = (
    ("config", f"config:{MODEL_TYPE}", _register_config),
    ("model", f"model:{ARCHITECTURE}", _register_model),
    ("tool_parser", f"tool_parser:{TOOL_PARSER_NAME}", _register_tool_parser),
)


def _on_load(register: Callable[[RegistrationReport], None], override: bool) -> Callable[[], None]:
    """``register`` for when its registry loads later: it runs inside vLLM's import of
    that registry, so it logs what happens instead of raising into it."""

    def run() -> None:
        report = RegistrationReport(override)
        try:
            register(report)
        except Exception as exc:
            logger.error(
                "vllm-spark2_5-plugin failed to register %s (%s: %s); vLLM continues without it",
                register.__name__.removeprefix("_register_"),
                type(exc).__name__,
                exc,
            )
            return
        if report.stood_down:
            logger.info(
                "vllm-spark2_5-plugin: %s stood down (%s)",
                ",".join(report.stood_down),
                _stand_down_reason(),
            )

    return run


def register_enabled(override: bool, settings: Sequence[str] = ()) -> RegistrationReport:
    """Register the config, architecture and tool parser, each when its registry loads.

    Stands down where vLLM has an implementation, unless ``override``. A failure
    while registering into an already loaded registry raises (the entry point
    logs it); a later one is logged when it happens. ``settings`` (the carrier's
    variables set here) go to every Ray actor vLLM starts from this process, so
    the carrier is enabled, and configured, there too.
    """
    report = RegistrationReport(override)
    report.copied_to_ray = compat.copy_to_ray_actors(settings)
    for registry, item, register in REGISTRATIONS:
        if compat.registry_loaded(registry):
            register(report)
        else:
            compat.when_registry_loads(registry, _on_load(register, override))
            report.deferred.append(item)
    return report
