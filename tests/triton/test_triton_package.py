"""An llmserve package of the Python backend (a developer model.py) served by the real Triton straight from its
unpacked model repository: version folder, version_policy and the frozen llm-text tensor spec as packaged."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient

from llmserve.packaging import build_package
from llmserve.packaging.archive import unpack
from llmserve.serve.triton import TritonServer

MANIFEST = """\
modelId: tiny-py
modelVersion: 3
backend: python
python:
  modelPy: code/model.py
  tensors:
    inputs:
      - {name: text_input, datatype: BYTES, dims: [1]}
      - {name: stream, datatype: BOOL, dims: [1], optional: true}
      - {name: sampling_parameters, datatype: BYTES, dims: [1], optional: true}
      - {name: exclude_input_in_output, datatype: BOOL, dims: [1], optional: true}
    outputs:
      - {name: text_output, datatype: BYTES, dims: [-1]}
"""
MODEL_PY = """\
import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.version = args["model_version"]
        self.has_weights = os.path.isfile(os.path.join(os.path.dirname(__file__), "weights", "config.json"))

    def execute(self, requests):
        responses = []
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy().reshape(-1)[0].decode("utf-8")
            params = pb_utils.get_input_tensor_by_name(request, "sampling_parameters")
            params = json.loads(params.as_numpy().reshape(-1)[0]) if params is not None else {}
            answer = json.dumps(
                {"echo": text, "version": self.version, "weights": self.has_weights, "params": params},
                ensure_ascii=False,
            )
            out = pb_utils.Tensor("text_output", np.array([answer.encode("utf-8")], dtype=np.object_))
            responses.append(pb_utils.InferenceResponse([out]))
        return responses
"""


def _source(root: Path) -> Path:
    src = root / "src"
    (src / "model").mkdir(parents=True)
    (src / "model" / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    (src / "model" / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    (src / "model" / "tokenizer.json").write_text("{}")
    (src / "code").mkdir()
    (src / "code" / "model.py").write_text(textwrap.dedent(MODEL_PY))
    (src / "llmserve.yaml").write_text(MANIFEST)
    return src


def test_a_python_backend_package_answers_through_triton(tmp_path, triton_install):
    package = build_package(_source(tmp_path), tmp_path / "dist").path
    unpack(package, tmp_path / "unpacked")
    repo = tmp_path / "unpacked" / "model_repository"
    assert (repo / "tiny-py" / "3" / "model.py").is_file()
    with TritonServer(repo, ["tiny-py"], install=triton_install) as server:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        try:
            text = grpcclient.InferInput("text_input", [1], "BYTES")
            text.set_data_from_numpy(np.array(["Grüße aus Köln — 你好".encode()], dtype=np.object_))
            params = grpcclient.InferInput("sampling_parameters", [1], "BYTES")
            params.set_data_from_numpy(np.array([json.dumps({"max_tokens": 4}).encode()], dtype=np.object_))
            result = client.infer("tiny-py", [text, params])
            metadata = client.get_model_metadata("tiny-py", as_json=True)
        finally:
            client.close()
    answer = json.loads(bytes(result.as_numpy("text_output")[0]).decode("utf-8"))
    assert answer == {"echo": "Grüße aus Köln — 你好", "version": "3", "weights": True, "params": {"max_tokens": 4}}
    assert metadata["versions"] == ["3"]
    assert {i["name"] for i in metadata["inputs"]} == {
        "text_input",
        "stream",
        "sampling_parameters",
        "exclude_input_in_output",
    }
