"""The released Spark-X2.5-4B ``config.json``, transcribed from its model card and files.

Kept apart from ``checkpoints`` (whose source keys the trained fixture's cache):
the config tests check the carrier against it, and the GPU serving benchmark
serves its shape with random weights.
"""

from spark2_5_dev.checkpoints import SPARK2_5_AUTO_MAP
from vllm_spark2_5_plugin.spark2_5_config import FULL_ATTENTION, SLIDING_ATTENTION

SPARK_X25_4B_CONFIG = {
    "architectures": ["Spark2_5ForCausalLM"],
    "auto_map": SPARK2_5_AUTO_MAP,
    "model_type": "spark2_5",
    "vocab_size": 131072,
    "hidden_size": 2560,
    "intermediate_size": 10240,
    "num_hidden_layers": 36,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "hidden_act": "gelu",
    "max_position_embeddings": 1048576,
    "sliding_window": 512,
    "layer_types": ([SLIDING_ATTENTION] * 3 + [FULL_ATTENTION]) * 9,
    "rope_parameters": {
        FULL_ATTENTION: {
            "rope_type": "default",
            "rope_theta": 5000000,
            "partial_rotary_factor": 0.25,
        },
        SLIDING_ATTENTION: {
            "rope_type": "default",
            "rope_theta": 10000,
            "partial_rotary_factor": 1.0,
        },
    },
    "rms_norm_eps": 1e-06,
    "gate_attn_act_mode": "sigmoid",
    "headwise_attn_output_gate": True,
    "attention_bias": False,
    "mlp_bias": False,
    "attention_dropout": 0.0,
    "initializer_range": 0.02,
    "use_cache": True,
    "tie_word_embeddings": True,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "pad_token_id": 2,
    "torch_dtype": "bfloat16",
}
