"""The host behaviour behind the carrier's finite keys/values guard, on in-tree Llama
alone (``spark2_5_dev.stale_kv``): while vLLM's CPU attention reads the stale slots
of reused KV-cache blocks, one request's NaN values change a later plain request's
tokens. When this stops holding, the guard
(``cpu_platform.attention_reads_stale_kv_slots``) can turn off for that release."""

from __future__ import annotations

import pytest

from spark2_5_dev.drivers import run_driver


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return run_driver("spark2_5_dev.stale_kv", [], tmp_path_factory.mktemp("stale-kv"), 600)


def test_a_nan_adapter_request_changes_a_later_plain_request_on_in_tree_llama(result):
    from vllm_spark2_5_plugin import cpu_platform

    assert cpu_platform.attention_reads_stale_kv_slots()
    assert result["changed"], (
        "vLLM's CPU attention no longer carries one request's NaN into another's "
        f"output ({result}): cpu_platform.attention_reads_stale_kv_slots can be off here"
    )
