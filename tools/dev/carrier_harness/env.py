"""Process environments for tests: the caller's, without anything that enables a carrier."""

from __future__ import annotations

import os
from collections.abc import Iterable

from vllm_hust_bundle_kit.contract import MANAGER_OWNED_ENVS, STATE_ENV


def clean_env(drop: Iterable[str] = (), **overrides: str) -> dict[str, str]:
    """``os.environ`` without the manager's variables and ``drop``, plus ``overrides``."""
    removed = {*MANAGER_OWNED_ENVS, STATE_ENV, *drop}
    env = {name: value for name, value in os.environ.items() if name not in removed}
    env.update(overrides)
    return env
