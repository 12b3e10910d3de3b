"""The shipped examples package as documented (the tiny-model maker has its own tests: test_tiny_model.py)."""

import shutil
from pathlib import Path

from llmserve.packaging import build_package, read_index
from llmserve.packaging.archive import read_member

REPO = Path(__file__).resolve().parent.parent


def test_python_backend_example_packages(tmp_path, tiny_model_dir):
    src = tmp_path / "python-backend"
    shutil.copytree(REPO / "examples" / "python-backend", src)
    shutil.copytree(tiny_model_dir, src / "model")
    result = build_package(src, tmp_path / "dist")
    assert result.path.name == "token-counter-1.llmpkg"
    config = read_member(result.path, "model_repository/token-counter/config.pbtxt").decode()
    assert 'name: "TEXT"' in config and "TYPE_INT64" in config
    assert "model_repository/token-counter/1/weights/tokenizer.json" in read_index(result.path).files


def test_json_chat_example_packages(tmp_path, tiny_model_dir):
    src = tmp_path / "json-chat"
    shutil.copytree(REPO / "examples" / "json-chat", src)
    shutil.copytree(tiny_model_dir, src / "model")
    result = build_package(src, tmp_path / "dist")
    assert result.manifest.modelId == "tiny-chat"
