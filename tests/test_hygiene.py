"""Hygiene of every file the project tracks.

No private network addresses (RFC 1918), no absolute home, workspace or temp
paths, no package registry's host name (the workflows take the indexes'
addresses from repository variables) but for the one address a user needs,
PyTorch's CPU wheel index, in the files that tell it, no credential shapes, no
file over the size limit. The file list comes
from ``git ls-files`` in a git checkout and from a walk that honours
``.gitignore`` anywhere else (an unpacked sdist), so the scan runs in both.
"""

from __future__ import annotations

import ipaddress
import re
import runpy
import shutil
from pathlib import Path

import pytest

from carrier_harness.project import PROJECT_ROOT as ROOT
from carrier_harness.project import git_files, project_files

MAX_FILE_BYTES = runpy.run_path(str(ROOT / "scripts" / "check-dist"))["MAX_FILE_BYTES"]

# RFC 1918: 10/8, 172.16/12, 192.168/16. Written as integers so that this file
# does not contain the addresses it looks for.
PRIVATE_NETWORKS = (
    ipaddress.ip_network((0x0A000000, 8)),
    ipaddress.ip_network((0xAC100000, 12)),
    ipaddress.ip_network((0xC0A80000, 16)),
)
IPV4 = re.compile(r"(?<![\d.])(?:\d{1,3}\.){3}\d{1,3}(?!\.?\d)")
MACHINE_PATH = re.compile(
    r"(?<![\w.~$/:-])/(?:root|work|tmp)(?![\w.-])"  # root's home, the workspace, temp
    r"|(?<![\w.~$/:-])/(?:home|Users)/[A-Za-z0-9._-]+"  # someone's home folder
    r"|\b[A-Za-z]:\\Users\\"  # a Windows profile
)
# Package registries: these hosts and every host under them (PyPI, TestPyPI and
# their upload and file hosts, the PyPI file host, the PyPI-era python.org host,
# the PyTorch wheel indexes, NVIDIA's and vLLM's wheel indexes, conda, npm, the
# Go module proxy, crates). Joined at run time so that this file does not name
# them itself.
REGISTRY_DOMAINS = tuple(
    ".".join(labels)
    for labels in (
        ("pypi", "org"),
        ("python" + "hosted", "org"),
        ("pypi", "python", "org"),
        ("pytorch", "org"),
        ("pypi", "nvidia", "com"),
        ("pypi", "ngc", "nvidia", "com"),
        ("wheels", "vllm", "ai"),
        ("anaconda", "org"),
        ("repo", "anaconda", "com"),
        ("registry", "npmjs", "org"),
        ("proxy", "golang", "org"),
        ("crates", "io"),
    )
)
# The one registry address the repository names: scripts/setup-env's default for
# TORCH_CPU_INDEX_URL, which a user needs and cannot look up in a repository
# variable. Allowed, exactly so, only in the files that tell it.
TORCH_CPU_INDEX = "https://" + ".".join(("download", "pytorch", "org")) + "/whl/cpu"
TORCH_CPU_INDEX_FILES = ("scripts/setup-env", "docs/release.md", "README.md")
REGISTRY_HOST = re.compile(
    r"(?<![\w.-])(?:[a-z0-9-]+\.)*(?:" + "|".join(map(re.escape, REGISTRY_DOMAINS)) + r")(?![\w-])",
    re.IGNORECASE,
)
SECRETS = {
    "PyPI token": re.compile(r"pypi-AgE[A-Za-z0-9_-]{50,}"),
    "GitHub token": re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{36,}|github_pat_[A-Za-z0-9_]{22,})"),
    "AWS access key id": re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"),
    "Hugging Face token": re.compile(r"\bhf_[A-Za-z0-9]{34,}\b"),
    "private key": re.compile(r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----"),
}


def private_addresses(text: str) -> list[str]:
    found = []
    for match in IPV4.finditer(text):
        try:
            address = ipaddress.ip_address(match.group())
        except ValueError:  # e.g. 999.1.1.1: not an address at all
            continue
        if any(address in network for network in PRIVATE_NETWORKS):
            found.append(match.group())
    return found


def machine_paths(text: str) -> list[str]:
    return [match.group() for match in MACHINE_PATH.finditer(text)]


def registry_hosts(text: str) -> list[str]:
    return [match.group() for match in REGISTRY_HOST.finditer(text)]


def registry_hosts_but_the_torch_index(text: str) -> list[str]:
    return registry_hosts(re.sub(re.escape(TORCH_CPU_INDEX) + r"(?![\w/.-])", "", text))


def secrets(text: str) -> list[str]:
    # Only a prefix goes into the report: the report must not leak the secret.
    return [f"{kind}: {m[0][:12]}..." for kind, rx in SECRETS.items() for m in rx.finditer(text)]


def violations(root: Path, finder) -> list[str]:
    """``path:line: match`` for every hit of ``finder`` in the project's files."""
    hits = []
    for relative in project_files(root):
        text = (root / relative).read_bytes().decode("utf-8", errors="replace")
        for number, line in enumerate(text.splitlines(), start=1):
            hits += [f"{relative}:{number}: {hit}" for hit in finder(line)]
    return hits


# --- the project itself ---------------------------------------------------------


def test_the_scan_sees_the_project():
    files = project_files()
    for expected in ("pyproject.toml", "src/vllm_spark2_5_plugin/__init__.py", "LICENSE"):
        assert expected in files
    assert not [f for f in files if f.startswith((".venv", ".git/")) or "__pycache__" in f]


def test_no_private_network_addresses():
    assert violations(ROOT, private_addresses) == [], (
        "use loopback (127.0.0.1) or an RFC 5737 documentation address (192.0.2.x)"
    )


def test_no_absolute_machine_paths():
    assert violations(ROOT, machine_paths) == [], (
        "use paths relative to the repository, ~ or tmp_path fixtures"
    )


def test_no_package_registry_hosts():
    found = [
        hit
        for hit in violations(ROOT, registry_hosts)
        if hit.split(":", 1)[0] not in TORCH_CPU_INDEX_FILES
    ]
    found += violations(ROOT, registry_hosts_but_the_torch_index)
    assert sorted(set(found)) == [], (
        "take the index's address from a repository variable (docs/release.md, section 4)"
    )


def test_the_torch_cpu_index_is_named_where_users_read_it():
    assert violations(ROOT, registry_hosts_but_the_torch_index) == []
    files = {hit.split(":", 1)[0] for hit in violations(ROOT, registry_hosts)}
    assert "scripts/setup-env" in files
    assert files <= set(TORCH_CPU_INDEX_FILES)


def test_no_secrets():
    assert violations(ROOT, secrets) == [], "remove the credential and revoke it"


def test_no_file_over_the_size_limit():
    too_big = {
        relative: size
        for relative in project_files()
        if (size := (ROOT / relative).stat().st_size) > MAX_FILE_BYTES
    }
    assert too_big == {}, f"files over {MAX_FILE_BYTES} bytes: keep bulk out of the repository"


# --- the scanners, on planted examples (built at run time, never stored) -------


def _dotted(*octets: int) -> str:
    return ".".join(str(octet) for octet in octets)


@pytest.mark.parametrize(
    "line",
    [
        f"host = '{_dotted(10, 0, 0, 1)}'",
        f"http://{_dotted(10, 255, 3, 4)}:8000/v1",
        f"{_dotted(172, 16, 0, 1)} and nothing else",
        f"peer {_dotted(172, 31, 255, 254)}.",
        f"subnet {_dotted(172, 20, 0, 0)}/16",
        f"ssh user@{_dotted(192, 168, 1, 20)}",
        f"[{_dotted(192, 168, 0, 1)}]",
    ],
)
def test_private_addresses_are_found(tmp_path: Path, line: str):
    (tmp_path / "notes.md").write_text(f"first line\n{line}\n", encoding="utf-8")
    assert len(violations(tmp_path, private_addresses)) == 1
    assert violations(tmp_path, private_addresses)[0].startswith("notes.md:2: ")


@pytest.mark.parametrize(
    "line",
    [
        _dotted(172, 15, 0, 1),  # just below 172.16/12
        _dotted(172, 32, 0, 1),  # just above it
        _dotted(192, 0, 2, 7),  # RFC 5737 documentation
        _dotted(198, 51, 100, 1),
        _dotted(203, 0, 113, 9),
        _dotted(127, 0, 0, 1),
        f"version 1.{_dotted(10, 0, 0, 1)}",  # five parts: not an address
        "torch 2.13.0 and vllm 0.32.0",
    ],
)
def test_public_and_documentation_addresses_pass(line: str):
    assert private_addresses(line) == []


@pytest.mark.parametrize(
    "line",
    [
        "cache at " + "/".join(["", "root", ".cache", "x"]),
        "cd " + "/".join(["", "work", "main"]),
        "'" + "/".join(["", "tmp", "spark-run"]) + "'",
        "log=" + "/".join(["", "home", "alice", "log.txt"]),
        "/".join(["", "Users", "bob", "src"]),
        "\\".join(["C:", "Users", "bob", "x"]),
    ],
)
def test_machine_paths_are_found(line: str):
    assert machine_paths(line) != []


@pytest.mark.parametrize(
    "line",
    [
        "https://example.org/work/main and https://example.org/tmp/x",
        "~/.config/vllm-hust-ext/config.json",
        "$HOME/.cache",
        "src/work/tmp.py",
        "vllm serve /path/to/spark2_5-model",
        "--root /models",
    ],
)
def test_portable_paths_pass(line: str):
    assert machine_paths(line) == []


def _host(*labels: str) -> str:
    return ".".join(labels)


@pytest.mark.parametrize(
    ("line", "host"),
    [
        (f"repository-url: https://{_host('test', 'pypi', 'org')}/legacy/", "test.pypi"),
        (f"PIP_EXTRA_INDEX_URL: https://{_host('download', 'pytorch', 'org')}/whl/cpu", "download"),
        (f"url = '{_host('files', 'python' + 'hosted', 'org')}/packages/x.whl'", "files."),
        (f"see the settings page on {_host('pypi', 'org')}.", "pypi."),
        (f"<https://{_host('PyPI', 'org')}/manage/project/x/>", "PyPI."),
        (f"--index-url https://{_host('pypi', 'nvidia', 'com')}", "pypi.nvidia"),
        (f"host = {{'pypi': 'https://{_host('upload', 'pypi', 'org')}'}}", "upload."),
    ],
)
def test_registry_hosts_are_found(tmp_path: Path, line: str, host: str):
    (tmp_path / "workflow.yml").write_text(f"name: x\n{line}\n", encoding="utf-8")
    found = violations(tmp_path, registry_hosts)
    assert len(found) == 1 and found[0].startswith(f"workflow.yml:2: {host}")


@pytest.mark.parametrize(
    ("line", "allowed"),
    [
        (f"default: {TORCH_CPU_INDEX}", True),
        (f'"${{TORCH_CPU_INDEX_URL-{TORCH_CPU_INDEX}}}"', True),
        (f"({TORCH_CPU_INDEX}).", True),
        (f"{TORCH_CPU_INDEX}/torch/", False),  # a page under it, not the index
        (TORCH_CPU_INDEX.replace("/cpu", "/cu130"), False),
        (f"{TORCH_CPU_INDEX} and https://{_host('pypi', 'org')}/simple", False),
    ],
)
def test_only_the_torch_cpu_index_itself_is_allowed(line: str, allowed: bool):
    assert registry_hosts(line) != []
    assert (registry_hosts_but_the_torch_index(line) == []) is allowed


@pytest.mark.parametrize(
    "line",
    [
        "PyPI and TestPyPI, published with Trusted Publishing",
        "pip install pypi-attestations",
        "repository-url: ${{ vars.TESTPYPI_REPOSITORY_URL }}",
        '--index-url "$TESTPYPI_BASE_URL/simple/"',
        "https://example.org/pypi/simple/ and https://index.example.org/whl/cpu",
        "not" + _host("pypi", "org") + " and " + _host("pypi", "organisation"),
        "https://github.com/pypa/gh-action-pypi-publish",
    ],
)
def test_lines_without_registry_hosts_pass(line: str):
    assert registry_hosts(line) == []


@pytest.mark.parametrize(
    "line",
    [
        "token = " + "pypi-" + "AgEIcHlwaS5vcmc" + "x" * 60,
        "GH=" + "ghp" + "_" + "a1B2" * 9,
        "github" + "_pat_" + "A" * 30,
        "aws_access_key_id = " + "AKIA" + "IOSFODNN7EXAMPL" + "Q",
        "HF_TOKEN=" + "hf" + "_" + "x" * 34,
        "-----BEGIN " + "OPENSSH PRIVATE KEY-----",
        "-----BEGIN " + "PRIVATE KEY-----",
    ],
)
def test_secrets_are_found(line: str):
    assert secrets(line) != []


@pytest.mark.parametrize(
    "line", ["pip install pypi-attestations", "ghp_short", "AKIA-not-a-key", "BEGIN PUBLIC KEY"]
)
def test_harmless_lookalikes_pass(line: str):
    assert secrets(line) == []


def test_large_files_are_found(tmp_path: Path):
    (tmp_path / "small.json").write_bytes(b"x" * MAX_FILE_BYTES)
    (tmp_path / "big.log").write_bytes(b"x" * (MAX_FILE_BYTES + 1))
    sizes = {f: (tmp_path / f).stat().st_size for f in project_files(tmp_path)}
    assert [f for f, size in sizes.items() if size > MAX_FILE_BYTES] == ["big.log"]


# --- without git ------------------------------------------------------------------


def test_without_git_the_walk_lists_what_git_lists(tmp_path: Path):
    """A copy without .git (as an unpacked sdist is) yields the same files, ignored ones out."""
    tracked = project_files()
    if git_files(ROOT) is None:
        pytest.skip("not a git checkout: the git listing to compare with is unavailable")
    for relative in tracked:
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / relative, tmp_path / relative)
    # Ignored clutter that the walk must skip, including a violation in it.
    ignored = {
        ".venv/lib/site.py": f"{_dotted(10, 1, 2, 3)}\n",
        "src/vllm_spark2_5_plugin/__pycache__/x.cpython-311.pyc": "",
        "build/lib/x.py": "",
        "thing.egg-info/PKG-INFO": "",
        ".pytest_cache/v/cache": "",
    }
    for relative, text in ignored.items():
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text(text, encoding="utf-8")

    assert git_files(tmp_path) is None
    assert project_files(tmp_path) == tracked
    assert violations(tmp_path, private_addresses) == []
