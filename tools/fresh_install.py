"""``scripts/check-dist --install-check``: the wheel, installed into a fresh virtual environment.

- With every carrier's switch off (its enable variable and every bundle list
  unset), the bundles are found through entry points and RECORD alone (no plugin
  import), each with its one rendered manifest; each ``vllm.general_plugins``
  entry point logs its disabled load line and imports no vLLM, torch or
  transformers.
- With every switch on and no vLLM installed, each entry point logs its enabled
  load line (naming the host as not installed), defers its registrations,
  imports none of them either and raises nothing.
- Each console script's ``validate`` passes and its ``inspect`` names the bundles.
- ``--install-from URL``: the wheel comes from the package index whose simple
  API is URL (e.g. TestPyPI after an upload), pinned to the sha256 of the wheel
  built, so only those exact bytes install.
- ``--audit``: ``pip-audit`` the exact versions the install resolved. A known
  vulnerability fails the check only if it is in a dependency this project
  declares and a fixed version exists (raise that lower bound in pyproject.toml);
  one in another package (a dependency's dependency) or without a fix is printed,
  not failed. If pip-audit cannot audit every version (its vulnerability service
  is unreachable: offline), the audit is skipped with a message that says so.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

HEAVY_MODULES = ("vllm", "torch", "transformers")
BUNDLE_GROUP = "vllm_hust.extension_bundles"
PLUGIN_GROUP = "vllm.general_plugins"
MANIFEST_NAME = re.compile(r"vllm-hust-extension-v[0-9][0-9.]*\.json")
# A fresh upload can take a few minutes to show in an index's simple API.
INDEX_ATTEMPTS, INDEX_WAIT_SECONDS = 10, 30
# Marks the probe's report among the load lines the entry points print.
REPORT_PREFIX = "install-probe report: "

# Runs in the fresh environment, isolated (-I) from this checkout: what discovery
# finds through the installed metadata, then what calling the plugin entry points
# imports.
_PROBE = r"""
import json, sys
from importlib.metadata import distribution

name, package, bundle_group, plugin_group, heavy, prefix = sys.argv[1:7]
dist = distribution(name)
bundles = {
    ep.name: [
        json.loads(f.locate().read_text(encoding="utf-8"))
        for f in dist.files
        if f.parent.as_posix() == ep.value.replace(".", "/")
        and f.name.startswith("vllm-hust-extension-v")
    ]
    for ep in dist.entry_points
    if ep.group == bundle_group
}
imported_by_discovery = sorted(m for m in sys.modules if m.split(".")[0] == package)
plugins = [ep for ep in dist.entry_points if ep.group == plugin_group]
for ep in plugins:
    ep.load()()
heavy_imported = sorted(m for m in sys.modules if m.split(".")[0] in heavy.split(","))
print(prefix + json.dumps({
    "version": dist.version, "bundles": bundles, "plugins": len(plugins),
    "imported_by_discovery": imported_by_discovery, "heavy_imported": heavy_imported,
}))
"""


def check(
    wheel: Path, project, problems: list[str], index_url: str | None = None, audit: bool = False
) -> None:
    """Install ``wheel`` (``project``: check-dist's ``Project``) and check it, adding problems."""
    label = f"{wheel.name} (fresh install{f' from {index_url}' if index_url else ''})"
    with tempfile.TemporaryDirectory(prefix="check-dist-") as tmp:
        venv = Path(tmp) / "venv"
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        error = _install(venv, wheel, project, index_url, Path(tmp))
        if error is not None:
            problems.append(f"{label}: pip install failed:\n{error}")
            return
        # Every carrier must be off by default: drop every variable that could switch one on.
        switches = carrier_switches(wheel)
        off = {
            key: value
            for key, value in os.environ.items()
            if key not in switches and "EXT_ENABLED_BUNDLES" not in key and key != "PYTHONPATH"
        }
        report = _check_switch(label, venv, project, off, False, problems)
        if report is None:
            return
        _judge_discovery(label, report, project, problems)
        _check_switch(label, venv, project, {**off, **dict.fromkeys(switches, "1")}, True, problems)
        _check_bundle_cli(label, venv, project, off, problems)
        if audit:
            _audit_install(venv, wheel, project, off, problems)


def carrier_switches(wheel: Path) -> set[str]:
    """The variables the wheel's bundle manifests inject to enable their carriers."""
    with zipfile.ZipFile(wheel) as archive:
        manifests = [n for n in archive.namelist() if MANIFEST_NAME.fullmatch(n.rsplit("/")[-1])]
        return {
            name
            for manifest in manifests
            for name in json.loads(archive.read(manifest))
            .get("activation", {})
            .get("environment", {})
        }


def _install(venv: Path, wheel: Path, project, index_url: str | None, tmp: Path) -> str | None:
    """Install the wheel (from ``index_url``, pinned to its sha256); pip's error or None."""
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
    pip += ["--disable-pip-version-check"]
    if index_url is None:
        done = subprocess.run([*pip, str(wheel)], capture_output=True, text=True)
        return None if done.returncode == 0 else done.stderr.strip()
    requires = _requires(wheel, project)
    if requires:  # the dependencies from the default index; only the wheel is pinned
        done = subprocess.run([*pip, *requires], capture_output=True, text=True)
        if done.returncode != 0:
            return done.stderr.strip()
    pinned = tmp / "pinned.txt"
    sha256 = hashlib.sha256(wheel.read_bytes()).hexdigest()
    pinned.write_text(f"{project.name}=={project.version} --hash=sha256:{sha256}\n")
    pip += ["--no-deps", "--require-hashes", "--only-binary", ":all:", "--no-cache-dir"]
    for attempt in range(INDEX_ATTEMPTS):
        done = subprocess.run(
            [*pip, "--index-url", index_url, "-r", str(pinned)], capture_output=True, text=True
        )
        if done.returncode == 0 or "No matching distribution" not in done.stderr:
            break
        if attempt + 1 < INDEX_ATTEMPTS:
            time.sleep(INDEX_WAIT_SECONDS)
    return None if done.returncode == 0 else done.stderr.strip()


def _requires(wheel: Path, project) -> list[str]:
    """The wheel's Requires-Dist: the dependencies this project declares."""
    with zipfile.ZipFile(wheel) as archive:
        return project.metadata(archive).requires or []


def requirement_name(requirement: str) -> str:
    """The normalized (PEP 503) distribution name a requirement or a pin names."""
    name = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement.strip())
    return re.sub(r"[-_.]+", "-", name.group(0) if name else requirement).lower()


def _check_switch(
    label: str, venv: Path, project, env: dict[str, str], on: bool, problems: list[str]
) -> dict | None:
    """Call every plugin entry point with every carrier's switch on (where vLLM is
    missing, so registrations wait for its registries, which never load) or off: each
    logs one load line saying so, imports no vLLM, torch or transformers and raises
    nothing. The probe's report, or None if the probe failed."""
    probe = [str(venv / "bin" / "python"), "-I", "-c", _PROBE, project.name, project.package]
    probe += [BUNDLE_GROUP, PLUGIN_GROUP, ",".join(HEAVY_MODULES), REPORT_PREFIX]
    done = subprocess.run(probe, capture_output=True, text=True, env=env, cwd=venv.parent)
    lines = (done.stdout + done.stderr).strip().splitlines()
    reports = [line.removeprefix(REPORT_PREFIX) for line in lines if line.startswith(REPORT_PREFIX)]
    printed = "\n".join(line for line in lines if not line.startswith(REPORT_PREFIX))
    switch = "the switch on and no vLLM installed" if on else "the switch off"
    if done.returncode != 0 or not reports:
        problems.append(
            f"{label}: the probe with {switch} exited {done.returncode}:\n{printed or '(nothing)'}"
        )
        return None
    report = json.loads(reports[0])
    if report["heavy_imported"]:
        problems.append(f"{label}: register() with {switch} imported {report['heavy_imported']}")
    enabled = f"enabled={int(on)}"
    load_lines = [line for line in printed.splitlines() if " loaded (" in line]
    if (
        "ERROR" in printed
        or len(load_lines) != report["plugins"]
        or not all(enabled in line for line in load_lines)
    ):
        problems.append(
            f"{label}: with {switch}, register() must log one load line with {enabled} per "
            f"entry point and no ERROR; it printed:\n{printed or '(nothing)'}"
        )
    return report


def _judge_discovery(label: str, report: dict, project, problems: list[str]) -> None:
    """What the installed metadata alone finds is what pyproject.toml declares."""
    if report["version"] != project.version:
        problems.append(f"{label}: installed version {report['version']} != {project.version}")
    expected_bundles = set(project.entry_points.get(BUNDLE_GROUP, {}))
    if set(report["bundles"]) != expected_bundles:
        problems.append(
            f"{label}: the installed metadata discovers bundles {sorted(report['bundles'])}, "
            f"pyproject.toml declares {sorted(expected_bundles)}"
        )
    for extension_id, manifests in report["bundles"].items():
        ids = [manifest.get("extension_id") for manifest in manifests]
        if ids != [extension_id]:
            problems.append(f"{label}: bundle {extension_id} resolves to manifests with ids {ids}")
    if report["imported_by_discovery"]:
        problems.append(
            f"{label}: {report['imported_by_discovery']} were imported before any entry point "
            "was loaded (a .pth file?); discovery must read metadata only"
        )


def _check_bundle_cli(
    label: str, venv: Path, project, env: dict[str, str], problems: list[str]
) -> None:
    """Each console script is installed; ``validate`` passes; ``inspect`` runs (1: a host
    problem, here no vLLM) and names every bundle."""
    for script in project.entry_points.get("console_scripts", {}):
        command = venv / "bin" / script
        if not command.is_file():
            problems.append(f"{label}: console script {script} was not installed")
            continue
        validate = subprocess.run([command, "validate"], capture_output=True, text=True, env=env)
        if validate.returncode != 0:
            problems.append(
                f"{label}: {script} validate exited {validate.returncode}:\n"
                f"{(validate.stdout + validate.stderr).strip()}"
            )
        inspect = subprocess.run([command, "inspect"], capture_output=True, text=True, env=env)
        missing = [i for i in project.entry_points.get(BUNDLE_GROUP, {}) if i not in inspect.stdout]
        if inspect.returncode not in (0, 1) or missing:
            problems.append(
                f"{label}: {script} inspect exited {inspect.returncode} without naming "
                f"{missing or 'a problem'}:\n{(inspect.stdout + inspect.stderr).strip()}"
            )


def _audit_install(
    venv: Path, wheel: Path, project, env: dict[str, str], problems: list[str]
) -> None:
    """Audit what the install resolved, but this project itself."""
    freeze = [venv / "bin" / "python", "-m", "pip", "freeze", "--exclude", project.name]
    frozen = subprocess.run(freeze, capture_output=True, text=True, env=env, check=True)
    pins = [line for line in frozen.stdout.splitlines() if "==" in line]
    runtime = [r for r in _requires(wheel, project) if not re.search(r"\bextra\s*==", r)]
    audit_dependencies(pins, {requirement_name(r) for r in runtime}, problems)


def audit_dependencies(pins: list[str], declared: set[str], problems: list[str]) -> None:
    """pip-audit the pinned versions (``name==version``). A problem only for a declared
    dependency (``declared``: normalized names) with a known vulnerability that a
    released version fixes; anything else is printed."""
    with tempfile.TemporaryDirectory(prefix="check-dist-audit-") as tmp:
        requirements = Path(tmp) / "pins.txt"
        requirements.write_text("".join(f"{pin}\n" for pin in pins), encoding="utf-8")
        # --no-deps --disable-pip: the pins are the whole set, no resolving, no index;
        # --strict: a version it could not audit stops it, so no report means skipped.
        command = [sys.executable, "-m", "pip_audit", "--requirement", str(requirements)]
        command += ["--no-deps", "--disable-pip", "--strict", "--progress-spinner", "off"]
        done = subprocess.run([*command, "--format", "json"], capture_output=True, text=True)
    if "No module named pip_audit" in done.stderr:
        problems.append(
            "dependency audit: pip-audit is not installed in this Python "
            "(it is one of the test extras; CI pins it in the publish workflow)"
        )
        return
    try:
        report = json.loads(done.stdout)
    except ValueError:
        error = (done.stderr.strip().splitlines() or ["no output"])[-1]
        _note(
            "dependency audit skipped: pip-audit got no answer from its vulnerability "
            f"service ({error}); run the check where the network reaches it"
        )
        return
    for dep in report["dependencies"]:
        for vuln in dep.get("vulns", []):
            found = f"{dep['name']} {dep['version']} has {vuln['id']}"
            fixes = vuln["fix_versions"]
            if dep["name"] in declared and fixes:
                problems.append(
                    f"dependency audit: {found}, fixed in {', '.join(fixes)}: raise its lower "
                    "bound in pyproject.toml [project] dependencies to a fixed version"
                )
            else:
                why = "not a dependency this project declares" if fixes else "no fixed release"
                _note(f"dependency audit: {found} (not failed: {why})")


def _note(message: str) -> None:
    print(f"check-dist: {message}", file=sys.stderr)
