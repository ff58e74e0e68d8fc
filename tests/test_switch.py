"""The carrier switch (vllm_hust_bundle_kit.switch): environment in, decision out.

Driven with a throwaway bundle package written by the test, so the switch is
checked as the toolkit ships it, for any carrier.
"""

from __future__ import annotations

import json
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_hust_bundle_kit.contract import ENABLED_BUNDLES_ENVS, PLUGINS_ENV, RENDERED_FILENAME
from vllm_hust_bundle_kit.switch import (
    MAX_ECHOED_CHARS,
    OFF_VALUES,
    ON_VALUES,
    CarrierSwitch,
    SwitchError,
)

BUNDLE_ID = "org.example.switched"
ENABLE_ENV = "SWITCHED_CARRIER_ENABLE"
OVERRIDE_ENV = "SWITCHED_CARRIER_OVERRIDE"
CARRIER = "switched_carrier:register"


def manifest(status: str = "active", environment: dict | None = None) -> dict:
    return {
        "extension_id": BUNDLE_ID,
        "host": {"provider": "vllm", "name": "vllm", "version_range": ">=0.1,<0.2"},
        "implementation": [
            {
                "type": "python_module",
                "module": "switched_carrier",
                "object": "register",
                "status": status,
            }
        ],
        "activation": {"environment": environment or {ENABLE_ENV: "1"}},
    }


def write_bundle_package(root, name: str, document) -> str:
    package = root / name
    package.mkdir()
    (package / "__init__.py").write_text("")
    text = document if isinstance(document, str) else json.dumps(document)
    (package / RENDERED_FILENAME).write_text(text)
    return name


@pytest.fixture
def bundle_package(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))

    def make(document) -> str:
        # A fresh package name per test: imported packages stay in sys.modules.
        return write_bundle_package(tmp_path, f"switched_bundle_{uuid.uuid4().hex}", document)

    return make


@pytest.fixture
def switch(bundle_package) -> CarrierSwitch:
    return CarrierSwitch.from_bundle_package(bundle_package(manifest()), CARRIER, OVERRIDE_ENV)


def test_the_manifest_names_the_bundle_the_switch_and_the_range(switch):
    assert (switch.bundle_id, switch.enable_env, switch.override_env) == (
        BUNDLE_ID,
        ENABLE_ENV,
        OVERRIDE_ENV,
    )
    assert switch.manager_may_enable
    assert (switch.host_name, switch.host_range) == ("vllm", ">=0.1,<0.2")


def test_unset_disables_without_warning(switch):
    decision = switch.decide({})
    assert not decision.enabled
    assert decision.warnings == ()


@pytest.mark.parametrize("value", [*ON_VALUES, "TRUE", " 1 ", "Yes\n"])
def test_on_values_enable(switch, value):
    decision = switch.decide({ENABLE_ENV: value})
    assert decision.enabled and decision.warnings == ()
    assert decision.source == f"{ENABLE_ENV}={value.strip().lower()}"


@pytest.mark.parametrize("value", [*OFF_VALUES, "FALSE", " 0"])
def test_off_values_disable_even_when_the_manager_lists_the_bundle(switch, value):
    decision = switch.decide({ENABLE_ENV: value, ENABLED_BUNDLES_ENVS[0]: BUNDLE_ID})
    assert not decision.enabled and decision.warnings == ()


@pytest.mark.parametrize("value", ["", "   "])
def test_an_empty_value_is_unset_so_the_bundle_list_decides(switch, value):
    assert not switch.decide({ENABLE_ENV: value}).enabled
    listed = switch.decide({ENABLE_ENV: value, ENABLED_BUNDLES_ENVS[0]: BUNDLE_ID})
    assert listed.enabled and listed.warnings == ()


@pytest.mark.parametrize("value", ["2", "enable", "garbage", "1 1"])
def test_other_values_disable_and_warn_once_even_when_listed(switch, value):
    decision = switch.decide({ENABLE_ENV: value, ENABLED_BUNDLES_ENVS[0]: BUNDLE_ID})
    assert not decision.enabled
    (warning,) = decision.warnings
    assert ENABLE_ENV in warning and repr(value) in warning
    assert "1, true, yes, on" in warning and "0, false, no, off" in warning


def test_the_warning_echoes_a_bounded_part_of_a_huge_value(switch):
    value = "x" * 100_000
    (warning,) = switch.decide({ENABLE_ENV: value}).warnings
    assert len(warning) < MAX_ECHOED_CHARS + 300
    assert "(100000 characters)" in warning


@pytest.mark.parametrize("variable", ENABLED_BUNDLES_ENVS)
@pytest.mark.parametrize(
    "listing", [BUNDLE_ID, f"org.example.other,{BUNDLE_ID}", f" {BUNDLE_ID} , org.example.other"]
)
def test_bundle_listing_enables(switch, variable, listing):
    decision = switch.decide({variable: listing})
    assert decision.enabled
    assert variable in decision.source


@pytest.mark.parametrize("listing", ["", "org.example.other", f"{BUNDLE_ID}.extra", "org.example"])
def test_bundle_listing_needs_the_exact_id(switch, listing):
    assert not switch.decide({ENABLED_BUNDLES_ENVS[0]: listing}).enabled


@pytest.mark.parametrize("status", ["import_only", "legacy_unregistered"])
def test_a_listing_does_not_enable_a_carrier_the_manager_may_not_enable(bundle_package, status):
    """The manager's `extension env` lists an enabled import_only bundle, and its plugin in
    VLLM_PLUGINS, without injecting its switch: the carrier's own manifest says no; only
    the switch by hand enables it."""
    switch = CarrierSwitch.from_bundle_package(
        bundle_package(manifest(status=status)), CARRIER, OVERRIDE_ENV
    )
    listed = switch.decide({ENABLED_BUNDLES_ENVS[0]: BUNDLE_ID, PLUGINS_ENV: "ascend,spark2_5"})
    assert not listed.enabled
    assert f"set {ENABLE_ENV}=1 to enable it by hand" in listed.source
    assert switch.decide({ENABLE_ENV: "1"}).enabled


@pytest.mark.parametrize("value", ["1", "true", "YES", "on"])
def test_override_on_values(switch, value):
    assert switch.decide({ENABLE_ENV: "1", OVERRIDE_ENV: value}).override


@pytest.mark.parametrize("value", ["0", "false", "no", "off", ""])
def test_override_off_values(switch, value):
    decision = switch.decide({ENABLE_ENV: "1", OVERRIDE_ENV: value})
    assert not decision.override
    assert decision.warnings == ()


def test_unknown_override_value_warns_and_is_off(switch):
    decision = switch.decide({ENABLE_ENV: "1", OVERRIDE_ENV: "please"})
    assert decision.enabled and not decision.override
    (warning,) = decision.warnings
    assert OVERRIDE_ENV in warning and "'please'" in warning
    assert decision.source == f"{ENABLE_ENV}=1"


def test_reads_process_environment_by_default(switch, monkeypatch):
    monkeypatch.setenv(ENABLE_ENV, "1")
    assert switch.decide().enabled
    monkeypatch.delenv(ENABLE_ENV)
    assert not switch.decide().enabled


@settings(max_examples=300, deadline=None)
@given(
    enable=st.none() | st.text(max_size=200),
    override=st.none() | st.text(max_size=200),
    listing=st.none() | st.text(max_size=200),
)
def test_any_environment_gives_a_decision_never_an_exception(enable, override, listing):
    switch = CarrierSwitch(BUNDLE_ID, ENABLE_ENV, OVERRIDE_ENV, True, "vllm", ">=0.1,<0.2")
    env = {
        name: value
        for name, value in ((ENABLE_ENV, enable), (OVERRIDE_ENV, override))
        if value is not None and "\0" not in value
    }
    if listing is not None:
        env[ENABLED_BUNDLES_ENVS[0]] = listing
    decision = switch.decide(env)
    token = (enable or "").strip().lower()
    if token in ON_VALUES:
        assert decision.enabled
    elif token and token not in ON_VALUES:
        assert not decision.enabled  # off, or not understood: never on
    assert all(len(warning) < 400 for warning in decision.warnings)


BROKEN_MANIFESTS = {
    "not-json": "{",
    "not-an-object": "[]",
    "no-implementation": {"extension_id": BUNDLE_ID, "host": {}},
    "carrier-missing": {
        **manifest(),
        "implementation": [
            {"type": "python_module", "module": "other", "object": "register", "status": "active"}
        ],
    },
    "two-switches": manifest(environment={ENABLE_ENV: "1", "OTHER_SWITCH": "1"}),
    "no-switch": manifest(environment={"SOME_SETTING": "fast"}),
    "deep": "[" * 100_000,
}


@pytest.mark.parametrize("document", BROKEN_MANIFESTS.values(), ids=BROKEN_MANIFESTS)
def test_a_broken_manifest_is_one_switch_error(bundle_package, document):
    with pytest.raises(SwitchError) as error:
        CarrierSwitch.from_bundle_package(bundle_package(document), CARRIER, OVERRIDE_ENV)
    assert "switched_bundle" in str(error.value)


def test_a_missing_package_is_a_switch_error():
    with pytest.raises(SwitchError, match="no_such_bundle_package"):
        CarrierSwitch.from_bundle_package("no_such_bundle_package", CARRIER, OVERRIDE_ENV)


def test_the_switch_and_the_list_together_credit_the_manager(switch):
    """`vllm-hust-ext run` injects both; the load line names the bundle list."""
    decision = switch.decide({ENABLE_ENV: "1", ENABLED_BUNDLES_ENVS[0]: BUNDLE_ID})
    assert decision.enabled
    assert decision.source == f"{ENABLED_BUNDLES_ENVS[0]} lists {BUNDLE_ID}"
    assert switch.decide({ENABLE_ENV: "1"}).source == f"{ENABLE_ENV}=1"
    off = switch.decide({ENABLE_ENV: "0", ENABLED_BUNDLES_ENVS[0]: BUNDLE_ID})
    assert (off.enabled, off.source) == (False, f"{ENABLE_ENV}=0")


def test_the_settings_that_reach_other_processes_are_the_carriers_own(switch):
    prefix = ENABLE_ENV.rpartition("_")[0]
    environ = {
        ENABLE_ENV: "1",
        ENABLED_BUNDLES_ENVS[1]: BUNDLE_ID,
        f"{prefix}_SOME_SETTING": "x",
        f"{prefix}X_OTHER": "y",  # another prefix
        "PATH": "/bin",
    }
    assert switch.settings_in(environ) == tuple(
        sorted((ENABLE_ENV, ENABLED_BUNDLES_ENVS[1], f"{prefix}_SOME_SETTING"))
    )
