"""Package builders for the vLLM and Python backends."""

import json
import re
import shutil
import textwrap
from pathlib import Path

import pytest

from llmserve.errors import InvalidInputError, ManifestError, NotFoundError, SpecMismatchError
from llmserve.packaging import build_package, read_index
from llmserve.packaging.archive import read_member, unpack


def _model(dir: Path) -> Path:
    dir.mkdir(parents=True)
    (dir / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    (dir / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    (dir / "tokenizer.json").write_text("{}")
    return dir


def _src(tmp_path: Path, manifest: str, name="src") -> Path:
    src = tmp_path / name
    _model(src / "model")
    (src / "llmserve.yaml").write_text(textwrap.dedent(manifest))
    return src


VLLM = """\
modelId: tiny-chat
modelVersion: 2
backend: vllm
engine:
  max_model_len: 512
  enforce_eager: true
"""

PY_OK = """\
modelId: tiny-py
modelVersion: 1
backend: python
python:
  tensors:
    inputs:
      - {name: text_input, datatype: BYTES, dims: [1]}
      - {name: stream, datatype: BOOL, dims: [1], optional: true}
      - {name: sampling_parameters, datatype: BYTES, dims: [1], optional: true}
      - {name: exclude_input_in_output, datatype: BOOL, dims: [1], optional: true}
    outputs:
      - {name: text_output, datatype: BYTES, dims: [-1]}
"""


def test_vllm_backend_layout(tmp_path):
    result = build_package(_src(tmp_path, VLLM), tmp_path / "dist")
    assert result.path == tmp_path / "dist" / "tiny-chat-2.llmpkg"
    names = set(read_index(result.path).files)
    assert names == {
        "llmserve.yaml",
        "model_repository/tiny-chat/config.pbtxt",
        "model_repository/tiny-chat/2/model.json",
        "model_repository/tiny-chat/2/weights/config.json",
        "model_repository/tiny-chat/2/weights/model.safetensors",
        "model_repository/tiny-chat/2/weights/tokenizer.json",
    }
    config = read_member(result.path, "model_repository/tiny-chat/config.pbtxt").decode()
    assert 'backend: "vllm"' in config and 'name: "tiny-chat"' in config
    assert "decoupled: true" in config
    assert "input {" not in config and "output {" not in config  # the vLLM backend generates its spec
    model_json = json.loads(read_member(result.path, "model_repository/tiny-chat/2/model.json"))
    assert model_json == {
        "model": "/models/tiny-chat/2/weights",
        "tokenizer": "/models/tiny-chat/2/weights",
        "max_model_len": 512,
        "enforce_eager": True,
    }


def test_same_inputs_give_byte_identical_archives(tmp_path):
    src = _src(tmp_path, VLLM)
    a = build_package(src, tmp_path / "a").path.read_bytes()
    # A copy elsewhere, with other timestamps and permissions, packages to the same bytes.
    copy = tmp_path / "copy"
    shutil.copytree(src, copy)
    for p in copy.rglob("*"):
        p.touch()
    b = build_package(copy, tmp_path / "b").path.read_bytes()
    assert a == b


def test_tiny_model_packages_reproducibly(tmp_path, tiny_vllm_source):
    a = build_package(tiny_vllm_source, tmp_path / "a").path
    b = build_package(tiny_vllm_source, tmp_path / "b").path
    assert a.read_bytes() == b.read_bytes()
    assert any(n.endswith("model.safetensors") for n in read_index(a).files)


def test_python_backend_with_template(tmp_path):
    result = build_package(_src(tmp_path, PY_OK), tmp_path / "dist")
    config = read_member(result.path, "model_repository/tiny-py/config.pbtxt").decode()
    assert 'backend: "python"' in config
    assert re.search(r'input \{\s*name: "text_input"\s*data_type: TYPE_STRING\s*dims: \[ 1 \]\s*\}', config)
    assert re.search(r'name: "stream"\s*data_type: TYPE_BOOL\s*dims: \[ 1 \]\s*optional: true', config)
    assert re.search(r'output \{\s*name: "text_output"\s*data_type: TYPE_STRING\s*dims: \[ -1 \]', config)
    code = read_member(result.path, "model_repository/tiny-py/1/model.py").decode()
    compile(code, "model.py", "exec")
    assert "class TritonPythonModel" in code and "def execute" in code


def test_python_backend_with_developer_model_py(tmp_path):
    src = _src(tmp_path, PY_OK.replace("python:\n", "python:\n  modelPy: code/model.py\n"))
    (src / "code").mkdir()
    (src / "code" / "model.py").write_text(
        "class TritonPythonModel:\n    def execute(self, requests):\n        return []\n"
    )
    result = build_package(src, tmp_path / "dist")
    assert read_member(result.path, "model_repository/tiny-py/1/model.py") == (src / "code" / "model.py").read_bytes()


@pytest.mark.parametrize(
    "code, words",
    [
        ("def execute(requests): pass\n", "no class TritonPythonModel"),
        ("class TritonPythonModel:\n    def initialize(self, args): pass\n", "no execute()"),
        ("class TritonPythonModel(:\n", "does not parse"),
    ],
)
def test_bad_developer_model_py(tmp_path, code, words):
    src = _src(tmp_path, PY_OK.replace("python:\n", "python:\n  modelPy: model.py\n"))
    (src / "model.py").write_text(code)
    with pytest.raises(InvalidInputError, match=words):
        build_package(src, tmp_path / "dist")
    assert not (tmp_path / "dist").exists() or list((tmp_path / "dist").iterdir()) == []


@pytest.mark.parametrize(
    "change, words",
    [
        (
            ("datatype: BYTES, dims: [1]}\n      - {name: stream", "datatype: FP32, dims: [1]}\n      - {name: stream"),
            "datatype differs",
        ),
        (
            ("{name: text_output, datatype: BYTES, dims: [-1]}", "{name: answer, datatype: BYTES, dims: [-1]}"),
            "does not produce this output",
        ),
        (
            ("{name: text_input, datatype: BYTES, dims: [1]}", "{name: prompt, datatype: BYTES, dims: [1]}"),
            "does not declare this input",
        ),
        (
            ("{name: stream, datatype: BOOL, dims: [1], optional: true}", "{name: stream, datatype: BOOL, dims: [1]}"),
            "only when the caller sets it",
        ),
        (
            ("{name: text_input, datatype: BYTES, dims: [1]}", "{name: text_input, datatype: BYTES, dims: [2]}"),
            "dims differ",
        ),
        (("outputs:", "  - {name: temperature, datatype: FP32, dims: [1]}\n    outputs:"), "never sends"),
    ],
)
def test_python_spec_mismatch_fails_packaging_side_by_side(tmp_path, change, words):
    src = _src(tmp_path, PY_OK.replace(*change))
    with pytest.raises(SpecMismatchError) as info:
        build_package(src, tmp_path / "dist")
    detail = info.value.details[0]
    assert detail.columns == ["tensor", "frontend", "model", "verdict"]
    assert any(words in row[3] for row in detail.rows), detail.rows
    assert any(row[3] == "ok" for row in detail.rows) or words  # both sides are shown, good rows too
    assert not (tmp_path / "dist").exists()


def test_frontend_none_skips_contract_but_needs_model_py(tmp_path):
    manifest = PY_OK.replace("python:\n", "python:\n  frontend: none\n").replace("text_output", "scores")
    with pytest.raises(ManifestError, match="modelPy is required"):
        build_package(_src(tmp_path, manifest), tmp_path / "dist")


@pytest.mark.parametrize(
    "setup, error, words",
    [
        (lambda s: shutil.rmtree(s / "model"), NotFoundError, "weights folder not found"),
        (lambda s: (s / "model" / "config.json").unlink(), InvalidInputError, "no config.json"),
        (lambda s: (s / "model" / "model.safetensors").unlink(), InvalidInputError, "no *.safetensors"),
        (lambda s: (s / "model" / "pytorch_model.bin").write_bytes(b"pickle"), InvalidInputError, "pickled weights"),
        (lambda s: (s / "model" / "MODEL.PT").write_bytes(b"pickle"), InvalidInputError, "pickled weights"),
        (lambda s: (s / "model" / "link.json").symlink_to(s / "nowhere"), InvalidInputError, "dangling symbolic link"),
        (lambda s: (s / "llmserve.yaml").unlink(), ManifestError, "no manifest here"),
    ],
)
def test_bad_sources(tmp_path, setup, error, words):
    src = _src(tmp_path, VLLM)
    setup(src)
    with pytest.raises(error, match=re.escape(words)):
        build_package(src, tmp_path / "dist")


def _link_to_blob(src: Path, blobs: Path) -> None:
    blob = blobs / "abc"
    blob.parent.mkdir(parents=True)
    (src / "model" / "tokenizer.json").rename(blob)
    (src / "model" / "tokenizer.json").symlink_to(blob)


def test_linked_weights_are_packaged_as_their_content(tmp_path):
    # A Hugging Face cache layout (snapshot files linking to blobs) kept inside the source folder.
    src = _src(tmp_path, VLLM)
    _link_to_blob(src, src / "blobs")
    result = build_package(src, tmp_path / "dist")
    assert read_member(result.path, "model_repository/tiny-chat/2/weights/tokenizer.json") == b"{}"


def test_link_leaving_the_source_folder_refused_unless_asked(tmp_path):
    src = _src(tmp_path, VLLM)
    secret = tmp_path / "home" / "secret.txt"
    secret.parent.mkdir()
    secret.write_text("token=hunter2")
    (src / "model" / "notes.txt").symlink_to(secret)
    with pytest.raises(InvalidInputError, match="outside the source folder") as info:
        build_package(src, tmp_path / "dist")
    assert "follow_external_links" in info.value.hint
    assert not (tmp_path / "dist").exists()
    result = build_package(src, tmp_path / "dist", follow_external_links=True)
    assert read_member(result.path, "model_repository/tiny-chat/2/weights/notes.txt") == b"token=hunter2"


def test_plugin_link_leaving_the_source_folder_refused(tmp_path):
    src = _src(tmp_path, VLLM + "plugins:\n  - name: p\n    source: plug\n    entryPoint: plugmod:register\n")
    (src / "plug").mkdir()
    (tmp_path / "outside.py").write_text("def register():\n    pass\n")
    (src / "plug" / "plugmod.py").symlink_to(tmp_path / "outside.py")
    with pytest.raises(InvalidInputError, match="outside the source folder"):
        build_package(src, tmp_path / "dist")


def test_linked_blob_outside_source_needs_the_option(tmp_path):
    src = _src(tmp_path, VLLM)
    _link_to_blob(src, tmp_path / "hub-blobs")
    with pytest.raises(InvalidInputError, match="outside the source folder"):
        build_package(src, tmp_path / "dist")
    assert build_package(src, tmp_path / "dist", follow_external_links=True).path.is_file()


def test_link_to_a_folder_refused_not_skipped(tmp_path):
    src = _src(tmp_path, VLLM)
    (src / "extra").mkdir()
    (src / "extra" / "tokenizer_config.json").write_text("{}")
    (src / "model" / "sub").symlink_to(src / "extra", target_is_directory=True)
    with pytest.raises(InvalidInputError, match="symbolic link to a folder"):
        build_package(src, tmp_path / "dist")


def test_weights_outside_source_refused(tmp_path):
    _model(tmp_path / "elsewhere")
    src = _src(tmp_path, VLLM + "weights: ../elsewhere\n")
    with pytest.raises(ManifestError, match="points outside the package folder"):
        build_package(src, tmp_path / "dist")


def test_plugins_are_bundled(tmp_path):
    src = _src(
        tmp_path, VLLM + "plugins:\n  - name: upper\n    source: plugins/upper\n    entryPoint: upper_plugin:register\n"
    )
    (src / "plugins" / "upper" / "upper_plugin").mkdir(parents=True)
    (src / "plugins" / "upper" / "upper_plugin" / "__init__.py").write_text("def register():\n    pass\n")
    result = build_package(src, tmp_path / "dist")
    assert "plugins/upper/upper_plugin/__init__.py" in read_index(result.path).files
    out = tmp_path / "unpacked"
    unpack(result.path, out)
    assert (out / "plugins/upper/upper_plugin/__init__.py").is_file()


def test_plugin_module_must_exist(tmp_path):
    src = _src(tmp_path, VLLM + "plugins:\n  - name: upper\n    source: plug\n    entryPoint: nowhere:register\n")
    (src / "plug").mkdir()
    with pytest.raises(ManifestError, match="module 'nowhere'"):
        build_package(src, tmp_path / "dist")
