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

import importlib
import logging
import os
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from vllm_hust_bundle_kit import deferred
from vllm_spark2_5_plugin import OVERRIDE_ENV, compat, host_hooks

ARCHITECTURE = "Spark2_5ForCausalLM"
MODEL_TYPE = "spark2_5"
TOOL_PARSER_NAME = "spark25"
MODEL_TARGET = "vllm_spark2_5_plugin.spark2_5:Spark2_5ForCausalLM"
TOOL_PARSER_MODULE = "vllm_spark2_5_plugin.spark2_5_tool_parser"
TOOL_PARSER_CLASS = "Spark25ToolParser"

logger = logging.getLogger("vllm.spark2_5_plugin")


# The module whose import completes each registry the carrier writes to. vLLM's
# processes import only the registries they use (the tool-parser one in the API
# server alone); the carrier registers into each when it loads.
REGISTRY_MODULES = {
    "config": "vllm.transformers_utils.config",
    "model": "vllm.model_executor.models.registry",
    "tool_parser": "vllm.tool_parsers",
}


def registry_loaded(registry: str) -> bool:
    """Whether this process has imported vLLM's ``registry`` (a ``REGISTRY_MODULES`` key)."""
    return REGISTRY_MODULES[registry] in sys.modules


def when_registry_loads(registry: str, register: Callable[[], None]) -> None:
    """Run ``register`` right after this process imports vLLM's ``registry``, before
    anything uses it. ``register`` must not raise: it runs inside that import."""
    deferred.after_import((REGISTRY_MODULES[registry],), lambda _module: register())


def model_registry() -> Any:
    """vLLM's ``ModelRegistry``, from its own module: ``from vllm import ModelRegistry``
    fails while that module's package is still being imported."""
    return importlib.import_module(REGISTRY_MODULES["model"]).ModelRegistry


def registered_tool_parsers() -> set[str]:
    return set(compat.tool_parser_manager().list_registered())


def register_tool_parser(name: str, module_path: str, class_name: str) -> None:
    """Register a parser by import path so its module loads on first use only."""
    compat.tool_parser_manager().register_lazy_module(name, module_path, class_name)


# The environment of Ray actors.

RAY_EXTRA_ENV_VARS = "VLLM_RAY_EXTRA_ENV_VARS_TO_COPY"


def copy_to_ray_actors(names: Iterable[str]) -> list[str]:
    """Have vLLM copy ``names`` from this process into the Ray actors it starts; the
    names added (none where this vLLM has no such list).

    The V2 Ray executor (the default) copies the whole driver environment, filling
    in only what a node lacks. The older Ray executor (``VLLM_USE_RAY_V2_EXECUTOR_BACKEND=0``,
    0.23 to 0.32) and the data-parallel engine-core actors copy vLLM's own variables, a
    few prefixes and the names in ``VLLM_RAY_EXTRA_ENV_VARS_TO_COPY`` (0.23 to 0.33
    alike): the names are appended to that list, after the operator's own. Done
    when this process imports ``vllm.envs`` (right away where it has), which every
    process that starts Ray actors does first; the list returned is filled then.
    """
    wanted = tuple(dict.fromkeys(names))
    added: list[str] = []

    def extend(envs: Any) -> None:
        if RAY_EXTRA_ENV_VARS not in getattr(envs, "environment_variables", {}):
            return
        raw = os.environ.get(RAY_EXTRA_ENV_VARS, "")
        listed = [name.strip() for name in raw.split(",") if name.strip()]
        added.extend(name for name in wanted if name not in listed)
        if added:
            os.environ[RAY_EXTRA_ENV_VARS] = ",".join([*listed, *added])

    deferred.after_import(("vllm.envs",), extend)
    return added


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

    if report.claim(f"config:{MODEL_TYPE}", MODEL_TYPE in host_hooks.host_config_registry()):
        Spark2_5Config.folder_checks = (refuse_damaged_files,)
        host_hooks.register_config(MODEL_TYPE, Spark2_5Config)


def _register_model(report: RegistrationReport) -> None:
    registry = model_registry()
    if report.claim(f"model:{ARCHITECTURE}", ARCHITECTURE in registry.get_supported_archs()):
        registry.register_model(ARCHITECTURE, MODEL_TARGET)


def _register_tool_parser(report: RegistrationReport) -> None:
    parsers = registered_tool_parsers()
    if report.claim(f"tool_parser:{TOOL_PARSER_NAME}", TOOL_PARSER_NAME in parsers):
        register_tool_parser(TOOL_PARSER_NAME, TOOL_PARSER_MODULE, TOOL_PARSER_CLASS)
        host_hooks.keep_open_calls_before_content()


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
    report.copied_to_ray = copy_to_ray_actors(settings)
    for registry, item, register in REGISTRATIONS:
        if registry_loaded(registry):
            register(report)
        else:
            when_registry_loads(registry, _on_load(register, override))
            report.deferred.append(item)
    return report
