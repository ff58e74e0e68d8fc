# SPDX-License-Identifier: Apache-2.0
"""Reading and writing the toolkit's files without hanging, tracebacks or half-written files."""

from __future__ import annotations

import contextlib
import json
import os
import stat
import tempfile
from pathlib import Path
from typing import Any

from vllm_hust_bundle_kit.errors import BundleError, check_nesting

# No manifest, state or source file comes near this; a larger one is refused unread.
MAX_FILE_BYTES = 4 * 1024 * 1024


def read_bytes(path: Path, what: str) -> bytes:
    """The bytes of the regular file ``path``; a FIFO, device or folder is refused unopened."""
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except (OSError, ValueError) as exc:
        raise BundleError(f"{path}: cannot read the {what} ({_reason(exc)})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise BundleError(f"{path}: the {what} is not a regular file; point to a file")
        if info.st_size > MAX_FILE_BYTES:
            raise BundleError(
                f"{path}: the {what} is {info.st_size} bytes, more than {MAX_FILE_BYTES}; "
                "point to the right file"
            )
        with os.fdopen(os.dup(fd), "rb") as file:
            return file.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise BundleError(f"{path}: cannot read the {what} ({_reason(exc)})") from None
    finally:
        os.close(fd)


def read_text(path: Path, what: str) -> str:
    try:
        return read_bytes(path, what).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BundleError(f"{path}: the {what} is not UTF-8 text ({exc.reason})") from None


def read_json(path: Path, what: str) -> Any:
    return parse_json(path, read_text(path, what), what)


def parse_json(path: Path, text: str, what: str) -> Any:
    """``text``, read from ``path``, as JSON; refused naming ``path`` as :func:`read_json`."""
    try:
        document = json.loads(text)
    except RecursionError:
        raise BundleError(f"{path}: the {what} is nested too deeply; fix the file") from None
    except ValueError as exc:
        raise BundleError(f"{path}: the {what} is not valid JSON ({exc})") from None
    check_nesting(path, document)
    return document


def write_atomically(path: Path, text: str, mode: int) -> None:
    """Write ``text`` to a temporary file next to ``path``, then rename it over ``path``."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    except (OSError, ValueError) as exc:
        raise BundleError(f"{path}: cannot write ({_reason(exc)})") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            file.write(text)
            file.flush()
            os.fsync(file.fileno())
        os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException as exc:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        if isinstance(exc, OSError):
            raise BundleError(f"{path}: cannot write ({_reason(exc)})") from None
        raise


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc)
