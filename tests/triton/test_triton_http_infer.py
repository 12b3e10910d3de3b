"""/infer on a decoupled model in front of Triton (llmserve.serve.triton.http_infer): tritonclient.http's own request
bodies (binary and JSON tensors) decode to the gRPC request Triton takes, and a gRPC response encodes to a body
tritonclient.http parses back to the same tensors; malformed bodies are refused naming the part at fault."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2 as pb
from tritonclient.utils import deserialize_bytes_tensor, serialize_byte_tensor

from llmserve.serve.triton.http_infer import InferBodyError, decode_infer_body, encode_infer_response

TENSORS = {
    "text": ("BYTES", np.array([[s.encode() for s in row] for row in (["héllo", ""], ["☃", "x"])], dtype=np.object_)),
    "flag": ("BOOL", np.array([True, False])),
    "ids": ("INT64", np.array([[1, -2, 3]], dtype=np.int64)),
    "score": ("FP32", np.array([0.5, -1.25], dtype=np.float32)),
    "half": ("FP16", np.array([1.5], dtype=np.float16)),
    "small": ("UINT8", np.array([0, 255], dtype=np.uint8)),
}


def _client_body(binary: bool, **kwargs) -> tuple[bytes, str | None]:
    inputs = []
    for name, (datatype, value) in TENSORS.items():
        tensor = httpclient.InferInput(name, list(value.shape), datatype)
        tensor.set_data_from_numpy(value, binary_data=binary)
        inputs.append(tensor)
    body, length = httpclient.InferenceServerClient.generate_request_body(inputs, **kwargs)
    return body if isinstance(body, bytes) else body.encode(), None if length is None else str(length)


def _decoded(raw: bytes, datatype: str):
    if datatype == "BYTES":
        return [v.decode() for v in deserialize_bytes_tensor(raw)]
    return np.frombuffer(
        raw,
        dtype={"BOOL": np.bool_, "INT64": np.int64, "FP32": np.float32, "FP16": np.float16, "UINT8": np.uint8}[
            datatype
        ],
    ).tolist()


@pytest.mark.parametrize("binary", [True, False])
def test_tritonclients_bodies_decode_to_the_grpc_request(binary):
    outputs = [httpclient.InferRequestedOutput("text_output", binary_data=False)]
    raw, length = _client_body(binary, outputs=outputs, request_id="r1", parameters={"max_tokens": 5, "temp": 0.5})
    request, binary_by_name, binary_all = decode_infer_body(raw, length, "m", "2")
    assert (request.model_name, request.model_version, request.id) == ("m", "2", "r1")
    assert request.parameters["max_tokens"].int64_param == 5 and request.parameters["temp"].double_param == 0.5
    assert binary_by_name == {"text_output": False} and not binary_all
    assert [o.name for o in request.outputs] == ["text_output"] and not request.outputs[0].parameters
    assert len(request.raw_input_contents) == len(TENSORS)
    for tensor, raw_tensor in zip(request.inputs, request.raw_input_contents, strict=True):
        datatype, value = TENSORS[tensor.name]
        assert tensor.datatype == datatype and list(tensor.shape) == list(value.shape)
        assert "binary_data_size" not in tensor.parameters
        want = [v.decode() for v in value.reshape(-1)] if datatype == "BYTES" else value.reshape(-1).tolist()
        assert _decoded(raw_tensor, datatype) == want, tensor.name


def _response(binary_first: bool) -> tuple[bytes, dict]:
    text = np.array([b'{"a": 1}', "☃".encode()], dtype=np.object_)
    response = pb.ModelInferResponse(model_name="m", model_version="1", id="r9")
    response.parameters["triton_x"].bool_param = True
    response.outputs.add(name="text_output", datatype="BYTES", shape=[2])
    response.outputs.add(name="count", datatype="UINT32", shape=[1, 2])
    response.raw_output_contents.append(serialize_byte_tensor(text).item())
    response.raw_output_contents.append(np.array([7, 9], dtype=np.uint32).tobytes())
    return encode_infer_response(response, {"text_output": binary_first}, binary_all=False)


@pytest.mark.parametrize("binary_first", [True, False])
def test_a_response_encodes_to_what_tritonclient_parses_back(binary_first):
    body, headers = _response(binary_first)
    length = headers.get("inference-header-content-length")
    assert (length is not None) == binary_first
    result = httpclient.InferenceServerClient.parse_response_body(
        body, header_length=None if length is None else int(length)
    )
    assert result.get_response()["id"] == "r9" and result.get_response()["parameters"] == {"triton_x": True}
    texts = [v.decode() if isinstance(v, bytes) else v for v in result.as_numpy("text_output").reshape(-1)]
    assert texts == ['{"a": 1}', "☃"]
    assert result.as_numpy("count").tolist() == [[7, 9]]


@pytest.mark.parametrize(
    "body,needle",
    [
        (b"{", "not valid JSON"),
        (b"[]", "must be a JSON object"),
        ({"inputs": []}, "non-empty list"),
        ({"inputs": [{"name": "a", "datatype": "TEXT", "shape": [1], "data": ["x"]}]}, "'datatype' (one of"),
        ({"inputs": [{"name": "a", "datatype": "BYTES", "shape": [2], "data": ["x"]}]}, "holds 2 element(s)"),
        ({"inputs": [{"name": "a", "datatype": "INT8", "shape": [1], "data": [300]}]}, "does not fit INT8"),
        ({"inputs": [{"name": "a", "datatype": "BOOL", "shape": [1], "data": [1]}]}, "JSON booleans"),
        ({"inputs": [{"name": "a", "datatype": "FP32", "shape": [1], "data": ["1"]}]}, "JSON numbers"),
        ({"inputs": [{"name": "a", "datatype": "BF16", "shape": [1], "data": [1.0]}]}, "as binary"),
        ({"inputs": [{"name": "a", "datatype": "BYTES", "shape": [-1], "data": []}]}, "non-negative"),
        ({"inputs": [{"name": "a", "datatype": "BYTES", "shape": [1]}]}, "has no 'data'"),
        (
            {"inputs": [{"name": "a", "datatype": "BYTES", "shape": [1], "data": ["x"]}], "parameters": {"p": [1]}},
            "'p'",
        ),
        (
            {"inputs": [{"name": "a", "datatype": "BYTES", "shape": [1], "data": ["x"]}], "outputs": [{"x": 1}]},
            "outputs[0]",
        ),
        ({"id": 5, "inputs": []}, "'id' must be a string"),
        ({"inputs": [{"name": "a", "datatype": ["BYTES"], "shape": [1], "data": ["x"]}]}, "'datatype' (one of"),
        ({"inputs": [{"name": "a", "datatype": "INT32", "shape": [1], "data": [1.7]}]}, "JSON integers"),
        ({"inputs": [{"name": "a", "datatype": "FP16", "shape": [1], "data": [1e10]}]}, "does not fit FP16"),
        (
            {"inputs": [{"name": "a", "datatype": "BYTES", "shape": [2**32, 2**32], "data": []}]},
            "holds 18446744073709551616",
        ),
        (
            {"inputs": [{"name": "a", "datatype": "BYTES", "shape": [1], "parameters": {"shared_memory_region": "r"}}]},
            "shared-memory tensors are not supported",
        ),
        (
            {
                "inputs": [{"name": "a", "datatype": "BYTES", "shape": [1], "data": ["x"]}],
                "parameters": {"s": -(2**64)},
            },
            "'s'",
        ),
        (
            {"inputs": [{"name": "a", "datatype": "BYTES", "shape": [1], "parameters": {"binary_data_size": 9}}]},
            "does not fit",
        ),
    ],
)
def test_malformed_bodies_are_refused_naming_the_part(body, needle):
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    with pytest.raises(InferBodyError, match=re.escape(needle)):
        decode_infer_body(raw, None, "m", "")


def test_binary_bytes_no_input_claims_are_refused():
    header = json.dumps(
        {"inputs": [{"name": "a", "datatype": "UINT8", "shape": [1], "parameters": {"binary_data_size": 1}}]}
    )
    with pytest.raises(InferBodyError, match="2 binary byte"):
        decode_infer_body(header.encode() + b"abc", str(len(header)), "m", "")
    with pytest.raises(InferBodyError, match="outside the body"):
        decode_infer_body(header.encode(), "9999", "m", "")


def test_empty_tensors_and_unsigned_64_bit_parameters_are_taken():
    body = {
        "inputs": [{"name": "a", "datatype": "BYTES", "shape": [0], "data": []}],
        "parameters": {"sequence_id": 2**64 - 1, "priority": 1},
    }
    request, _, _ = decode_infer_body(json.dumps(body).encode(), None, "m", "")
    assert request.raw_input_contents[0] == b"" and list(request.inputs[0].shape) == [0]
    assert (
        request.parameters["sequence_id"].uint64_param == 2**64 - 1 and request.parameters["priority"].int64_param == 1
    )
    response = pb.ModelInferResponse(model_name="m", model_version="1")
    response.outputs.add(name="t", datatype="BYTES", shape=[0])
    body_out, _ = encode_infer_response(response, {}, binary_all=False)
    assert json.loads(body_out)["outputs"][0]["data"] == []
