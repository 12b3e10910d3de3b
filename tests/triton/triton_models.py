"""Small Python-backend models for the real Triton, and a process check (helpers of tests/triton)."""

from __future__ import annotations

import textwrap
from pathlib import Path

# A Python-backend model: BYTES in, the same bytes back (ECHO), a text made from them (TEXT), and the numpy
# version the model runs under (NUMPY).
ECHO_CONFIG = """\
name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "IN" data_type: TYPE_STRING dims: [ -1 ] }} ]
output [
  {{ name: "ECHO" data_type: TYPE_STRING dims: [ -1 ] }},
  {{ name: "TEXT" data_type: TYPE_STRING dims: [ -1 ] }},
  {{ name: "NUMPY" data_type: TYPE_STRING dims: [ 1 ] }}
]
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
"""
ECHO_MODEL = """\
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            echo = np.array(list(values), dtype=np.object_)
            text = np.array(
                [f"«{v.decode('utf-8', errors='replace').upper()}» · {len(v)} bytes · ☃ 日本".encode() for v in values],
                dtype=np.object_,
            )
            version = np.array([np.__version__.encode()], dtype=np.object_)
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("ECHO", echo), pb_utils.Tensor("TEXT", text), pb_utils.Tensor("NUMPY", version)]
            ))
        return responses
"""
BROKEN_MODEL = """\
class TritonPythonModel:
    def initialize(self, args):
        raise RuntimeError("weights file is missing: /nowhere/w.bin")

    def execute(self, requests):
        return []
"""
# A request for "hang" never finishes: Triton waits for it on SIGTERM (up to its exit timeout), so stop() must kill
# the group.
HANGING_MODEL = ECHO_MODEL.replace(
    '            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()\n',
    '            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()\n'
    '            if values[0] == b"hang":\n'
    "                import time\n"
    "                time.sleep(600)\n",
)
assert HANGING_MODEL != ECHO_MODEL


def write_model(repo: Path, name: str, code: str, config: str = ECHO_CONFIG, version: int = 1) -> Path:
    folder = repo / name
    (folder / str(version)).mkdir(parents=True, exist_ok=True)
    (folder / "config.pbtxt").write_text(config.format(name=name), encoding="utf-8")
    (folder / str(version) / "model.py").write_text(textwrap.dedent(code), encoding="utf-8")
    return folder
