"""``Spark2_5Config``: the 4B's keys honoured through vLLM without remote code,
``tie_word_embeddings`` under both transformers base-class shapes, and one clear
error per invalid key."""

from __future__ import annotations

import json

import pytest
import transformers

from carrier_harness.server import run_vllm_serve_expecting_failure
from spark2_5_dev.carrier import ENABLE_ENV
from spark2_5_dev.checkpoints import build_spark2_5_checkpoint, write_tokenizer
from spark2_5_dev.spark_x25_4b import SPARK_X25_4B_CONFIG
from vllm_spark2_5_plugin.spark2_5_config import Spark2_5Config, Spark2_5ConfigError

SLIDING, FULL = "sliding_attention", "full_attention"


def write_config(path, config):
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    write_tokenizer(path)
    return path


@pytest.fixture(scope="module")
def registered():
    """The carrier's registrations in this process (what ``register()`` does when enabled)."""
    from vllm_spark2_5_plugin._registration import register_enabled

    register_enabled(override=False)


@pytest.mark.usefixtures("registered")
def test_vllm_resolves_the_real_4b_config_without_remote_code(tmp_path):
    from vllm.config import ModelConfig

    path = write_config(tmp_path / "spark-4b", SPARK_X25_4B_CONFIG)
    model_config = ModelConfig(model=str(path), max_model_len=4096, trust_remote_code=False)
    config = model_config.hf_config
    assert type(config) is Spark2_5Config
    for key, value in SPARK_X25_4B_CONFIG.items():
        if key not in ("auto_map", "torch_dtype", "rope_parameters", "model_type"):
            assert getattr(config, key) == value, key
    for layer_type, rope in SPARK_X25_4B_CONFIG["rope_parameters"].items():
        assert config.rope_parameters_for(layer_type) == {
            "rope_theta": rope["rope_theta"],
            "partial_rotary_factor": rope["partial_rotary_factor"],
        }
    assert model_config.architecture == "Spark2_5ForCausalLM"
    assert model_config.get_head_size() == 256
    assert model_config.max_model_len == 4096


@pytest.mark.usefixtures("registered")
def test_transformers_autoconfig_ignores_auto_map_once_registered(tmp_path):
    path = write_config(tmp_path / "spark-4b", SPARK_X25_4B_CONFIG)
    assert type(transformers.AutoConfig.from_pretrained(path)) is Spark2_5Config


@pytest.mark.parametrize("tie", [True, False])
def test_tie_word_embeddings_round_trips(tmp_path, tie):
    config = Spark2_5Config.from_pretrained(
        write_config(tmp_path / "c", {**SPARK_X25_4B_CONFIG, "tie_word_embeddings": tie})
    )
    assert config.tie_word_embeddings is tie
    config.save_pretrained(tmp_path / "saved")
    assert Spark2_5Config.from_pretrained(tmp_path / "saved").tie_word_embeddings is tie


def transformers4_init(self, *, tie_word_embeddings=True, **kwargs):
    """The shape of transformers 4.x ``PretrainedConfig.__init__``: it owns
    ``tie_word_embeddings`` with a default of True."""
    self.tie_word_embeddings = tie_word_embeddings
    for key, value in kwargs.items():
        setattr(self, key, value)


def test_tie_word_embeddings_survives_a_transformers4_base_class(monkeypatch):
    monkeypatch.setattr(transformers.PretrainedConfig, "__init__", transformers4_init)
    assert Spark2_5Config(tie_word_embeddings=False).tie_word_embeddings is False
    assert Spark2_5Config().tie_word_embeddings is True

    class SwallowsTie(Spark2_5Config):
        """The original defect: the argument is taken and not passed on."""

        def __init__(self, tie_word_embeddings=True, **kwargs):
            transformers4_init(self, **kwargs)

    # The stand-in base class reproduces the 4.x behaviour the fix is for.
    assert SwallowsTie(tie_word_embeddings=False).tie_word_embeddings is True


def test_defaults_follow_the_original_configuration():
    config = Spark2_5Config()
    assert (config.hidden_size, config.num_hidden_layers, config.head_dim) == (2048, 28, 256)
    assert config.layer_types[:4] == [SLIDING, SLIDING, SLIDING, FULL]
    assert config.rope_parameters_for(FULL) == {
        "rope_theta": 5_000_000,
        "partial_rotary_factor": 0.25,
    }
    assert config.headwise_attn_output_gate and config.gate_attn_act_mode == "sigmoid"


def test_rope_parameters_stay_keyed_by_layer_type_through_vllm_rope_patching():
    """vLLM re-standardises and re-validates every config's RoPE at load; under
    transformers 5.17 the base class used to add a top-level ``rope_theta``
    there, which its own ``validate_rope`` then failed on."""
    from vllm.transformers_utils.config import patch_rope_parameters

    config = Spark2_5Config(
        num_hidden_layers=4,
        rope_parameters={FULL: {"partial_rotary_factor": 0.5}, SLIDING: {"rope_theta": 1e4}},
    )
    patch_rope_parameters(config)
    assert set(config.rope_parameters) == {FULL, SLIDING}
    assert config.rope_parameters[FULL] == {
        "rope_type": "default",
        "rope_theta": 10_000,
        "partial_rotary_factor": 0.5,
    }
    assert config.rope_parameters_for(SLIDING) == {
        "rope_theta": 1e4,
        "partial_rotary_factor": 1.0,
    }


def test_unused_layer_type_needs_no_rope_entry():
    config = Spark2_5Config(
        num_hidden_layers=2,
        layer_types=[FULL, FULL],
        rope_parameters={FULL: {"rope_theta": 1e6, "partial_rotary_factor": 0.5}},
    )
    assert config.rope_parameters_for(FULL)["partial_rotary_factor"] == 0.5


INVALID = [
    ({"layer_types": [SLIDING] * 35}, "layer_types", "one entry per layer"),
    ({"layer_types": [SLIDING] * 35 + ["global"]}, "layer_types[35]", "'sliding_attention'"),
    (
        {"rope_parameters": {FULL: {"rope_theta": 5e6}}},
        "rope_parameters",
        "no entry for 'sliding_attention'",
    ),
    (
        {"rope_parameters": {FULL: {"rope_type": "yarn"}, SLIDING: {}}},
        "rope_parameters['full_attention']['rope_type']",
        '"default"',
    ),
    (
        {"rope_parameters": {FULL: {"partial_rotary_factor": 1.5}, SLIDING: {}}},
        "rope_parameters['full_attention']['partial_rotary_factor']",
        "(0, 1]",
    ),
    (
        {"rope_parameters": {FULL: {"partial_rotary_factor": 0.003}, SLIDING: {}}},
        "rope_parameters['full_attention']['partial_rotary_factor']",
        "even number",
    ),
    ({"gate_attn_act_mode": "tanh"}, "gate_attn_act_mode", "'sigmoid', 'silu'"),
    ({"hidden_act": "gelu_pytorch_tanh"}, "hidden_act", '"gelu"'),
    ({"hidden_act": "silu"}, "hidden_act", '"gelu"'),
    ({"num_key_value_heads": 3}, "num_key_value_heads", "divide num_attention_heads=16"),
    ({"num_attention_heads": 0}, "num_attention_heads", "positive integer"),
    ({"head_dim": 12.5}, "head_dim", "positive integer"),
    ({"attention_bias": True}, "attention_bias", "no bias"),
    ({"mlp_bias": True}, "mlp_bias", "no bias"),
    ({"sliding_window": None}, "sliding_window", "positive integer"),
    ({"tie_word_embeddings": "yes"}, "tie_word_embeddings", "true or false"),
    ({"headwise_attn_output_gate": 1}, "headwise_attn_output_gate", "true or false"),
    ({"rms_norm_eps": 0}, "rms_norm_eps", "[1.17549e-38, 1]"),
]


@pytest.mark.parametrize(("overrides", "key", "allowed"), INVALID, ids=[c[1] for c in INVALID])
def test_an_invalid_key_fails_with_one_error_naming_key_value_and_allowed(overrides, key, allowed):
    config = {
        k: v for k, v in SPARK_X25_4B_CONFIG.items() if k not in ("architectures", "auto_map")
    }
    config.update(overrides)
    with pytest.raises(Spark2_5ConfigError) as error:
        Spark2_5Config(**config)
    message = str(error.value)
    assert message.startswith(f"Spark2_5 config: {key}=")
    assert error.value.key == key
    assert repr(error.value.value) in message
    assert allowed in message


@pytest.mark.serve
def test_vllm_serve_refuses_an_invalid_config_with_that_error(tmp_path):
    checkpoint = build_spark2_5_checkpoint(tmp_path / "bad")
    config = json.loads((checkpoint / "config.json").read_text())
    (checkpoint / "config.json").write_text(json.dumps({**config, "gate_attn_act_mode": "tanh"}))
    done = run_vllm_serve_expecting_failure(checkpoint, env={ENABLE_ENV: "1"}, timeout=300)
    assert done.returncode != 0
    output = done.stdout + done.stderr
    assert "Spark2_5 config: gate_attn_act_mode='tanh' is invalid; allowed values are" in output


def test_the_config_module_knows_nothing_of_checkpoints():
    """One way only: the checkpoint checks read the config, the config module imports
    nothing of them (their file check is added to it at registration)."""
    import ast
    from pathlib import Path

    import vllm_spark2_5_plugin.spark2_5_config as module

    tree = ast.parse(Path(module.__file__).read_text(encoding="utf-8"))
    imported = {
        name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        for name in [node.module or "", *(alias.name for alias in node.names)]
    }
    assert not {name for name in imported if "checkpoint" in name}, imported
