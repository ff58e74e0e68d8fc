"""Hostile ``config.json`` files: each bad one is exactly one ``Spark2_5ConfigError``
naming the key, the value and the fix, raised when the config loads.

Configs are loaded the way vLLM loads them (``from_pretrained`` on a folder, or
``from_dict``, which ``from_pretrained`` ends in), starting from the released
4B's ``config.json``.
"""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spark2_5_dev.checkpoints import build_spark2_5_checkpoint
from spark2_5_dev.model_building import build_model, vllm_model_env
from spark2_5_dev.spark_x25_4b import SPARK_X25_4B_CONFIG
from vllm_spark2_5_plugin import spark2_5_config
from vllm_spark2_5_plugin.spark2_5_config import (
    FULL_ATTENTION,
    SLIDING_ATTENTION,
    Spark2_5Config,
    Spark2_5ConfigError,
)

__all__ = ["vllm_model_env"]  # the fixture, for pytest

FOUR_B_ROPE = {
    layer_type: {
        "rope_theta": entry["rope_theta"],
        "partial_rotary_factor": entry["partial_rotary_factor"],
    }
    for layer_type, entry in SPARK_X25_4B_CONFIG["rope_parameters"].items()
}


def four_b(**overrides):
    """A fresh copy of the released 4B's config.json with ``overrides`` applied."""
    return {**json.loads(json.dumps(SPARK_X25_4B_CONFIG)), **overrides}


def load(config_dict, tmp_path=None):
    """The config as vLLM gets it: ``from_pretrained`` on a folder when ``tmp_path``
    is given, else ``from_dict`` (what ``from_pretrained`` calls)."""
    if tmp_path is None:
        return Spark2_5Config.from_dict(config_dict)
    (tmp_path / "config.json").write_text(json.dumps(config_dict))
    return Spark2_5Config.from_pretrained(tmp_path)


def refused(config_dict, tmp_path=None) -> Spark2_5ConfigError:
    with pytest.raises(Spark2_5ConfigError) as error:
        load(config_dict, tmp_path)
    return error.value


def rope_of(config):
    return {layer_type: config.rope_parameters_for(layer_type) for layer_type in FOUR_B_ROPE}


def assert_names(error: Spark2_5ConfigError, key: str, *fix: str) -> None:
    message = str(error)
    assert error.key == key
    assert message.startswith(f"Spark2_5 config: {key}={error.value!r} is invalid; ")
    for words in fix:
        assert words in message


# --- 6. rope_parameters holds one object per layer type, nothing else -------------


@pytest.mark.parametrize("stray", [1e4, "x", None, [1], {"rope_theta": 1e4}])
def test_a_stray_key_next_to_the_layer_types_is_refused(tmp_path, stray):
    rope = {**SPARK_X25_4B_CONFIG["rope_parameters"], "rope_theta": stray}
    error = refused(four_b(rope_parameters=rope), tmp_path)
    assert_names(error, "rope_parameters['rope_theta']", "keyed by layer type")


def test_an_entry_of_an_unused_layer_type_must_still_be_an_object(tmp_path):
    config = four_b(
        num_hidden_layers=2,
        layer_types=[SLIDING_ATTENTION] * 2,
        rope_parameters={SLIDING_ATTENTION: {"rope_theta": 1e4}, FULL_ATTENTION: 5},
    )
    assert_names(refused(config, tmp_path), "rope_parameters['full_attention']", "an object")


def test_an_unknown_key_inside_an_entry_is_refused_not_ignored(tmp_path):
    rope = json.loads(json.dumps(SPARK_X25_4B_CONFIG["rope_parameters"]))
    rope[FULL_ATTENTION]["factor"] = 8.0
    error = refused(four_b(rope_parameters=rope), tmp_path)
    assert_names(error, "rope_parameters['full_attention']['factor']", "rope_theta")


# --- 7./8. rope_scaling: null is no scaling, anything else is refused -----------------


@pytest.mark.parametrize("no_scaling", [None, {}])
def test_rope_scaling_null_means_no_scaling(tmp_path, no_scaling):
    config = load(four_b(rope_scaling=no_scaling), tmp_path)
    assert rope_of(config) == FOUR_B_ROPE
    assert set(config.rope_parameters) == set(FOUR_B_ROPE)


@pytest.mark.parametrize(
    "scaling",
    [
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 262144},
        {"type": "linear", "factor": 2.0},
        {"rope_type": "default"},
        {FULL_ATTENTION: {"rope_theta": 5e6}, SLIDING_ATTENTION: {"rope_theta": 1e4}},
        "yarn",
        1,
    ],
)
def test_rope_scaling_is_refused_with_the_reason(tmp_path, scaling):
    error = refused(four_b(rope_scaling=scaling), tmp_path)
    assert_names(error, "rope_scaling", "null", "rope_parameters")


@pytest.mark.usefixtures("vllm_model_env")
def test_vllm_builds_the_model_of_a_config_with_rope_scaling_null(tmp_path):
    """The reported failure: accepted, then ``None[layer_type]`` while vLLM built the model."""
    checkpoint = build_spark2_5_checkpoint(tmp_path, rope_scaling=None)
    assert json.loads((checkpoint / "config.json").read_text())["rope_scaling"] is None
    model = build_model(checkpoint)
    config = model.config
    for layer_type, layer in zip(config.layer_types, model.model.layers, strict=True):
        rope = config.rope_parameters_for(layer_type)
        assert layer.self_attn.rotary_emb.base == rope["rope_theta"]
        assert layer.self_attn.rotary_emb.rotary_dim == int(32 * rope["partial_rotary_factor"])


# --- 9. legacy top-level rope_theta / partial_rotary_factor ---------------------------


@pytest.mark.usefixtures("vllm_model_env")
def test_vllm_rotates_with_a_top_level_rope_theta_where_it_applies(tmp_path):
    rope = {
        FULL_ATTENTION: {"rope_theta": 5e6, "partial_rotary_factor": 0.25},
        SLIDING_ATTENTION: {},
    }
    checkpoint = build_spark2_5_checkpoint(tmp_path, rope_parameters=rope, rope_theta=123)
    model = build_model(checkpoint)
    bases = {
        layer_type: layer.self_attn.rotary_emb.base
        for layer_type, layer in zip(model.config.layer_types, model.model.layers, strict=True)
    }
    assert bases == {SLIDING_ATTENTION: 123, FULL_ATTENTION: 5e6}


@pytest.mark.parametrize(("key", "value"), [("rope_theta", 123), ("partial_rotary_factor", 0.5)])
def test_a_top_level_rope_key_fills_the_entries_that_lack_it(tmp_path, key, value):
    rope = {
        FULL_ATTENTION: {"rope_theta": 5e6, "partial_rotary_factor": 0.25},
        SLIDING_ATTENTION: {},
    }
    config = load(four_b(rope_parameters=rope, **{key: value}), tmp_path)
    assert config.rope_parameters_for(SLIDING_ATTENTION)[key] == value
    assert config.rope_parameters_for(FULL_ATTENTION) == {
        "rope_theta": 5e6,
        "partial_rotary_factor": 0.25,
    }
    assert key not in config.to_dict()  # moved into the entries, not kept twice
    saved = tmp_path / "saved"
    config.save_pretrained(saved)
    assert rope_of(Spark2_5Config.from_pretrained(saved)) == rope_of(config)


@pytest.mark.parametrize(("key", "value"), [("rope_theta", 123), ("partial_rotary_factor", 0.5)])
@pytest.mark.parametrize("rope_parameters", ["4b", "absent"])
def test_a_top_level_rope_key_that_would_be_ignored_is_refused(
    tmp_path, key, value, rope_parameters
):
    config = four_b(**{key: value})
    if rope_parameters == "absent":
        del config["rope_parameters"]  # the defaults set both keys in both entries
    error = refused(config, tmp_path)
    assert_names(error, key, "would be ignored", "rope_parameters")


@pytest.mark.parametrize("key", ["rotary_emb_base", "rotary_pct", "rotary_emb_fraction"])
def test_other_rope_spellings_are_refused(tmp_path, key):
    assert_names(refused(four_b(**{key: 0.5}), tmp_path), key, "rope_parameters")


# --- 10. finite, positive, sane bounds ------------------------------------------------

BAD_NUMBERS = [
    ("rope_theta", math.nan),
    ("rope_theta", math.inf),
    ("rope_theta", 1e-300),
    ("rope_theta", 1.0),
    ("rope_theta", 1e13),
    ("rms_norm_eps", math.inf),
    ("rms_norm_eps", math.nan),
    ("rms_norm_eps", 1e-300),
    ("rms_norm_eps", 2.0),
    ("max_position_embeddings", 2**62),
    ("vocab_size", 2**63),
    ("hidden_size", 2**31),
    ("sliding_window", 2**40),
]


@pytest.mark.parametrize(("key", "value"), BAD_NUMBERS, ids=[f"{k}={v}" for k, v in BAD_NUMBERS])
def test_out_of_bounds_numbers_are_refused(tmp_path, key, value):
    if key == "rope_theta":
        rope = json.loads(json.dumps(SPARK_X25_4B_CONFIG["rope_parameters"]))
        rope[SLIDING_ATTENTION]["rope_theta"] = value
        config, key = (
            four_b(rope_parameters=rope),
            "rope_parameters['sliding_attention']['rope_theta']",
        )
    else:
        config = four_b(**{key: value})
    error = refused(config, tmp_path)
    assert error.key == key
    assert "it must be a finite number in" in str(error) or "at most 2**31 - 1" in str(error)


def test_a_top_level_rope_theta_is_bounded_too(tmp_path):
    rope = {FULL_ATTENTION: {"partial_rotary_factor": 0.25}, SLIDING_ATTENTION: {}}
    error = refused(four_b(rope_parameters=rope, rope_theta=math.nan), tmp_path)
    assert_names(error, "rope_theta", "finite")


def test_the_bounds_keep_the_released_values(tmp_path):
    config = load(four_b(max_position_embeddings=2**31 - 1, vocab_size=2**31 - 1), tmp_path)
    assert config.max_position_embeddings == 2**31 - 1


# --- 11. torch_dtype --------------------------------------------------------------------


@pytest.mark.parametrize("key", ["torch_dtype", "dtype"])
@pytest.mark.parametrize("value", ["float33", "Tensor", "int8", "complex64", "", 5, [], {}])
def test_a_bogus_dtype_is_refused(tmp_path, key, value):
    config = four_b(**{key: value})
    config.pop("torch_dtype" if key == "dtype" else "dtype", None)
    assert_names(refused(config, tmp_path), key, "'bfloat16'")


@pytest.mark.parametrize("value", ["bfloat16", "float16", "float32", "half", "float", None])
def test_a_floating_dtype_vllm_serves_is_accepted(tmp_path, value):
    import torch

    config = load(four_b(torch_dtype=value), tmp_path)
    if value is not None:
        assert isinstance(config.dtype, torch.dtype) and config.dtype.is_floating_point


# --- properties: hostile values, one named error, no other exception --------------------

JSON_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
)
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(st.text(max_size=20), children, max_size=4),
    ),
    max_leaves=12,
)
NOT_NULL = JSON_VALUES.filter(lambda v: v is not None)

SIZE_KEYS = (*spark2_5_config.SIZE_KEYS, "sliding_window")
FLAG_KEYS = ("headwise_attn_output_gate", "tie_word_embeddings", "attention_bias", "mlp_bias")


def _not_a_positive_size(value) -> bool:
    is_int = isinstance(value, int) and not isinstance(value, bool)
    return not is_int or not 0 < value < 2**31


def _not_in_range(low, high):
    def check(value) -> bool:
        is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
        return not is_number or not (math.isfinite(value) and low <= value <= high)

    return check


def _rope_entry_mutation():
    """A bad change to one entry of the 4B's rope_parameters: (entry key, bad value)."""
    return st.one_of(
        st.tuples(st.just("rope_theta"), JSON_VALUES.filter(_not_in_range(1.000001, 1e12))),
        st.tuples(st.just("partial_rotary_factor"), JSON_VALUES.filter(_not_in_range(1e-9, 1.0))),
        st.tuples(
            st.sampled_from(["rope_type", "type"]), JSON_VALUES.filter(lambda v: v != "default")
        ),
        st.tuples(
            st.text(max_size=12).filter(
                lambda k: k not in ("rope_theta", "partial_rotary_factor", "rope_type", "type")
            ),
            JSON_VALUES,
        ),
    )


@st.composite
def bad_rope_parameters(draw):
    rope = json.loads(json.dumps(SPARK_X25_4B_CONFIG["rope_parameters"]))
    kind = draw(st.sampled_from(["not an object", "stray key", "entry", "entry value"]))
    if kind == "not an object":
        return draw(NOT_NULL.filter(lambda v: not isinstance(v, dict)))
    layer_type = draw(st.sampled_from(sorted(rope)))
    if kind == "stray key":
        rope[draw(st.text(max_size=20).filter(lambda k: k not in rope))] = draw(JSON_VALUES)
    elif kind == "entry":
        rope[layer_type] = draw(JSON_VALUES.filter(lambda v: not isinstance(v, dict)))
    else:
        key, value = draw(_rope_entry_mutation())
        rope[layer_type][key] = value
    return rope


VALID_DTYPES = ("bfloat16", "float16", "float32", "half", "float")
BAD_VALUES = {
    **dict.fromkeys(SIZE_KEYS, JSON_VALUES.filter(_not_a_positive_size)),
    **dict.fromkeys(FLAG_KEYS[:2], JSON_VALUES.filter(lambda v: not isinstance(v, bool))),
    **dict.fromkeys(FLAG_KEYS[2:], JSON_VALUES.filter(lambda v: v is not False)),
    "rms_norm_eps": JSON_VALUES.filter(_not_in_range(2**-126, 1.0)),
    "hidden_act": JSON_VALUES.filter(lambda v: v != "gelu"),
    "gate_attn_act_mode": JSON_VALUES.filter(lambda v: v not in ("sigmoid", "silu")),
    "layer_types": NOT_NULL.filter(lambda v: not isinstance(v, list) or len(v) != 36)
    | st.lists(st.sampled_from([SLIDING_ATTENTION, FULL_ATTENTION]), min_size=36, max_size=36)
    .flatmap(
        lambda types: st.tuples(st.integers(0, 35), NOT_NULL).map(
            lambda bad: [*types[: bad[0]], bad[1], *types[bad[0] + 1 :]]
        )
    )
    .filter(lambda types: not all(t in (SLIDING_ATTENTION, FULL_ATTENTION) for t in types)),
    "rope_parameters": bad_rope_parameters(),
    # the 4B's entries set both keys, so any top-level value would be ignored
    "rope_theta": NOT_NULL,
    "partial_rotary_factor": NOT_NULL,
    "rope_scaling": NOT_NULL.filter(lambda v: v != {}),
    "torch_dtype": NOT_NULL.filter(lambda v: v not in VALID_DTYPES),
    "dtype": NOT_NULL.filter(lambda v: v not in VALID_DTYPES),
}
PROPERTY_SETTINGS = settings(
    max_examples=400, deadline=None, suppress_health_check=[HealthCheck.filter_too_much]
)


@PROPERTY_SETTINGS
@given(data=st.data(), key=st.sampled_from(sorted(BAD_VALUES)))
def test_every_bad_value_is_one_error_naming_its_key(data, key):
    value = data.draw(BAD_VALUES[key], label=key)
    config = four_b(**{key: value})
    if key == "dtype":
        del config["torch_dtype"]
    with pytest.raises(Spark2_5ConfigError) as error:
        load(config)
    assert error.value.key == key or error.value.key.startswith(f"{key}[")
    message = str(error.value)
    assert message.startswith(f"Spark2_5 config: {error.value.key}=")
    assert len(message) < 2_000 + len(repr(value))


@PROPERTY_SETTINGS
@given(
    changes=st.dictionaries(
        st.sampled_from([*sorted(BAD_VALUES), "bos_token_id", "eos_token_id", "pad_token_id"]),
        JSON_VALUES,
        min_size=1,
        max_size=4,
    )
)
def test_any_value_is_accepted_or_one_named_error(changes):
    try:
        config = load(four_b(**changes))
    except Spark2_5ConfigError as error:
        # A good value may make an untouched key wrong (fewer layers than layer_types)
        assert error.key.split("[")[0] in {*SPARK_X25_4B_CONFIG, *changes}
    else:  # accepted: then every layer type in use has a complete, sane RoPE entry
        for layer_type in set(config.layer_types):
            rope = config.rope_parameters_for(layer_type)
            assert 1 < rope["rope_theta"] <= 1e12
            assert 0 < rope["partial_rotary_factor"] <= 1
