"""``python -m spark2_5_dev.source_check``: every touchpoint checked in a release's
source without installing it. On the installed vLLM it finds nothing broken; on a
copy of the files it reads, with a keyword renamed, a symbol removed, a call site
removed and a model field renamed, it names each; a missing touchpoint the carrier
copes without fails only ``--strict``."""

from __future__ import annotations

import ast
import shutil
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest

from carrier_harness.source_tree import SourceTree
from spark2_5_dev import source_check
from spark2_5_dev.touchpoints import SRC, Touchpoint, touchpoints


def installed_vllm() -> Path:
    import vllm

    return Path(vllm.__file__).parent


@pytest.fixture(scope="module")
def read_files(tmp_path_factory) -> Path:
    """The installed vLLM's files the check reads, alone in a folder: a small tree."""
    tree = SourceTree(installed_vllm().parent, ("vllm",))
    assert source_check.check_all(tree)
    root = tmp_path_factory.mktemp("read")
    for path in tree.files():
        copy = root / path.relative_to(tree.root)
        copy.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, copy)
    return root


@pytest.fixture
def release(read_files, tmp_path) -> Path:
    """A copy of :func:`read_files` for one test to change."""
    return Path(shutil.copytree(read_files, tmp_path / "release"))


def results(root: Path) -> dict[str, source_check.Result]:
    found = source_check.check_all(SourceTree(root, ("vllm",)))
    return {result.touchpoint.symbol: result for result in found}


def not_ok(root: Path) -> dict[str, tuple[str, str]]:
    return {
        symbol: (result.status, result.detail)
        for symbol, result in results(root).items()
        if result.status != source_check.OK
    }


def touchpoint(symbol: str) -> Touchpoint:
    return next(t for t in touchpoints() if t.symbol == symbol)


def rewrite(root: Path, symbol: str, change: Callable) -> None:
    """Apply ``change(node, module_tree)`` where the release defines the touchpoint
    ``symbol`` (wherever this release has it), and save the module."""
    found, _ = source_check.locate(SourceTree(root, ("vllm",)), touchpoint(symbol))
    source = ast.parse(found.module.path.read_text(encoding="utf-8"))
    node = next(
        n
        for n in ast.walk(source)
        if type(n) is type(found.node) and getattr(n, "lineno", 0) == found.node.lineno
    )
    change(node, source)
    found.module.path.write_text(ast.unparse(source), encoding="utf-8")


def remove_from_module(node: ast.stmt, source: ast.Module) -> None:
    for holder in ast.walk(source):
        if node in getattr(holder, "body", []):
            holder.body.remove(node)
            return
    raise AssertionError("not found")


def test_the_installed_vllm_has_no_broken_touchpoint(capsys):
    """Missing ones only where the carrier copes and the release predates them (0.23)."""
    assert source_check.main([str(installed_vllm())]) == 0
    out = capsys.readouterr().out
    assert f"{len(touchpoints())} touchpoints: " in out and ", 0 BROKEN, " in out
    assert "LoRAModelManager.__init__" in out and "split_delta" in out
    missing = not_ok(installed_vllm().parent)
    assert all(touchpoint(symbol).without for symbol in missing), missing


def test_the_files_it_reads_are_the_whole_release_to_it(read_files):
    assert not_ok(read_files) == not_ok(installed_vllm().parent)


def test_a_renamed_keyword_a_removed_symbol_and_call_site_are_each_named(release, capsys):
    def rename_rope_parameters(node: ast.FunctionDef, _) -> None:
        for arg in [*node.args.args, *node.args.kwonlyargs]:
            if arg.arg == "rope_parameters":
                arg.arg = "rope_params"

    def drop_the_announcement(node: ast.FunctionDef, _) -> None:
        for holder in ast.walk(node):
            body = getattr(holder, "body", None)
            if isinstance(body, list):
                holder.body = [
                    s for s in body if ast.unparse(s) != "self.model.lora_manager = self"
                ]

    def rename_id_field(node: ast.ClassDef, _) -> None:
        for field in node.body:
            if isinstance(field, ast.AnnAssign) and ast.unparse(field.target) == "id":
                field.target = ast.Name("call_id", ast.Store())

    before = not_ok(release)
    rewrite(release, "get_rope", rename_rope_parameters)
    rewrite(release, "LAYERWISE_INFO", remove_from_module)
    rewrite(release, "LoRAModelManager.__init__", drop_the_announcement)
    rewrite(release, "DeltaToolCall", rename_id_field)

    broken = {symbol: found for symbol, found in not_ok(release).items() if symbol not in before}
    assert set(broken) == {
        "get_rope",
        "LAYERWISE_INFO",
        "LoRAModelManager.__init__",
        "DeltaToolCall",
    }
    assert {status for status, _ in broken.values()} == {source_check.BROKEN}
    assert broken["get_rope"][1].startswith("no parameter 'rope_parameters' (signature now (")
    layerwise = "vllm.model_executor.model_loader.reload.layerwise"
    assert broken["LAYERWISE_INFO"][1] == f"{layerwise} has no LAYERWISE_INFO"
    assert broken["LoRAModelManager.__init__"][1] == (
        "no `self.model.lora_manager = self` in vllm.lora.model_manager.LoRAModelManager.__init__"
    )
    assert broken["DeltaToolCall"][1].startswith("no parameter 'id'")

    assert source_check.main([str(release)]) == 1
    out = capsys.readouterr().out
    assert "BROKEN: get_rope, DeltaToolCall, LAYERWISE_INFO, LoRAModelManager.__init__" in out
    row = next(line for line in out.splitlines() if line.startswith("LAYERWISE_INFO "))
    assert "BROKEN" in row and "[fix: host_hooks.in_layerwise_reload]" in row


def test_a_missing_touchpoint_the_carrier_copes_without_fails_only_strict(release, capsys):
    if not_ok(release):
        pytest.skip(f"this vLLM already lacks {sorted(not_ok(release))}")
    rewrite(release, "get_function_tools", remove_from_module)
    assert not_ok(release) == {
        "get_function_tools": (
            source_check.MISSING,
            "vllm.tool_parsers.utils has no get_function_tools: namespace and custom "
            "tools are not flattened into functions",
        )
    }
    assert source_check.main([str(release)]) == 0
    assert source_check.main([str(release), "--strict"]) == 1
    assert "missing: get_function_tools" in capsys.readouterr().out


def test_a_release_is_read_from_its_wheel_and_a_version_from_the_wheel_cache(read_files, tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    wheel = cache / "vllm-0.99.0-cp38-abi3-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path in read_files.rglob("*.py"):
            archive.write(path, path.relative_to(read_files).as_posix())
        archive.writestr("vllm-0.99.0.dist-info/METADATA", "Name: vllm\n")
    unpacked = source_check.source("0.99.0", cache)  # in the cache: pip is not asked
    assert unpacked == source_check.source(str(wheel), cache) == cache / wheel.stem
    assert not_ok(unpacked) == not_ok(read_files)
    assert not (unpacked / "vllm-0.99.0.dist-info").exists()
    assert source_check.main(["0.99.0", "--cache", str(cache), "--markdown"]) == 0


def test_a_symbol_is_found_in_the_first_of_its_modules_that_exists(release):
    """compat's order, as at run time: the tool-call protocol moved to where the
    release did not have it (0.29 and later have the first location, 0.23 to 0.28 the
    second); an existing first location without it is a break, not a fallback."""
    found = results(release)["DeltaToolCall"].detail.removesuffix(".DeltaToolCall")
    (moved,) = [name for name in touchpoint("DeltaToolCall").modules if name != found]
    path = [release.joinpath(*name.split(".")).with_suffix(".py") for name in (found, moved)]
    path[1].parent.mkdir(parents=True, exist_ok=True)
    path[0].rename(path[1])
    assert results(release)["DeltaToolCall"].status == source_check.OK
    assert results(release)["DeltaToolCall"].detail == f"{moved}.DeltaToolCall"
    first = touchpoint("DeltaToolCall").modules[0]
    stub = release.joinpath(*first.split(".")).with_suffix(".py")
    stub.parent.mkdir(parents=True, exist_ok=True)
    stub.write_text("from pydantic import BaseModel\n", encoding="utf-8")
    assert not_ok(release)["DeltaToolCall"] == (
        source_check.BROKEN,
        f"{first} has no DeltaToolCall",
    )


def test_a_call_site_is_matched_as_written_not_as_the_tail_of_a_longer_name():
    assert source_check.mentions("split_delta(delta)", "split_delta(")
    assert not source_check.mentions("events.split_delta(delta)", "split_delta(")
    assert source_check.mentions("model._do_torchao_reload = False", "._do_torchao_reload = ")


def test_every_vllm_module_the_carrier_names_is_a_touchpoint():
    """A new reach into vLLM (a module named in a string, as compat does) joins the list."""
    installed = SourceTree(installed_vllm().parent, ("vllm",))
    named = {
        node.value
        for path in SRC.joinpath("vllm_spark2_5_plugin").rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and node.value.startswith("vllm.")
        and installed.module(node.value)
    }
    listed = {module for touchpoint in touchpoints() for module in touchpoint.modules}
    assert named and named - listed == set()
