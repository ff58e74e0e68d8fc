"""Check every touchpoint of the carrier (:mod:`spark2_5_dev.touchpoints`) in a vLLM
release's source, without installing it: the module is there, it defines or
re-exports the symbol, the symbol takes the carrier's calls (a pydantic model by its
fields, a dataclass by its fields), its source still does what the carrier's hooks
wait for, and vLLM's methods pass nothing the carrier's overrides cannot take.

    python -m spark2_5_dev.source_check 0.34.0        # pip downloads the wheel, cached
    python -m spark2_5_dev.source_check DIR/vllm-0.34.0-cp38-abi3-manylinux_2_28_x86_64.whl
    python -m spark2_5_dev.source_check SITE_PACKAGES/vllm     # an installed release

One row per touchpoint: ``ok``; ``BROKEN``, the carrier fails there; ``missing``, the
carrier detects the absence and goes without (the detail says what it loses). Exit
1 when any is BROKEN (with ``--strict``, or missing): a newer release with a missing
touchpoint is worth a look even where the carrier copes.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import subprocess
import sys
import zipfile
from pathlib import Path

from carrier_harness.source_tree import Found, SourceTree, signature
from spark2_5_dev.touchpoints import CARRIER, SRC, Touchpoint, call_problem, not_taken, touchpoints

OK, BROKEN, MISSING = "ok", "BROKEN", "missing"


@dataclasses.dataclass(frozen=True)
class Result:
    touchpoint: Touchpoint
    status: str
    detail: str


def locate(tree: SourceTree, touchpoint: Touchpoint) -> tuple[Found | None, str]:
    """The symbol in the first of its modules the tree has, or None and why not."""
    module = next((name for name in touchpoint.modules if tree.module(name)), None)
    if module is None:
        return None, f"no module {' or '.join(touchpoint.modules)}"
    found = tree.lookup(module, touchpoint.path)
    if found is None:
        return None, f"{module} has no {'.'.join(touchpoint.path)}"
    return found, module


def mentions(text: str, snippet: str) -> bool:
    """Whether ``snippet`` is in ``text`` as written, not as the tail of a longer name
    (``split_delta(`` is not in ``events.split_delta(x)``)."""
    start = text.find(snippet)
    while start >= 0:
        before = text[start - 1] if start else " "
        if not (snippet[0].isidentifier() and (before.isalnum() or before in "_.")):
            return True
        start = text.find(snippet, start + 1)
    return False


def problems(tree: SourceTree, touchpoint: Touchpoint, found: Found, carrier: SourceTree):
    """What of ``touchpoint`` the release's ``found`` no longer does, and notes."""
    wrong, notes = [], []
    if touchpoint.calls:
        accepted = signature(tree, found)
        if accepted is None:
            notes.append("its constructor comes from outside vLLM: calls not checked")
        else:
            failed = [p for call in touchpoint.calls if (p := call_problem(accepted, call))]
            if len(failed) == len(touchpoint.calls):
                wrong.append("; or ".join(failed))
    statements = tree.statements(found) if touchpoint.does else []
    wrong += [
        f"no `{snippet}` in {found.where}"
        for snippet in touchpoint.does
        if not any(mentions(text, snippet) for text in statements)
    ]
    if touchpoint.overridden_by:
        module, _, path = touchpoint.overridden_by.partition(":")
        ours = carrier.lookup(module, tuple(path.split(".")))
        base = signature(tree, found)
        missing = not_taken(base, signature(carrier, ours)) if base and ours else []
        if missing:
            wrong.append(f"vLLM now passes {missing} (its signature {base}); {path} lacks them")
    return wrong, notes


def check(tree: SourceTree, touchpoint: Touchpoint, carrier: SourceTree) -> Result:
    found, where = locate(tree, touchpoint)
    if found is None:
        if touchpoint.without:
            return Result(touchpoint, MISSING, f"{where}: {touchpoint.without}")
        return Result(touchpoint, BROKEN, where)
    wrong, notes = problems(tree, touchpoint, found, carrier)
    if wrong:
        return Result(touchpoint, BROKEN, "; ".join(wrong))
    return Result(touchpoint, OK, "; ".join([found.where, *notes]))


def carrier_tree() -> SourceTree:
    """The carrier's own source, whose overrides must take what vLLM passes."""
    return SourceTree(SRC, (CARRIER,))


def check_all(tree: SourceTree) -> list[Result]:
    carrier = carrier_tree()
    return [check(tree, touchpoint, carrier) for touchpoint in touchpoints()]


# --- where the source comes from ---------------------------------------------------------


def default_cache() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "vllm-hust-carriers" / "source-check"


def download(version: str, cache: Path) -> Path:
    """vLLM ``version``'s wheel, downloaded by pip from its configured index once."""
    cache.mkdir(parents=True, exist_ok=True)
    wheels = sorted(cache.glob(f"vllm-{version}-*.whl"))
    if not wheels:
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary"]
        command += [":all:", "--quiet", "-d", str(cache), f"vllm=={version}"]
        subprocess.run(command, check=True)
        wheels = sorted(cache.glob(f"vllm-{version}-*.whl"))
    if not wheels:
        raise SystemExit(f"source_check: pip downloaded no vllm-{version} wheel into {cache}")
    return wheels[-1]


def unpack_wheel(wheel: Path, into: Path) -> Path:
    """The Python files of ``wheel`` under ``into/<wheel name>/`` (once); that folder."""
    folder = into / wheel.name.removesuffix(".whl")
    done = folder / ".unpacked"
    if not done.exists():
        with zipfile.ZipFile(wheel) as archive:
            for name in archive.namelist():
                if name.endswith(".py") and ".dist-info/" not in name:
                    archive.extract(name, folder)
        done.touch()
    return folder


def tree_root(path: Path) -> Path:
    """The folder holding the packages: ``path`` itself, or its parent when ``path`` is
    a package (``site-packages/vllm``)."""
    return path.parent if (path / "__init__.py").is_file() else path


def source(release: str, cache: Path) -> Path:
    """The folder holding ``vllm/`` for a release, a wheel or a folder."""
    path = Path(release)
    if path.is_dir():
        return tree_root(path)
    if path.suffix == ".whl":
        return unpack_wheel(path, cache)
    return unpack_wheel(download(release, cache), cache)


# --- the report ------------------------------------------------------------------------


def table(results: list[Result], markdown: bool) -> str:
    rows = [(r.touchpoint.symbol, r.status, r.detail, r.touchpoint.fix) for r in results]
    header = ("touchpoint", "status", "detail", "fix")
    if markdown:
        lines = ["| " + " | ".join(header) + " |", "|---|---|---|---|"]
        cells = (" | ".join(cell.replace("|", "\\|") for cell in row) for row in rows)
        return "\n".join([*lines, *(f"| {row} |" for row in cells)])
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(2)]
    return "\n".join(
        f"{row[0]:<{widths[0]}}  {row[1]:<{widths[1]}}  {row[2]}  [fix: {row[3]}]"
        for row in [header, *rows]
    )


def summary(results: list[Result]) -> str:
    counts = {
        status: [r for r in results if r.status == status] for status in (OK, BROKEN, MISSING)
    }
    line = f"{len(results)} touchpoints: " + ", ".join(
        f"{len(found)} {status}" for status, found in counts.items()
    )
    for status in (BROKEN, MISSING):
        if counts[status]:
            line += f"\n{status}: " + ", ".join(r.touchpoint.symbol for r in counts[status])
    return line


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=f"python -m {__spec__.name}", description=__doc__.splitlines()[0]
    )
    parser.add_argument("release", help="a vLLM version, a wheel, or a folder with vllm/")
    parser.add_argument("--cache", type=Path, default=default_cache(), help="for wheels")
    parser.add_argument("--strict", action="store_true", help="a missing touchpoint fails too")
    parser.add_argument("--markdown", action="store_true", help="the table in Markdown")
    args = parser.parse_args(argv)
    results = check_all(SourceTree(source(args.release, args.cache), ("vllm",)))
    print(table(results, args.markdown))
    print()
    print(summary(results))
    failing = {BROKEN, MISSING} if args.strict else {BROKEN}
    return int(any(result.status in failing for result in results))


if __name__ == "__main__":
    sys.exit(main())
