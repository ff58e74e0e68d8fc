"""The engine-free run (``CARRIER_HARNESS_ENGINE_FREE=1``, ``carrier_harness.engine_free``):
a test that builds a ``VllmConfig``, in pytest's process or in one it starts, is
reported skipped with the hook's reason; a test that builds none runs and passes."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from carrier_harness import engine_free
from carrier_harness.project import PROJECT_ROOT as ROOT

TESTS = """
import subprocess
import sys

import pytest

BUILD = "import sys; from vllm.config import VllmConfig; VllmConfig(); print('built'); sys.exit(3)"


def build_in_a_process():
    return subprocess.run([sys.executable, "-c", BUILD], capture_output=True, text=True)


def test_builds_a_config_here():
    from vllm.config import VllmConfig

    VllmConfig()


def test_builds_a_config_in_a_process_it_starts():
    done = build_in_a_process()
    assert done.returncode == 3 and "built" in done.stdout, done.stderr


def test_wants_a_process_that_builds_a_config_to_fail():
    assert build_in_a_process().returncode != 0  # true of a stopped process too


@pytest.fixture(scope="module")
def process_with_a_config():
    assert build_in_a_process().returncode == 3, "no output in this message"


def test_one_of_a_module_fixture(process_with_a_config):
    pass


def test_two_of_a_module_fixture(process_with_a_config):
    pass  # pytest re-raises the fixture's first error


def test_builds_none():
    import vllm.config

    assert vllm.config.VllmConfig.__name__ == "VllmConfig"
"""


def run_pytest(tmp_path: Path, engine_free_run: bool) -> subprocess.CompletedProcess[str]:
    """The six tests above under the project's root conftest.py, as their own run."""
    (tmp_path / "test_six.py").write_text(TESTS, encoding="utf-8")
    shutil.copyfile(ROOT / "conftest.py", tmp_path / "conftest.py")
    env = {k: v for k, v in os.environ.items() if k != engine_free.ENV}
    helpers = [str(ROOT / "tools" / "dev"), str(ROOT / "src")]
    env["PYTHONPATH"] = os.pathsep.join([*helpers, env.get("PYTHONPATH", "")])
    if engine_free_run:
        env[engine_free.ENV] = "1"
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-rs", "-p", "no:cacheprovider", "test_six.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_a_test_that_would_start_an_engine_is_skipped_saying_so(tmp_path):
    done = run_pytest(tmp_path, engine_free_run=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed, 5 skipped" in done.stdout, done.stdout
    skips = [line for line in done.stdout.splitlines() if line.startswith("SKIPPED")]
    assert len(skips) == 5 and all("test_six.py:" in line for line in skips), done.stdout
    assert all(line.endswith(engine_free.MARK) for line in skips), done.stdout
    assert engine_free.HEADER in done.stdout


@pytest.mark.skipif(engine_free.active(), reason="builds a VllmConfig: the run is engine-free")
def test_without_the_variable_the_same_tests_build_their_configs(tmp_path):
    done = run_pytest(tmp_path, engine_free_run=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "6 passed" in done.stdout, done.stdout
    assert engine_free.MARK not in done.stdout
