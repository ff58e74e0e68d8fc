"""vllm_hust_bundle_kit.deferred: a registration that runs when its host module is imported."""

from __future__ import annotations

import importlib
import importlib.resources
import sys
import uuid

import pytest

from vllm_hust_bundle_kit.deferred import after_import


@pytest.fixture
def package(tmp_path, monkeypatch):
    """A fresh, not yet imported package with a data file; its name."""
    name = f"host_registry_{uuid.uuid4().hex}"
    folder = tmp_path / name
    folder.mkdir()
    (folder / "__init__.py").write_text("REGISTRY = {'builtin': 1}\n")
    (folder / "data.txt").write_text("resource")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


def test_waits_for_the_import_then_runs_once_with_the_executed_module(package):
    seen = []
    assert after_import([package], lambda module: seen.append(dict(module.REGISTRY))) is False
    assert seen == []
    module = importlib.import_module(package)
    assert seen == [{"builtin": 1}]  # ran after the module's own code
    importlib.reload(module)
    assert len(seen) == 1
    # The module keeps its real loader: resources and reloads work as without the hook.
    assert type(module.__loader__).__name__ == "SourceFileLoader"
    assert importlib.resources.files(package).joinpath("data.txt").read_text() == "resource"


def test_runs_now_when_the_module_is_already_imported(package):
    importlib.import_module(package)
    seen = []
    assert after_import([package], seen.append) is True
    assert [module.__name__ for module in seen] == [package]


def test_the_first_of_several_alternative_names_triggers_it_once(package):
    seen = []
    after_import([f"{package}_former_location", package], seen.append)
    importlib.import_module(package)
    assert len(seen) == 1


def test_a_module_that_does_not_exist_leaves_imports_alone(package):
    seen = []
    missing = f"{package}_missing"
    after_import([missing], seen.append)
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(missing)
    importlib.import_module(package)
    assert seen == []
    for finder in list(sys.meta_path):  # leave no watcher behind for other tests
        if type(finder).__name__ == "_ImportWatcher":
            sys.meta_path.remove(finder)
