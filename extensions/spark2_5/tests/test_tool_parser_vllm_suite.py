"""``spark25`` passes vLLM's own shared tool-parser tests (``ToolParserTests``) of the
installed release, run from that release's source distribution (fetched from pip's
index, never built) with its tools declared (``spark2_5_dev.vllm_parser_suite``)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tarfile
from importlib.metadata import version
from pathlib import Path

import pytest
from packaging.version import Version

from carrier_harness.sdist import fetch_sdist
from spark2_5_dev.checkpoints import write_tokenizer

pytestmark = pytest.mark.slow
SUITE = ("tests/__init__.py", "tests/tool_parsers/__init__.py", "tests/tool_parsers/utils.py")
COMMON = "tests/tool_parsers/common_tests.py"
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "vllm-hust-carriers"


def extract_suite(sdist: Path, into: Path) -> Path | None:
    """vLLM's shared parser tests from ``sdist`` under ``into``; None where the
    release has none."""
    with tarfile.open(sdist) as archive:
        top = archive.getnames()[0].split("/")[0]
        wanted = {f"{top}/{name}": name for name in (*SUITE, COMMON)}
        members = [m for m in archive.getmembers() if m.name in wanted]
        if f"{top}/{COMMON}" not in {m.name for m in members}:
            return None
        for member in members:
            member.name = wanted[member.name]
            archive.extract(member, into, filter="data")
    return into


def test_spark25_passes_vllms_shared_tool_parser_tests(tmp_path):
    release = Version(version("vllm")).public
    suite = extract_suite(fetch_sdist("vllm", release, CACHE / "sdists"), tmp_path / "vllm")
    if suite is None:
        pytest.skip(f"vLLM {release}'s source has no {COMMON}")
    module = suite / "tests" / "tool_parsers" / "test_spark25_tool_parser.py"
    ours = importlib.util.find_spec("spark2_5_dev.vllm_parser_suite").origin
    module.write_text(Path(ours).read_text())
    write_tokenizer(module.with_name("spark25_tokenizer"))
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--noconftest",
         "--rootdir", str(suite), "-o", "addopts=", str(module)],
        cwd=suite,
        env={**os.environ,
             "PYTHONPATH": os.pathsep.join([str(suite), os.environ.get("PYTHONPATH", "")])},
        capture_output=True,
        text=True,
        timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    assert " passed" in done.stdout and "skipped" not in done.stdout, done.stdout[-2000:]
