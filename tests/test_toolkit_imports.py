"""The toolkit knows no carrier: its import graph, read from source and from a live import."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from carrier_harness.env import clean_env
from carrier_harness.project import PROJECT_ROOT, pyproject

TOOLKIT = PROJECT_ROOT / "src" / "vllm_hust_bundle_kit"
# What the toolkit may import besides the standard library and itself; vllm_hust_ext,
# the extension manager, only where it is installed (manager_state.py asks it to read its state).
THIRD_PARTY = {"packaging", "jsonschema", "referencing", "tomli", "platformdirs", "vllm_hust_ext"}
# A carrier's entry point imports these before its switch is on: standard library only.
RUNTIME_MODULES = ("__init__", "contract", "switch", "entry")


def imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


def carrier_packages() -> set[str]:
    """Every carrier's top-level package, from the vllm.general_plugins entry points."""
    plugins = pyproject()["entry-points"]["vllm.general_plugins"].values()
    return {target.split(":")[0].split(".")[0] for target in plugins}


@pytest.mark.parametrize("module", sorted(TOOLKIT.glob("*.py")), ids=lambda p: p.stem)
def test_the_toolkit_imports_only_the_standard_library_and_its_dependencies(module):
    allowed = set(sys.stdlib_module_names) | {"vllm_hust_bundle_kit"}
    if module.stem not in RUNTIME_MODULES:
        allowed |= THIRD_PARTY
    roots = imported_roots(module) - {"__future__"}
    assert roots <= allowed, f"{module.name} imports {sorted(roots - allowed)}"
    assert not roots & carrier_packages()


def test_importing_the_whole_toolkit_loads_no_carrier():
    names = [f"vllm_hust_bundle_kit.{module.stem}" for module in TOOLKIT.glob("*.py")]
    probe = (
        "import importlib, json, sys\n"
        f"for name in {names!r}: importlib.import_module(name)\n"
        "print(json.dumps(sorted(m.split('.')[0] for m in sys.modules)))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, env=clean_env(), timeout=300
    )
    assert done.returncode == 0, done.stderr
    loaded = set(json.loads(done.stdout))
    assert not loaded & (carrier_packages() | {"vllm", "torch", "transformers"})
