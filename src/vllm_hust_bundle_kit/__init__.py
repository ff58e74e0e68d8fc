# SPDX-License-Identifier: Apache-2.0
"""Toolkit for vLLM-HUST extension bundles and the carriers inside them.

Knows no carrier. Two sides:

* at run time, inside every vLLM process, :mod:`.switch` and :mod:`.entry` give a
  carrier its default-off switch and its ``vllm.general_plugins`` entry point
  (standard library only);
* at build and operate time, :mod:`.render` turns ``manifest.toml`` into the
  JSON manifests the extension manager (``vllm-hust-ext``) reads,
  :mod:`.installed` finds and checks installed bundles without importing them,
  :mod:`.manager_state`, :mod:`.manager_refusals` and :mod:`.manager_launch` answer
  what the manager would do with them (its state file, its refusals, its launch),
  and :mod:`.cli` is the ``vllm-hust-bundle`` command over all of it.

This module imports nothing, so a carrier's entry point stays cheap.
"""
