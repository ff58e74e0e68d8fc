"""The development helpers' path: pytest's ``pythonpath`` in pyproject.toml.

``python tools/dev_pythonpath.py`` prints it for ``PYTHONPATH``; ``install()`` puts it
on this process's path and on that of every process it starts (the benchmarks).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]


def paths() -> list[str]:
    with open(ROOT / "pyproject.toml", "rb") as f:
        relative = tomllib.load(f)["tool"]["pytest"]["ini_options"]["pythonpath"]
    return [str(ROOT / path) for path in relative]


def install() -> None:
    sys.path[:0] = [path for path in paths() if path not in sys.path]
    inherited = [path for path in os.environ.get("PYTHONPATH", "").split(os.pathsep) if path]
    missing = [path for path in paths() if path not in inherited]
    os.environ["PYTHONPATH"] = os.pathsep.join([*missing, *inherited])


if __name__ == "__main__":
    print(os.pathsep.join(paths()))
