"""Package indexes the setup-env tests build: tiny wheels, PEP 503 pages, a loopback index.

Nothing here is installed: pip only resolves against these indexes (``--dry-run``).
"""

from __future__ import annotations

import contextlib
import functools
import html
import http.server
import os
import shutil
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

from packaging.utils import canonicalize_name


def build_wheel(folder: Path, name: str, version: str, headers: list[str]) -> Path:
    """A metadata-only ``py3-none-any`` wheel; ``headers`` are extra METADATA lines."""
    stem = f"{canonicalize_name(name).replace('-', '_')}-{version}"
    dist_info = f"{stem}.dist-info"
    metadata = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}", *headers]
    files = {
        f"{dist_info}/METADATA": "\n".join(metadata) + "\n",
        f"{dist_info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    record = [*files, f"{dist_info}/RECORD"]
    files[f"{dist_info}/RECORD"] = "".join(f"{member},,\n" for member in record)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{stem}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        for member, text in files.items():
            wheel.writestr(member, text)
    return path


def build_simple_index(root: Path, wheels: list[Path]) -> Path:
    """A PEP 503 index under ``root`` (``simple/`` pages, ``files/`` copies of ``wheels``).

    Returns the ``simple/`` folder.
    """
    simple, stored = root / "simple", root / "files"
    stored.mkdir(parents=True, exist_ok=True)
    projects: dict[str, list[str]] = {}
    for wheel in wheels:
        shutil.copy2(wheel, stored / wheel.name)
        projects.setdefault(canonicalize_name(wheel.name.split("-")[0]), []).append(wheel.name)
    for project, names in projects.items():
        (simple / project).mkdir(parents=True, exist_ok=True)
        links = "".join(
            f'<a href="../../files/{quote(name)}">{html.escape(name)}</a>\n' for name in names
        )
        (simple / project / "index.html").write_text(f"<html><body>\n{links}</body></html>\n")
    listing = "".join(f'<a href="{project}/">{project}</a>\n' for project in projects)
    (simple / "index.html").write_text(f"<html><body>\n{listing}</body></html>\n")
    return simple


class _CountingHandler(http.server.SimpleHTTPRequestHandler):
    def __init__(self, *args, requests: list[str], **kwargs) -> None:
        self._requests = requests
        super().__init__(*args, **kwargs)

    def do_GET(self) -> None:
        self._requests.append(self.path)
        super().do_GET()

    def log_message(self, format: str, *args: object) -> None:  # keep test output clean
        pass


@contextlib.contextmanager
def serve_index(root: Path) -> Iterator[tuple[str, list[str]]]:
    """Serve ``root`` on loopback; yield its ``simple/`` URL and the list of paths requested."""
    requests: list[str] = []
    handler = functools.partial(_CountingHandler, requests=requests, directory=str(root))
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler) as server:
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield f"http://127.0.0.1:{server.server_address[1]}/simple/", requests
        finally:
            server.shutdown()
            thread.join()


def isolated_pip_env(index_url: str, cache: Path) -> dict[str, str]:
    """This process's environment with pip configured by ``index_url`` alone."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("PIP_")}
    for proxy in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        env.pop(proxy, None)
    env.update(
        PIP_CONFIG_FILE=os.devnull,  # no pip.conf of this machine or user
        PIP_INDEX_URL=index_url,
        PIP_CACHE_DIR=str(cache),
        PIP_DISABLE_PIP_VERSION_CHECK="1",
        NO_PROXY="127.0.0.1,localhost",
    )
    return env
