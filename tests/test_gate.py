"""Unit tests of the activation gate (pure environment parsing)."""

import pytest

from vllm_spark2_5_plugin._gate import (
    BUNDLE_ID,
    ENABLE_ENV,
    ENABLED_BUNDLES_ENVS,
    OVERRIDE_ENV,
    decide,
)


def test_unset_disables_without_warning():
    decision = decide({})
    assert not decision.enabled
    assert decision.warnings == ()


def test_exactly_one_enables():
    decision = decide({ENABLE_ENV: "1"})
    assert decision.enabled
    assert decision.source == f"{ENABLE_ENV}=1"
    assert decision.warnings == ()


def test_zero_disables_without_warning():
    decision = decide({ENABLE_ENV: "0"})
    assert not decision.enabled
    assert decision.warnings == ()


@pytest.mark.parametrize("value", ["true", " 1", "1 ", "yes", "on", "2", "", "garbage"])
def test_other_values_disable_and_warn_once(value):
    decision = decide({ENABLE_ENV: value})
    assert not decision.enabled
    assert len(decision.warnings) == 1
    warning = decision.warnings[0]
    assert ENABLE_ENV in warning
    assert repr(value) in warning
    assert f"{ENABLE_ENV}=1" in warning and f"{ENABLE_ENV}=0" in warning


@pytest.mark.parametrize("variable", ENABLED_BUNDLES_ENVS)
@pytest.mark.parametrize(
    "listing",
    [BUNDLE_ID, f"org.example.other,{BUNDLE_ID}", f" {BUNDLE_ID} , org.example.other"],
)
def test_bundle_listing_enables(variable, listing):
    decision = decide({variable: listing})
    assert decision.enabled
    assert variable in decision.source


@pytest.mark.parametrize(
    "listing", ["", "org.example.other", f"{BUNDLE_ID}.extra", "org.vllm-hust"]
)
def test_bundle_listing_needs_the_exact_id(listing):
    assert not decide({ENABLED_BUNDLES_ENVS[0]: listing}).enabled


def test_explicit_zero_beats_bundle_listing():
    assert not decide({ENABLE_ENV: "0", ENABLED_BUNDLES_ENVS[0]: BUNDLE_ID}).enabled


def test_invalid_value_beats_bundle_listing_and_warns():
    decision = decide({ENABLE_ENV: "yes", ENABLED_BUNDLES_ENVS[0]: BUNDLE_ID})
    assert not decision.enabled
    assert len(decision.warnings) == 1


@pytest.mark.parametrize("value", ["1", "true", "YES", "on"])
def test_override_accepts_seed_values(value):
    assert decide({ENABLE_ENV: "1", OVERRIDE_ENV: value}).override


@pytest.mark.parametrize("value", ["0", "false", "no", "off", ""])
def test_override_off_values(value):
    decision = decide({ENABLE_ENV: "1", OVERRIDE_ENV: value})
    assert not decision.override
    assert decision.warnings == ()


def test_unknown_override_value_warns_and_is_off():
    decision = decide({ENABLE_ENV: "1", OVERRIDE_ENV: "please"})
    assert decision.enabled and not decision.override
    assert len(decision.warnings) == 1
    assert OVERRIDE_ENV in decision.warnings[0] and "'please'" in decision.warnings[0]


def test_reads_process_environment_by_default(monkeypatch):
    monkeypatch.setenv(ENABLE_ENV, "1")
    assert decide().enabled
    monkeypatch.delenv(ENABLE_ENV)
    assert not decide().enabled
