"""Drift guard: every model interface vLLM's in-tree Llama and Qwen3 implement on the
running release, Spark2_5ForCausalLM implements too, or the carrier card names it in
its "model interfaces" row with the reason. A new vLLM release that gives in-tree
models a new interface fails here until the carrier has it or says why not."""

from __future__ import annotations

import inspect
import re

from carrier_harness.project import PROJECT_ROOT

CARD = PROJECT_ROOT / "extensions" / "spark2_5" / "README.md"
FLAG_PREFIXES = ("supports_", "has_", "is_")


def interface_flags() -> set[str]:
    """The ``supports_*``/``has_*``/``is_*`` flags vLLM's interface classes set to True."""
    from vllm.model_executor.models import interfaces

    return {
        attr
        for cls in vars(interfaces).values()
        if inspect.isclass(cls) and cls.__module__ == interfaces.__name__
        for attr, value in vars(cls).items()
        if value is True and attr.startswith(FLAG_PREFIXES)
    }


def implemented(model_cls: type, flags: set[str]) -> set[str]:
    from vllm.model_executor.models.interfaces import SupportsQuant

    quant = {"SupportsQuant"} if issubclass(model_cls, SupportsQuant) else set()
    return {flag for flag in flags if getattr(model_cls, flag, False) is True} | quant


def documented_gaps() -> set[str]:
    (row,) = [
        line for line in CARD.read_text().splitlines() if line.startswith("| model interfaces |")
    ]
    return set(re.findall(r"`(\w+)`", row))


def test_spark2_5_has_every_interface_of_in_tree_llama_and_qwen3_or_the_card_says_why():
    from vllm.model_executor.models.llama import LlamaForCausalLM
    from vllm.model_executor.models.qwen3 import Qwen3ForCausalLM

    from vllm_spark2_5_plugin.spark2_5 import Spark2_5ForCausalLM

    flags = interface_flags()
    assert {"supports_lora", "supports_pp"} <= flags  # the scan still finds vLLM's flags
    ours = implemented(Spark2_5ForCausalLM, flags)
    gaps = set().union(
        *(implemented(m, flags) - ours for m in (LlamaForCausalLM, Qwen3ForCausalLM))
    )
    documented = documented_gaps()
    assert gaps <= documented, (
        f"in-tree models implement {sorted(gaps - documented)}: add or document"
    )
    # A gap that was filled leaves the card.
    stale = documented & ours
    assert not stale, f"the card names {sorted(stale)} as missing, but Spark2_5 has them"
