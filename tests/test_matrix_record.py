"""``tools/matrix_record.py``: a run of several releases writes records as it goes;
those never make the next release's run look dirty or like other code."""

from __future__ import annotations

import importlib.util
import json
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


def _commit(repo, message: str) -> None:
    _git(repo, "add", ".")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", message)


@pytest.fixture
def repo(tmp_path, monkeypatch):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "model.py").write_text("x = 1\n")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_model.py").write_text("def test(): pass\n")
    records = tmp_path / "extensions" / "c" / "matrix-records"
    records.mkdir(parents=True)
    (records / "vllm-0.1.0.json").write_text("{}\n")
    (tmp_path / "extensions" / "c" / "docs").mkdir()
    (tmp_path / "extensions" / "c" / "docs" / "support-matrix.md").write_text("table\n")
    (tmp_path / "manifest.toml").write_text(
        '[[bundle]]\nhost = { verified_on = ["0.1.0+cpu", "0.2.0+cpu"] }\n'
    )
    _git(tmp_path, "init", "-q")
    _commit(tmp_path, "one")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_records_written_during_a_run_leave_the_commit_clean(repo):
    (repo / "extensions/c/matrix-records/vllm-0.1.0.json").write_text('{"new": 1}\n')
    (repo / "extensions/c/docs/support-matrix.md").write_text("rendered\n")
    assert not matrix_record.commit().endswith("+dirty")
    (repo / "src" / "model.py").write_text("x = 2\n")
    assert matrix_record.commit().endswith("+dirty")


def test_only_a_change_to_what_ships_moves_the_code_identity(repo):
    """The identity is the ``src/`` tree: records, tests and docs keep it."""
    before = matrix_record.code()
    (repo / "extensions/c/matrix-records/vllm-0.2.0.json").write_text("{}\n")
    (repo / "tests" / "test_model.py").write_text("def test(): assert True\n")
    _commit(repo, "records and tests")
    assert matrix_record.code() == before
    (repo / "src" / "model.py").write_text("x = 3\n")
    _commit(repo, "code")
    assert matrix_record.code() != before
    assert matrix_record.code("HEAD~1") == before


def _record(repo, release: str, **fields) -> None:
    record = {"release": release, "suite": "whole", "exit_code": 0, "code": None, **fields}
    path = repo / "extensions" / "c" / "matrix-records" / f"vllm-{release}.json"
    path.write_text(json.dumps(record))


def test_a_release_needs_every_verified_host_passed_at_the_code_it_ships(repo):
    shipped = matrix_record.code()
    _record(repo, "0.1.0", code=shipped)
    _record(repo, "0.2.0", code=shipped)
    assert matrix_record.release_problems(repo) == []
    _record(repo, "0.2.0", code="0123456789ab")
    (problem,) = matrix_record.release_problems(repo)
    assert problem.startswith(f"vLLM 0.2.0 has no passing whole-suite record at code {shipped}")
    assert "code 0123456789ab" in problem and "run `scripts/run-matrix`" in problem
    _record(repo, "0.2.0", code=shipped, exit_code=1)
    assert "exit code 1" in matrix_record.release_problems(repo)[0]
    _record(repo, "0.2.0", code=shipped, suite="contract")
    assert "contract suite" in matrix_record.release_problems(repo)[0]
    (repo / "extensions/c/matrix-records/vllm-0.2.0.json").unlink()
    assert "(found: None suite" in matrix_record.release_problems(repo)[0]


def test_an_engine_free_record_counts_the_tests_skipped_where_an_engine_would_start(tmp_path):
    from carrier_harness import engine_free

    junit = tmp_path / "run.xml"
    junit.write_text(
        "<testsuites><testsuite>"
        '<testcase classname="t" name="a"/>'
        f'<testcase classname="t" name="b"><skipped message="{engine_free.MARK}"/></testcase>'
        f'<testcase classname="t" name="c"><skipped message="Skipped: {engine_free.MARK}"/>'
        '</testcase><testcase classname="t" name="d"><skipped message="other"/></testcase>'
        "</testsuite></testsuites>"
    )
    out = tmp_path / "record.json"
    pairs = ["suite=engine-free", "exit_code=0", "source_check_exit=0", "commit=c", "code=x"]
    assert matrix_record.main([str(junit), str(out), *pairs, "cpu_class=avx2"]) == 0
    record = json.loads(out.read_text())
    assert record["counts"] == {"passed": 1, "failed": 0, "errors": 0, "skipped": 3}
    assert (record["engine_skips"], record["source_check_exit"]) == (2, 0)


def test_a_new_record_keeps_the_note_written_on_the_one_it_replaces(tmp_path):
    junit = tmp_path / "run.xml"
    junit.write_text(
        '<testsuites><testsuite><testcase classname="t" name="a"/></testsuite></testsuites>'
    )
    previous, out = tmp_path / "vllm-0.9.0.json", tmp_path / "record.json"
    previous.write_text(json.dumps({"counts": {"passed": 9}, "note": "Not served: no kernels"}))
    pairs = ["release=0.9.0", "exit_code=0", "commit=c", "code=x", "cpu_class=avx2"]
    assert matrix_record.main([str(junit), str(out), *pairs, f"previous={previous}"]) == 0
    record = json.loads(out.read_text())
    assert (record["note"], record["counts"]["passed"], "previous" in record) == (
        "Not served: no kernels",
        1,
        False,
    )
    assert matrix_record.main([str(junit), str(out), *pairs, f"previous={tmp_path / 'no'}"]) == 0
    assert "note" not in json.loads(out.read_text())
