"""The toolkit's carrier entry point: one load line per process, and a WARNING
before it when the installed host is outside the carrier's verified range.

The host here is an installed distribution (``packaging``), judged by its real
metadata, so the check is the one a carrier makes of vLLM.
"""

from __future__ import annotations

import logging
from importlib.metadata import version

import pytest

from vllm_hust_bundle_kit.entry import carrier_entry_point
from vllm_hust_bundle_kit.switch import CarrierSwitch

HOST = "packaging"
INSTALLED = version(HOST)
MAJOR = int(INSTALLED.split(".")[0])


def enabled_register(host_range: str):
    switch = CarrierSwitch(
        bundle_id="org.example.ranged",
        enable_env="RANGED_CARRIER_ENABLE",
        override_env="RANGED_CARRIER_OVERRIDE",
        manager_may_enable=True,
        host_name=HOST,
        host_range=host_range,
    )
    return carrier_entry_point(
        name="ranged-carrier",
        logger_name="vllm.ranged_carrier",
        load_switch=lambda: switch,
        register_enabled=lambda decision: ["registered=model:Ranged"],
    )


def records(caplog, host_range: str, monkeypatch) -> list[logging.LogRecord]:
    monkeypatch.setenv("RANGED_CARRIER_ENABLE", "1")
    with caplog.at_level(logging.INFO, logger="vllm.ranged_carrier"):
        enabled_register(host_range)()
    return [r for r in caplog.records if r.name == "vllm.ranged_carrier"]


def test_inside_the_range_only_the_info_load_line(caplog, monkeypatch):
    (line,) = records(caplog, f">={MAJOR},<{MAJOR + 1}", monkeypatch)
    assert line.levelno == logging.INFO
    assert f"{HOST}={INSTALLED}" in line.getMessage()
    assert f"verified=>={MAJOR},<{MAJOR + 1}" in line.getMessage()
    assert "outside" not in line.getMessage()


@pytest.mark.parametrize("host_range", [f">={MAJOR + 1},<{MAJOR + 2}", f">=0.1,<{MAJOR}"])
def test_outside_the_range_a_warning_naming_it_and_the_check_then_the_load_line(
    caplog, monkeypatch, host_range
):
    warning, line = records(caplog, host_range, monkeypatch)
    assert warning.levelno == logging.WARNING
    message = warning.getMessage()
    assert f"{HOST} {INSTALLED} is outside the verified range {host_range}" in message
    assert "vllm-hust-bundle inspect org.example.ranged" in message
    # Not refused: the carrier registers and says so in its one INFO load line.
    assert line.levelno == logging.INFO
    assert "enabled=1" in line.getMessage() and "registered=model:Ranged" in line.getMessage()
    assert f"verified={host_range} (outside it)" in line.getMessage()
