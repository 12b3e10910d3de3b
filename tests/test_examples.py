"""The shipped examples package as documented."""

import shutil
import subprocess
import sys
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


def test_tiny_model_cli_refuses_to_overwrite(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "keep").write_text("x")
    r = subprocess.run(
        [sys.executable, str(REPO / "examples/tiny-model/make_tiny_model.py"), str(tmp_path / "m")],
        capture_output=True,
        text=True,
    )
    assert r.returncode != 0
    assert (tmp_path / "m" / "keep").read_text() == "x"
