"""The Markdown stays small enough to read, and everything it points at exists.

Budget: all tracked Markdown together at most 110 KB, no file over 15 KB. Pointers:
every relative link ``[text](path#anchor)`` reaches a file (and, with an anchor,
a heading of it, slugged as GitHub does, or an ``<a id>``), and every repository
path written in an inline code span (``scripts/run-tests``,
``extensions/spark2_5/benchmarks/bench_model.py``, ...) names a file or folder
the project has. A path in a carrier's docs may also be relative to the carrier's
folder (``extensions/<carrier>/``), as its generated evidence report writes them.
Fenced blocks are commands and their outputs, not pointers: they are not read.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import PurePosixPath

import pytest

from carrier_harness.project import PROJECT_ROOT as ROOT
from carrier_harness.project import project_files

TOTAL_BYTES = 110 * 1000
FILE_BYTES = 15 * 1000

FENCE = re.compile(r"^ {0,3}(```|~~~)[^\n]*\n.*?^ {0,3}\1[ \t]*$", re.MULTILINE | re.DOTALL)
INLINE_CODE = re.compile(r"(`+)(.+?)\1", re.DOTALL)
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s.*)?$", re.MULTILINE)
HEADING = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.*?)[ \t#]*$", re.MULTILINE)
HTML_ID = re.compile(r"<a\s+(?:[^>]*\s)?(?:id|name)=\"([^\"]+)\"", re.IGNORECASE)
EXTERNAL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")  # https:, mailto:, ...
# A word that is a path: no placeholders, wildcards, variables or options.
PATH_WORD = re.compile(r"[\w.~-]+(?:/[\w.-]+)*/?")
# Options whose value names a file the command writes, not one the project has.
OUTPUT_OPTIONS = {"--out", "--outdir", "--workdir", "-d", "-o"}
# A partial path to one of these is still a pointer: it must end a project file's path.
FILE_SUFFIXES = (".py", ".md", ".json", ".toml", ".yml", ".yaml", ".txt")
# Where the docs cite another project's source by its own path.
FOREIGN_PACKAGES = {"vllm"}
# A file at the top of the repository, named alone in a code span.
ROOT_FILE = re.compile(r"[A-Z][A-Z_]*\.md|[\w-]+\.toml")


def markdown_files() -> list[str]:
    return [relative for relative in project_files() if relative.endswith(".md")]


@cache
def _files() -> frozenset[str]:
    return frozenset(project_files())


@cache
def _folders() -> frozenset[str]:
    return frozenset(
        str(parent)
        for relative in _files()
        for parent in PurePosixPath(relative).parents
        if str(parent) != "."
    )


def _exists(relative: str) -> bool:
    relative = relative.rstrip("/")
    return relative in _files() or relative in _folders()


def _without_code(text: str) -> str:
    """The text with fenced blocks and inline code spans blanked out."""
    text = FENCE.sub("", text)
    return INLINE_CODE.sub(lambda m: " " * len(m.group(0)), text)


def _code_spans(text: str) -> list[str]:
    return [match.group(2).strip() for match in INLINE_CODE.finditer(FENCE.sub("", text))]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: the rendered text, lower case, punctuation
    other than ``-`` and ``_`` dropped, each space a ``-``."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = text.replace("`", "").replace("*", "")
    text = re.sub(r"(?<!\w)_+|_+(?!\w)", "", text)  # _emphasis_, not snake_case
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(relative: str) -> set[str]:
    text = (ROOT / relative).read_text(encoding="utf-8")
    found, seen = set(), {}
    for _, title in HEADING.findall(FENCE.sub("", text)):
        base = slug(title)
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found | set(HTML_ID.findall(text))


def _carrier_folder(relative: str) -> str | None:
    parts = PurePosixPath(relative).parts
    return "/".join(parts[:2]) if len(parts) > 2 and parts[0] == "extensions" else None


def broken_links(relative: str) -> list[str]:
    text = (ROOT / relative).read_text(encoding="utf-8")
    prose = _without_code(text)
    targets = LINK.findall(prose) + REFERENCE.findall(prose)
    problems = []
    for target in targets:
        if not target or EXTERNAL.match(target):
            continue
        path, _, anchor = target.partition("#")
        if path:
            resolved = (PurePosixPath(relative).parent / path).as_posix()
            parts = []
            for part in resolved.split("/"):
                if part == "..":
                    if not parts:
                        parts = None
                        break
                    parts.pop()
                elif part not in ("", "."):
                    parts.append(part)
            resolved = "/".join(parts) if parts is not None else None
            if resolved is None or not _exists(resolved):
                problems.append(f"{relative}: link to {target}: no such file")
                continue
        else:
            resolved = relative
        if anchor:
            if not resolved.endswith(".md"):
                problems.append(f"{relative}: link to {target}: an anchor into a non-Markdown file")
            elif anchor not in anchors(resolved):
                problems.append(f"{relative}: link to {target}: {resolved} has no such heading")
    return problems


def _top_level() -> set[str]:
    return {PurePosixPath(relative).parts[0] for relative in _files()}


def named_paths(relative: str) -> list[str]:
    """The repository paths the inline code spans of a Markdown file name."""
    top = _top_level()
    carrier = _carrier_folder(relative)
    carrier_top = (
        {PurePosixPath(f).parts[2] for f in _files() if f.startswith(carrier + "/")}
        if carrier
        else set()
    )
    named = []
    for span in _code_spans((ROOT / relative).read_text(encoding="utf-8")):
        words = span.split()
        for index, word in enumerate(words):
            if index and words[index - 1] in OUTPUT_OPTIONS:
                continue
            word = word.split("::", 1)[0].rstrip(".,;:)").lstrip("(")
            if not PATH_WORD.fullmatch(word) or word.startswith(("~", "-")):
                continue
            first = word.split("/", 1)[0]
            if "/" in word and (first in top or first in carrier_top):
                named.append(word)
            elif "/" in word and word.endswith(FILE_SUFFIXES) and first not in FOREIGN_PACKAGES:
                named.append(word)  # partial: `spark2_5_dev/reference.py`
            elif len(words) == 1 and ROOT_FILE.fullmatch(word):
                named.append(word)  # a file at the top: `manifest.toml`, `MAINTAINERS.md`
    return named


def _found(name: str, carrier: str | None) -> bool:
    if _exists(name) or (carrier and _exists(f"{carrier}/{name}")):
        return True
    first = name.split("/", 1)[0]
    partial = first not in _top_level() and not (carrier and _exists(f"{carrier}/{first}"))
    return partial and any(relative.endswith("/" + name) for relative in _files())


def missing_paths(relative: str) -> list[str]:
    carrier = _carrier_folder(relative)
    return [
        f"{relative}: `{name}` does not exist"
        for name in named_paths(relative)
        if not _found(name, carrier)
    ]


# --- the budget -------------------------------------------------------------------------


def test_the_markdown_is_found():
    found = markdown_files()
    for expected in ("README.md", "CHANGELOG.md", "docs/release.md"):
        assert expected in found
    assert any(relative.startswith("extensions/") for relative in found)


def test_all_markdown_together_stays_within_the_budget():
    sizes = {relative: (ROOT / relative).stat().st_size for relative in markdown_files()}
    total = sum(sizes.values())
    largest = sorted(sizes.items(), key=lambda item: -item[1])[:5]
    assert total <= TOTAL_BYTES, (
        f"tracked Markdown is {total} bytes, over {TOTAL_BYTES}; largest: {largest}. "
        "Move measurement detail into the evidence records and cite them."
    )


@pytest.mark.parametrize("relative", markdown_files())
def test_no_markdown_file_is_over_the_limit(relative: str):
    size = (ROOT / relative).stat().st_size
    assert size <= FILE_BYTES, f"{relative} is {size} bytes, over {FILE_BYTES}"


# --- the pointers -----------------------------------------------------------------------


@pytest.mark.parametrize("relative", markdown_files())
def test_every_relative_link_reaches_its_file_and_heading(relative: str):
    assert broken_links(relative) == []


@pytest.mark.parametrize("relative", markdown_files())
def test_every_repository_path_in_code_exists(relative: str):
    assert missing_paths(relative) == []


# --- the checks themselves, on planted examples -------------------------------------------


@pytest.mark.parametrize(
    ("heading", "expected"),
    [
        ("The GPU run (ready, not yet run)", "the-gpu-run-ready-not-yet-run"),
        ("`tool_choice`", "tool_choice"),
        ("Thinking (reasoning parsers)", "thinking-reasoning-parsers"),
        (
            "Memory: `max_position_embeddings` 1,048,576 versus 8,192",
            "memory-max_position_embeddings-1048576-versus-8192",
        ),
        (
            "2. Host-range policy: pin what was verified",
            "2-host-range-policy-pin-what-was-verified",
        ),
        ("**Bold** and [a link](x.md)", "bold-and-a-link"),
    ],
)
def test_headings_slug_as_github_does(heading: str, expected: str):
    assert slug(heading) == expected


@pytest.fixture
def planted(tmp_path, monkeypatch):
    """Writes a Markdown file into an otherwise tiny project at ``tmp_path``."""

    def plant(relative: str, text: str) -> None:
        files = {
            relative: text,
            "docs/target.md": "# Target\n\n## A section\n",
            "scripts/run-tests": "",
        }
        for name, content in files.items():
            (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / name).write_text(content, encoding="utf-8")
        monkeypatch.setitem(globals(), "ROOT", tmp_path)
        monkeypatch.setitem(globals(), "project_files", lambda: sorted(files))
        _files.cache_clear()
        _folders.cache_clear()

    yield plant
    _files.cache_clear()
    _folders.cache_clear()


@pytest.mark.parametrize(
    "line",
    [
        "See [the target](missing.md).",
        "See [the target](target.md#no-such-section).",
        "See [here](#nowhere).",
        "See [up](../../outside.md).",
    ],
)
def test_a_broken_link_is_found(planted, line: str):
    planted("docs/page.md", f"# Page\n\n{line}\n")
    assert len(broken_links("docs/page.md")) == 1


@pytest.mark.parametrize(
    "line",
    [
        "See [the target](target.md) and [its section](target.md#a-section).",
        "See [this page](#page) and [the web](https://example.org/x.md).",
        "Not a link: `[x](missing.md)`.",
        "```text\n[x](missing.md)\n```",
    ],
)
def test_a_good_link_passes(planted, line: str):
    planted("docs/page.md", f"# Page\n\n{line}\n")
    assert broken_links("docs/page.md") == []


@pytest.mark.parametrize(
    ("line", "missing"),
    [
        ("Run `scripts/run-test`.", 1),
        ("Run `scripts/run-tests` and `docs/target.md`.", 0),
        ("Run `.venv/bin/python scripts/nothing --out scripts/new.json`.", 1),
        ("Writes `--out docs/new.json`; reads `vllm/v1/attention/cpu_attn.py`.", 0),
        ("Folders `docs/` and `scripts/`, a pattern `docs/*.md`, `docs/<name>.md`.", 0),
        ("```bash\nscripts/nothing\n```", 0),
        ("The shape is in `testing/shape.py`; the page in `docs/target.md`.", 1),
        ("The page is `target.md` in `other/docs/target.md`, i.e. `docs/target.md`.", 1),
        ("Edit `MAINTAINER.md` and `pyproject.toml`, not `LICENSE`.", 2),
    ],
)
def test_a_missing_path_is_found(planted, line: str, missing: int):
    planted("docs/page.md", f"# Page\n\n{line}\n")
    assert len(missing_paths("docs/page.md")) == missing
