# SPDX-License-Identifier: Apache-2.0
"""The extension bundles this distribution ships: one package per bundle."""
