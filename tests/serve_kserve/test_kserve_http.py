"""KServe v2 over HTTP through tritonclient.http and raw HTTP (generate extension), on the real engine."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from llmserve.formats.tensors import LLM_TEXT_CONTRACT

pytestmark = pytest.mark.engine

GREEDY = {"temperature": 0, "max_tokens": 12, "ignore_eos": True}


def inputs(prompt: str, *, binary: bool = True, sampling: dict | None = None, exclude: bool | None = None):
    out = []
    t = httpclient.InferInput("text_input", [1], "BYTES")
    t.set_data_from_numpy(np.array([prompt.encode()], dtype=object), binary_data=binary)
    out.append(t)
    if sampling is not None:
        t = httpclient.InferInput("sampling_parameters", [1], "BYTES")
        t.set_data_from_numpy(np.array([json.dumps(sampling).encode()], dtype=object), binary_data=binary)
        out.append(t)
    if exclude is not None:
        t = httpclient.InferInput("exclude_input_in_output", [1], "BOOL")
        t.set_data_from_numpy(np.array([exclude], dtype=bool), binary_data=binary)
        out.append(t)
    return out


def text_of(result) -> str:
    arr = result.as_numpy("text_output")
    assert arr.shape == (1,)
    value = arr[0]
    return value.decode("utf-8") if isinstance(value, bytes) else value


def sse_events(response) -> list[dict]:
    events = []
    for line in response.iter_lines():
        if line.startswith("data: "):
            events.append(json.loads(line[6:]))
    return events


def test_readiness_before_engine(kserve_server):
    seen = kserve_server.before_ready
    assert seen["http_live"] == 200
    assert seen["http_ready"] == 503
    status, body = seen["http_generate"]
    assert status == 503 and "not ready" in body["error"]


def test_health_and_metadata(http_client, kserve_server):
    assert http_client.is_server_live()
    assert http_client.is_server_ready()
    assert http_client.is_model_ready(kserve_server.model)
    assert http_client.is_model_ready(kserve_server.model, kserve_server.version)
    assert not http_client.is_model_ready("no-such-model")
    server = http_client.get_server_metadata()
    assert server["name"] == "llmserve" and "binary_tensor_data" in server["extensions"]
    meta = http_client.get_model_metadata(kserve_server.model)
    assert meta["versions"] == [kserve_server.version]
    assert [(t["name"], t["datatype"], t["shape"]) for t in meta["inputs"]] == [
        (t.name, t.datatype, t.dims) for t in LLM_TEXT_CONTRACT.inputs
    ]
    config = http_client.get_model_config(kserve_server.model)
    assert config["model_transaction_policy"] == {"decoupled": True}
    # numbers, as Triton's own JSON has them (they were strings: protobuf's JSON form of int64)
    assert [t["dims"] for t in config["input"]] == [list(t.dims) for t in LLM_TEXT_CONTRACT.inputs]


@pytest.mark.parametrize("binary", [True, False], ids=["binary-tensors", "json-tensors"])
def test_infer(http_client, grpc_client, kserve_server, binary):
    outputs = [httpclient.InferRequestedOutput("text_output", binary_data=binary)]
    result = http_client.infer(
        kserve_server.model,
        inputs("The sky is", binary=binary, sampling=GREEDY, exclude=True),
        outputs=outputs,
        request_id="h-1",
    )
    text = text_of(result)
    assert text
    assert result.get_response()["id"] == "h-1"
    # same engine, same greedy answer as the gRPC frontend
    import tritonclient.grpc as grpcclient

    g = [
        grpcclient.InferInput("text_input", [1], "BYTES"),
        grpcclient.InferInput("sampling_parameters", [1], "BYTES"),
        grpcclient.InferInput("exclude_input_in_output", [1], "BOOL"),
    ]
    g[0].set_data_from_numpy(np.array([b"The sky is"], dtype=object))
    g[1].set_data_from_numpy(np.array([json.dumps(GREEDY).encode()], dtype=object))
    g[2].set_data_from_numpy(np.array([True]))
    assert grpc_client.infer(kserve_server.model, g).as_numpy("text_output")[0].decode() == text


def test_infer_default_outputs_binary(http_client, kserve_server):
    # no outputs given: tritonclient asks for binary outputs (binary_data_output)
    result = http_client.infer(kserve_server.model, inputs("Hello", sampling={"max_tokens": 3}))
    assert text_of(result).startswith("Hello")


def test_infer_gzip_request(http_client, kserve_server):
    result = http_client.infer(
        kserve_server.model, inputs("Hello", sampling={"max_tokens": 2}), request_compression_algorithm="gzip"
    )
    assert text_of(result).startswith("Hello")


def test_infer_raw_json(http, kserve_server):
    body = {
        "id": "j",
        "inputs": [
            {"name": "text_input", "datatype": "BYTES", "shape": [1], "data": ["Hello"]},
            {"name": "sampling_parameters", "datatype": "BYTES", "shape": [1], "data": [json.dumps({"max_tokens": 2})]},
        ],
        "parameters": {"ignore_eos": True},
    }
    r = http.post(f"/v2/models/{kserve_server.model}/versions/{kserve_server.version}/infer", json=body)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["model_name"] == kserve_server.model and out["id"] == "j"
    assert out["outputs"][0]["name"] == "text_output" and out["outputs"][0]["data"][0].startswith("Hello")


@pytest.mark.parametrize(
    "body, status, needle",
    [
        ({"inputs": [{"name": "text_input", "datatype": "FP32", "shape": [1], "data": [1.0]}]}, 400, "datatype FP32"),
        (
            {"inputs": [{"name": "prompt", "datatype": "BYTES", "shape": [1], "data": ["x"]}]},
            400,
            "unknown input 'prompt'",
        ),
        ({"inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1], "data": [1]}]}, 400, "strings"),
        (
            {
                "inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1], "data": ["x"]}],
                "parameters": {"tempreture": 1},
            },
            400,
            "'tempreture'",
        ),
        (
            {
                "inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1], "data": ["x"]}],
                "outputs": [{"name": "text_output", "parameters": {"classification": 2}}],
            },
            400,
            "classification",
        ),
        ({"inputs": [], "extra": 1}, 400, "extra"),
    ],
)
def test_infer_bad_requests(http, kserve_server, body, status, needle):
    r = http.post(f"/v2/models/{kserve_server.model}/infer", json=body)
    assert r.status_code == status, r.text
    assert needle in r.json()["error"]


def test_infer_malformed_json_and_unknown_model(http, kserve_server):
    r = http.post(
        f"/v2/models/{kserve_server.model}/infer", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]
    r = http.post("/v2/models/no-such-model/infer", json={"inputs": []})
    assert r.status_code == 404 and kserve_server.model in r.json()["error"]
    r = http.get(f"/v2/models/{kserve_server.model}/versions/9")
    assert r.status_code == 404 and "version" in r.json()["error"]
    r = http.get("/v2/models/no-such-model/ready")
    assert r.status_code == 404
    r = http.get(f"/v2/models/{kserve_server.model}/stats")
    assert r.status_code == 501 and "not implemented" in r.json()["error"]


def test_infer_binary_size_mismatch(http, kserve_server):
    header = json.dumps(
        {"inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1], "parameters": {"binary_data_size": 50}}]}
    ).encode()
    r = http.post(
        f"/v2/models/{kserve_server.model}/infer",
        content=header + b"\x02\x00\x00\x00hi",
        headers={"Inference-Header-Content-Length": str(len(header))},
    )
    assert r.status_code == 400 and "binary_data_size" in r.json()["error"]


def test_tritonclient_http_error_surface(http_client, kserve_server):
    with pytest.raises(InferenceServerException) as info:
        http_client.infer("no-such-model", inputs("x"))
    assert kserve_server.model in info.value.message()


def test_generate(http, kserve_server):
    r = http.post(
        f"/v2/models/{kserve_server.model}/generate",
        json={"text_input": "The sky is", "exclude_input_in_output": True, "parameters": GREEDY},
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["model_name"] == kserve_server.model and body["model_version"] == kserve_server.version
    assert body["text_output"]
    # sampling_parameters as a JSON string (Triton vLLM samples) and top-level parameters are equivalent
    r2 = http.post(
        f"/v2/models/{kserve_server.model}/generate",
        json={"text_input": "The sky is", "exclude_input_in_output": True, "sampling_parameters": json.dumps(GREEDY)},
    )
    assert r2.json()["text_output"] == body["text_output"]
    r3 = http.post(
        f"/v2/models/{kserve_server.model}/generate",
        json={"text_input": "The sky is", "exclude_input_in_output": True, **GREEDY},
    )
    assert r3.json()["text_output"] == body["text_output"]
    # Triton's generate endpoint reads "id" as the request's id (not a sampling setting)
    r4 = http.post(
        f"/v2/models/{kserve_server.model}/generate",
        json={"text_input": "The sky is", "exclude_input_in_output": True, "id": "req-1", **GREEDY},
    )
    assert r4.status_code == 200 and r4.json()["text_output"] == body["text_output"], r4.text


def test_generate_stream(http, kserve_server):
    full = http.post(
        f"/v2/models/{kserve_server.model}/generate",
        json={"text_input": "Once upon", "exclude_input_in_output": True, "parameters": GREEDY},
    ).json()
    with http.stream(
        "POST",
        f"/v2/models/{kserve_server.model}/generate_stream",
        json={"text_input": "Once upon", "parameters": GREEDY},
    ) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        events = sse_events(r)
    assert len(events) > 1
    assert all("error" not in e for e in events)
    assert "".join(e["text_output"] for e in events) == full["text_output"]


def test_generate_structured_output(http, kserve_server):
    import jsonschema

    schema = {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}},
        "required": ["ok"],
        "additionalProperties": False,
    }
    r = http.post(
        f"/v2/models/{kserve_server.model}/generate",
        json={
            "text_input": "Answer:",
            "exclude_input_in_output": True,
            "parameters": {"max_tokens": 32, "structured_outputs": json.dumps({"json": schema})},
        },
    )
    assert r.status_code == 200, r.text
    jsonschema.validate(json.loads(r.json()["text_output"]), schema)


@pytest.mark.parametrize("path", ["generate", "generate_stream"])
@pytest.mark.parametrize(
    "body, status, needle",
    [
        ({"text_input": "x", "parameters": {"bogus": 1}}, 400, "'bogus'"),
        ({"text_input": "x", "bogus_top": 1}, 400, "'bogus_top'"),
        ({"text_input": 5}, 400, "'text_input' must be a string"),
        ({"text_input": "x", "id": 5}, 400, "'id' (the request's id) must be a string"),
        ({"parameters": {"max_tokens": 2}}, 400, "text_input"),
        ({"text_input": "x", "sampling_parameters": "{bad"}, 400, "not valid JSON"),
        ({"text_input": "word " * 3000}, 400, "refused"),
    ],
)
def test_generate_bad_requests(http, kserve_server, path, body, status, needle):
    r = http.post(f"/v2/models/{kserve_server.model}/{path}", json=body)
    assert r.status_code == status, r.text
    assert needle in r.json()["error"]


def test_generate_malformed_json_and_unknown_model(http, kserve_server):
    r = http.post(
        f"/v2/models/{kserve_server.model}/generate", content=b"[1,", headers={"content-type": "application/json"}
    )
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]
    r = http.post("/v2/models/other/generate_stream", json={"text_input": "x"})
    assert r.status_code == 404
    r = http.post(f"/v2/models/{kserve_server.model}/generate", json={"text_input": "x", "stream": True})
    assert r.status_code == 400 and "generate_stream" in r.json()["error"]


def test_router_mounts_on_another_app(kserve_server):
    """The same routes on a host app (as the OpenAI app mounts them), in-process via ASGI."""

    import httpx
    from fastapi import FastAPI

    from llmserve.serve.kserve import build_router

    app = FastAPI()

    @app.get("/v1/models")
    async def models():
        return {"data": []}

    app.include_router(build_router(kserve_server.readiness, model_version=kserve_server.version))

    async def call():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://app", timeout=120) as c:
            ready = await c.get("/v2/health/ready")
            gen = await c.post(
                f"/v2/models/{kserve_server.model}/generate", json={"text_input": "Hi", "parameters": {"max_tokens": 2}}
            )
            other = await c.get("/v1/models")
            return ready.status_code, gen.status_code, gen.json(), other.status_code

    ready, status, body, other = kserve_server.loop.run(call(), 120)
    assert (ready, status, other) == (200, 200, 200)
    assert body["text_output"].startswith("Hi")
