"""The checkpoint-check benchmark runs and scales its per-layer figures to the whole 4B; the
measurement itself (gigabytes of tensors) is not run here."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
SCRIPT = BENCHMARKS / "bench_checkpoint_checks.py"


@pytest.fixture
def bench(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import bench_checkpoint_checks

    return bench_checkpoint_checks


def test_script_accepts_quick_layers_and_out():
    done = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    for option in ("--quick", "--layers", "--out"):
        assert option in done.stdout


def test_figures_are_scaled_to_all_36_layers(bench):
    totals = {
        "outer": {"pipeline": 2.0, "check alone": 1.0},
        "layer0": {"pipeline": 0.5, "check alone": 0.25},
        "layer1": {"pipeline": 0.7, "check alone": 0.35},
    }
    assert bench.scale_to_4b(totals, "pipeline", layers=2, full=36) == pytest.approx(2 + 0.6 * 36)
    assert bench.scale_to_4b(totals, "check alone", 2, 36) == pytest.approx(1 + 0.3 * 36)


def test_the_measured_shapes_are_the_4bs(bench):
    from spark2_5_dev.spark_x25_4b import SPARK_X25_4B_CONFIG

    groups = bench.file_groups(SPARK_X25_4B_CONFIG, layers=36)
    count = sum(math.prod(shape) for shapes in groups.values() for shape in shapes.values())
    assert count == 4_112_079_360  # the released checkpoint's parameter count
