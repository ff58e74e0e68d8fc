"""scripts/verify-release, run after an upload, against a stand-in index on loopback.

The index's JSON and integrity APIs are static files; ``pypi-attestations`` is a
stand-in on PATH that records its arguments. The cryptographic check itself needs
Sigstore's servers, which these machines cannot reach, so the tests pin down what
is asked of the verifier and what its answer, the served hashes and the attested
publisher decide.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from carrier_harness.package_index import serve_index
from carrier_harness.project import pyproject

ROOT = Path(__file__).resolve().parent.parent
VERIFY_RELEASE = ROOT / "scripts" / "verify-release"
PROJECT = pyproject()
NAME, VERSION = PROJECT["name"], PROJECT["version"]

# --- verify-release --------------------------------------------------------------------------

STAND_IN_VERIFIER = """#!/bin/sh
if [ "$1" = --version ]; then echo "pypi-attestations 0.0.0 (stand-in)"; exit 0; fi
echo "$@" >> "$VERIFIER_CALLS"
if [ -n "$VERIFIER_FAILS" ]; then echo "Verification failed: $VERIFIER_FAILS" >&2; exit 1; fi
echo "OK: $(basename "$6")"
"""


def _publisher(**changes: str) -> dict:
    publisher = {
        "kind": "GitHub",
        "repository": "owner/repo",
        "workflow": "publish.yml",
        "environment": "pypi",
    }
    return {**publisher, **changes}


def _release(tmp_path: Path, publisher: dict, served_bytes: bytes = b"") -> tuple[Path, Path]:
    """A build receipt and its dist folder; an index serving them with ``publisher``."""
    dist = tmp_path / "dist"
    dist.mkdir()
    files = []
    for filename in (f"x-{VERSION}.tar.gz", f"x-{VERSION}-py3-none-any.whl"):
        (dist / filename).write_bytes(filename.encode())
        digest = hashlib.sha256(filename.encode() + served_bytes).hexdigest()
        files.append({"filename": filename, "sha256": digest, "bytes": len(filename)})
        provenance = {"version": 1, "attestation_bundles": [{"publisher": publisher}]}
        where = tmp_path / "index" / "integrity" / NAME / VERSION / filename
        where.mkdir(parents=True)
        (where / "provenance").write_text(json.dumps(provenance))
    served = [
        {
            "filename": f["filename"],
            "digests": {"sha256": hashlib.sha256(f["filename"].encode()).hexdigest()},
        }
        for f in files
    ]
    api = tmp_path / "index" / "pypi" / NAME / VERSION
    api.mkdir(parents=True)
    (api / "json").write_text(json.dumps({"urls": served}))
    receipt = tmp_path / "receipt.json"
    receipt.write_text(json.dumps({"distribution": NAME, "version": VERSION, "files": files}))
    return receipt, dist


def _verify_release(tmp_path, receipt, dist, environment="pypi", approvers="alice", fails=""):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "pypi-attestations").write_text(STAND_IN_VERIFIER)
    (bin_dir / "pypi-attestations").chmod(0o755)
    calls = tmp_path / "verifier-calls"
    out = tmp_path / "release-receipt.json"
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "VERIFIER_CALLS": str(calls),
        "VERIFIER_FAILS": fails,
        "GITHUB_REPOSITORY": "owner/repo",
        "GITHUB_SERVER_URL": "https://github.com",
        "GITHUB_RUN_ID": "42",
    }
    env.pop("GITHUB_STEP_SUMMARY", None)
    with serve_index(tmp_path / "index") as (simple_url, _):
        base = simple_url.removesuffix("/simple/")
        command = [sys.executable, str(VERIFY_RELEASE), "published", str(receipt), str(dist)]
        command += ["--index", base]
        options = ["--environment", environment, "--approvers", approvers, "--out", str(out)]
        done = subprocess.run(
            [*command, *options],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    written = json.loads(out.read_text()) if out.exists() else None
    return done, written, calls.read_text().splitlines() if calls.exists() else [], base


def test_verify_release_verifies_every_file_and_writes_the_receipt(tmp_path):
    receipt, dist = _release(tmp_path, _publisher())
    done, written, calls, base = _verify_release(tmp_path, receipt, dist)
    assert done.returncode == 0, done.stderr
    assert len(calls) == 2
    for call, item in zip(calls, written["files"], strict=True):
        provenance = f"{item['filename']}.provenance"
        assert re.fullmatch(
            rf"verify pypi --repository https://github.com/owner/repo --provenance-file "
            rf"\S+/{re.escape(provenance)} {re.escape(str(dist / item['filename']))}",
            call,
        )
        assert item["attestation_publishers"] == [_publisher()]
    assert written["index"] == base and written["approvers"] == ["alice"]
    assert written["environment"] == "pypi"
    assert written["attestations_verified_with"] == "pypi-attestations 0.0.0 (stand-in)"
    assert written["workflow_run"] == "https://github.com/owner/repo/actions/runs/42"
    assert json.loads(done.stdout) == written


def test_verify_release_fails_when_the_signature_does_not_verify(tmp_path):
    receipt, dist = _release(tmp_path, _publisher())
    done, written, _, _ = _verify_release(tmp_path, receipt, dist, fails="bad signature")
    assert done.returncode == 1 and written is None
    assert (
        "pypi-attestations verify pypi failed:\nVerification failed: bad signature" in done.stderr
    )


@pytest.mark.parametrize(
    "publisher",
    [
        _publisher(workflow="other.yml"),
        _publisher(environment="testpypi"),
        _publisher(repository="someone/fork"),
        _publisher(kind="GitLab"),
    ],
)
def test_verify_release_fails_on_another_publisher(tmp_path, publisher):
    receipt, dist = _release(tmp_path, publisher)
    done, written, _, _ = _verify_release(tmp_path, receipt, dist)
    assert done.returncode == 1 and written is None
    assert f"attested by {publisher}, expected {_publisher()}" in done.stderr


def test_verify_release_fails_when_the_index_serves_other_bytes(tmp_path):
    receipt, dist = _release(tmp_path, _publisher(), served_bytes=b"tampered")
    done, _, calls, base = _verify_release(tmp_path, receipt, dist)
    assert done.returncode == 1 and calls == []
    assert f"{base} serves sha256" in done.stderr and "the build made" in done.stderr


def test_verify_release_needs_an_approver_for_pypi_only(tmp_path):
    receipt, dist = _release(tmp_path, _publisher(environment="testpypi"))
    done, written, _, _ = _verify_release(tmp_path, receipt, dist, "testpypi", approvers="")
    assert done.returncode == 0 and written["approvers"] == []
    pypi = tmp_path / "pypi"
    pypi.mkdir()
    receipt, dist = _release(pypi, _publisher())
    done, _, _, _ = _verify_release(pypi, receipt, dist, approvers="")
    assert done.returncode == 1 and "no approver recorded for the pypi deployment" in done.stderr
