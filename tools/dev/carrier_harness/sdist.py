"""A release's source distribution from pip's package index, without building it.

``pip download --no-binary :all:`` builds a source distribution's metadata first,
which vLLM's cannot do on a machine without its build requirements. This reads
the index pip is configured with (its JSON simple API, PEP 691) and downloads
the file itself, checked against the index's sha256, into a cache outside the
checkout.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path
from urllib.parse import urljoin

from packaging.utils import canonicalize_name

JSON_SIMPLE = "application/vnd.pypi.simple.v1+json"


def index_url() -> str:
    """The index pip resolves against here: ``PIP_INDEX_URL``, pip's configuration, or
    pip's default."""
    if os.environ.get("PIP_INDEX_URL"):
        return os.environ["PIP_INDEX_URL"]
    configured = subprocess.run(
        [sys.executable, "-m", "pip", "config", "get", "global.index-url"],
        capture_output=True,
        text=True,
    )
    if configured.returncode == 0 and configured.stdout.strip():
        return configured.stdout.strip()
    from pip._internal.models.index import PyPI

    return PyPI.simple_url


def fetch_sdist(name: str, version: str, cache: Path) -> Path:
    """The ``name`` ``version`` source distribution in ``cache`` (downloaded once)."""
    filename = f"{canonicalize_name(name).replace('-', '_')}-{version}.tar.gz"
    target = cache / filename
    if target.is_file():
        return target
    page_url = f"{index_url().rstrip('/')}/{canonicalize_name(name)}/"
    request = urllib.request.Request(page_url, headers={"Accept": JSON_SIMPLE})
    with urllib.request.urlopen(request, timeout=60) as page:
        files = json.load(page)["files"]
    found = [f for f in files if f["filename"].lower() == filename.lower()]
    if not found:
        raise FileNotFoundError(f"{page_url} lists no {filename}")
    cache.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".part")
    with urllib.request.urlopen(urljoin(page_url, found[0]["url"]), timeout=600) as remote:
        partial.write_bytes(remote.read())
    digest = hashlib.sha256(partial.read_bytes()).hexdigest()
    if digest != found[0]["hashes"]["sha256"]:
        partial.unlink()
        raise ValueError(f"{filename}: sha256 {digest} is not the index's")
    partial.rename(target)
    return target
