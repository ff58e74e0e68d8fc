"""``tools/matrix_record.py``: a run of several releases writes records as it goes;
those never make the next release's run look dirty or like other code."""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location(
    "matrix_record", Path(__file__).resolve().parents[1] / "tools" / "matrix_record.py"
)
matrix_record = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(matrix_record)


def _git(repo, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


@pytest.fixture
def repo(tmp_path, monkeypatch):
    (tmp_path / "src.py").write_text("x = 1\n")
    records = tmp_path / "extensions" / "c" / "matrix-records"
    records.mkdir(parents=True)
    (records / "vllm-0.1.0.json").write_text("{}\n")
    (tmp_path / "extensions" / "c" / "docs").mkdir()
    (tmp_path / "extensions" / "c" / "docs" / "support-matrix.md").write_text("table\n")
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_records_written_during_a_run_leave_the_commit_clean(repo):
    (repo / "extensions/c/matrix-records/vllm-0.1.0.json").write_text('{"new": 1}\n')
    (repo / "extensions/c/docs/support-matrix.md").write_text("rendered\n")
    assert not matrix_record.commit().endswith("+dirty")
    (repo / "src.py").write_text("x = 2\n")
    assert matrix_record.commit().endswith("+dirty")


def test_commits_that_only_add_records_share_the_code_identity(repo):
    before = matrix_record.code()
    (repo / "extensions/c/matrix-records/vllm-0.2.0.json").write_text("{}\n")
    _git(repo, "add", ".")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "records")
    assert matrix_record.code() == before
    (repo / "src.py").write_text("x = 3\n")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "code")
    assert matrix_record.code() != before
