"""Every vLLM version difference the carrier depends on, in one place.

The rest of the package is written as if there were one vLLM. Each helper here
detects a feature (an attribute, a module, a keyword) rather than comparing
version strings, so vLLM forks and CPU builds with other version schemes work.
"""

from __future__ import annotations

import importlib
from typing import Any


def _first_importable(*module_names: str) -> Any:
    errors = []
    for name in module_names:
        try:
            return importlib.import_module(name)
        except ImportError as exc:
            errors.append(f"{name}: {exc}")
    raise ImportError("none of these vLLM modules can be imported: " + "; ".join(errors))


# --- registries ---------------------------------------------------------------


def tool_parser_manager() -> Any:
    """``ToolParserManager`` (moved out of ``vllm.entrypoints.openai`` in Dec 2025)."""
    module = _first_importable(
        "vllm.tool_parsers.abstract_tool_parser",
        "vllm.entrypoints.openai.tool_parsers.abstract_tool_parser",
    )
    return module.ToolParserManager


def registered_tool_parsers() -> set[str]:
    manager = tool_parser_manager()
    if hasattr(manager, "list_registered"):
        return set(manager.list_registered())
    return set(manager.tool_parsers) | set(getattr(manager, "lazy_parsers", {}))


def register_tool_parser(name: str, module_path: str, class_name: str) -> None:
    """Register a parser by import path so its module loads on first use only."""
    manager = tool_parser_manager()
    if hasattr(manager, "register_lazy_module"):
        manager.register_lazy_module(name, module_path, class_name)
    else:  # releases without lazy registration
        parser_cls = getattr(importlib.import_module(module_path), class_name)
        manager.register_module(name=name, module=parser_cls)


def host_config_registry() -> dict[str, Any]:
    """vLLM's ``model_type -> config class`` table, consulted before remote code."""
    return importlib.import_module("vllm.transformers_utils.config")._CONFIG_REGISTRY


def register_config(model_type: str, config_cls: type) -> None:
    """Make ``model_type`` resolve to ``config_cls`` in vLLM and in transformers.

    An entry in vLLM's table also makes vLLM load the config without running
    the checkpoint's remote code, even when ``--trust-remote-code`` is given.
    """
    from transformers import AutoConfig

    host_config_registry()[model_type] = config_cls
    AutoConfig.register(model_type, config_cls, exist_ok=True)


def tool_parser_base() -> type:
    """The ``ToolParser`` base class every registered parser must subclass."""
    module = _first_importable(
        "vllm.tool_parsers.abstract_tool_parser",
        "vllm.entrypoints.openai.tool_parsers.abstract_tool_parser",
    )
    return module.ToolParser
