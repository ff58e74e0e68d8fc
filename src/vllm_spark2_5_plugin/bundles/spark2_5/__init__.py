# SPDX-License-Identifier: Apache-2.0
"""The Spark2_5 bundle: `vllm-hust-bundle render` writes its manifest here."""
