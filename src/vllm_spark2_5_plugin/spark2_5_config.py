"""Placeholder: the Spark2_5 configuration lands with the model issue."""

from transformers import PretrainedConfig


class Spark2_5Config(PretrainedConfig):
    model_type = "spark2_5"
