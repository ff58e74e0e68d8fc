"""What ships stays readable in one sitting: no file under ``src/`` over 400 lines, no
function there over 60 (docstring included), ``scripts/check-dist`` under 300."""

from __future__ import annotations

import ast
from pathlib import Path

from carrier_harness.project import PROJECT_ROOT as ROOT

MAX_FILE_LINES = 400
MAX_FUNCTION_LINES = 60
MAX_CHECK_DIST_LINES = 300


def long_functions(source: str) -> dict[str, int]:
    """Each function (methods and nested ones too) longer than the limit: its lines."""
    return {
        node.name: node.end_lineno - node.lineno + 1
        for node in ast.walk(ast.parse(source))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    }


def _shipped() -> list[Path]:
    return sorted((ROOT / "src").rglob("*.py"))


def test_no_shipped_file_is_over_400_lines():
    sizes = {str(p.relative_to(ROOT)): len(p.read_text().splitlines()) for p in _shipped()}
    assert sizes, "no source found"
    assert {name: n for name, n in sizes.items() if n > MAX_FILE_LINES} == {}


def test_no_shipped_function_is_over_60_lines():
    found = {str(p.relative_to(ROOT)): long_functions(p.read_text()) for p in _shipped()}
    assert {name: long for name, long in found.items() if long} == {}


def test_check_dist_is_under_300_lines():
    assert len((ROOT / "scripts" / "check-dist").read_text().splitlines()) < MAX_CHECK_DIST_LINES


def test_a_long_function_is_found():
    body = "".join(f"        x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))
    assert long_functions(f"class A:\n    def f(self):\n{body}") == {"f": MAX_FUNCTION_LINES + 1}
    assert long_functions("def g():\n    return 1\n") == {}
