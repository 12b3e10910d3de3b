"""Plugin registration through entry points, and the errors when vLLM would not honour a plugin."""

from __future__ import annotations

import shutil
import sys

import pytest

from llmserve.packaging.opened import open_package
from llmserve.serve.errors import PluginInstallError
from llmserve.serve.plugin_entry_points import install_plugins, load_check


def _source(tmp_path, tiny_model_dir, module_text: str, entry: str, group: str = "vllm.general_plugins"):
    src = tmp_path / "src"
    (src / "plugins" / "p").mkdir(parents=True)
    (src / "model").mkdir()
    shutil.copy(tiny_model_dir / "config.json", src / "model" / "config.json")
    (src / "plugins" / "p" / "llmserve_plug_mod.py").write_text(module_text)
    (src / "llmserve.yaml").write_text(
        "modelId: plug\nmodelVersion: 1\nbackend: vllm\n"
        f"plugins:\n  - name: p1\n    source: plugins/p\n    entryPoint: {entry}\n    group: {group}\n"
    )
    return open_package(src)


@pytest.fixture
def isolated_path(monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setenv("PYTHONPATH", "")
    monkeypatch.delenv("VLLM_PLUGINS", raising=False)
    yield
    sys.modules.pop("llmserve_plug_mod", None)


def test_entry_point_is_discoverable_and_loads(tmp_path, tiny_model_dir, isolated_path):
    from importlib import metadata

    pkg = _source(tmp_path, tiny_model_dir, "def register():\n    return 1\n", "llmserve_plug_mod:register")
    installed = install_plugins(pkg, tmp_path / "site")
    eps = [ep for ep in metadata.entry_points(group="vllm.general_plugins") if ep.name == "p1"]
    assert eps and eps[0].value == "llmserve_plug_mod:register"
    load_check(installed)
    assert str(tmp_path / "site") in __import__("os").environ["PYTHONPATH"]


def test_plugin_that_fails_to_import_stops_startup(tmp_path, tiny_model_dir, isolated_path):
    pkg = _source(tmp_path, tiny_model_dir, "import not_a_module_anywhere\n", "llmserve_plug_mod:register")
    installed = install_plugins(pkg, tmp_path / "site")
    with pytest.raises(PluginInstallError, match="cannot load"):
        load_check(installed)


def test_plugin_excluded_by_vllm_plugins_is_an_error(tmp_path, tiny_model_dir, isolated_path, monkeypatch):
    monkeypatch.setenv("VLLM_PLUGINS", "someone_else")
    pkg = _source(tmp_path, tiny_model_dir, "def register():\n    pass\n", "llmserve_plug_mod:register")
    with pytest.raises(PluginInstallError, match="VLLM_PLUGINS"):
        install_plugins(pkg, tmp_path / "site")


def test_logits_processor_plugin_refused_under_v2_runner(tmp_path, tiny_model_dir, isolated_path, monkeypatch):
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
    pkg = _source(
        tmp_path, tiny_model_dir, "class P:\n    pass\n", "llmserve_plug_mod:P", group="vllm.logits_processors"
    )
    with pytest.raises(PluginInstallError, match="V2 model runner"):
        install_plugins(pkg, tmp_path / "site")
