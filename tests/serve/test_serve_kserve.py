"""Both protocols through `llmserve serve`: the model the OpenAI API serves is the one tritonclient
reaches over KServe v2 gRPC and HTTP (the frontends themselves are tested in tests/serve_kserve)."""

import json
import re

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient


def _inputs(module, prompt: str, sampling: dict):
    text = module.InferInput("text_input", [1], "BYTES")
    text.set_data_from_numpy(np.array([prompt.encode()], dtype=np.object_))
    params = module.InferInput("sampling_parameters", [1], "BYTES")
    params.set_data_from_numpy(np.array([json.dumps(sampling).encode()], dtype=np.object_))
    return [text, params]


def test_grpc_and_kserve_http_on_the_openai_server(server, client, model_name):
    auth = {"authorization": f"Bearer {server.api_key}"}
    with grpcclient.InferenceServerClient(server.grpc_url) as c:
        assert c.is_server_live() and c.is_server_ready()
        meta = c.get_model_metadata(model_name, headers=auth)
        assert meta.inputs[0].name == "text_input"
        result = c.infer(model_name, _inputs(grpcclient, "Hello", {"max_tokens": 8, "temperature": 0}), headers=auth)
        grpc_text = result.as_numpy("text_output")[0].decode()
    # The same engine answers the OpenAI API with the same greedy continuation.
    completion = client.completions.create(model=model_name, prompt="Hello", max_tokens=8, temperature=0)
    assert grpc_text.endswith(completion.choices[0].text)
    http = httpclient.InferenceServerClient(server.base_url.removeprefix("http://"), network_timeout=120)
    try:
        assert http.is_server_ready()  # /v2/health/ready is open to probes without the key
        result = http.infer(model_name, _inputs(httpclient, "Hello", {"max_tokens": 8, "temperature": 0}), headers=auth)
        assert result.as_numpy("text_output")[0].decode() == grpc_text
        with pytest.raises(Exception, match="API key"):
            http.infer(model_name, _inputs(httpclient, "Hello", {"max_tokens": 2}))
    finally:
        http.close()
    # Both KServe transports are counted on the server's /metrics, next to the OpenAI endpoints.
    import httpx

    text = httpx.get(server.base_url + "/metrics", headers=server.headers(), timeout=30).text
    assert re.search(r'^llmserve_requests_total\{endpoint="kserve_grpc_ModelInfer",status="OK"\} [1-9]', text, re.M)
    assert re.search(r'^llmserve_requests_total\{endpoint="kserve_http_infer",status="200"\} [1-9]', text, re.M)


def test_serve_without_openai_is_kserve_only(tmp_path, serve_package, model_name, server_control):
    server = server_control.start(serve_package, tmp_path / "kserve-only.log", api_key=None, openai=False)
    try:
        http = httpclient.InferenceServerClient(server.base_url.removeprefix("http://"), network_timeout=120)
        result = http.infer(model_name, _inputs(httpclient, "Hi", {"max_tokens": 4}))
        assert result.as_numpy("text_output").shape == (1,)
        assert http.get_model_metadata(model_name)["versions"] == ["1"]
        http.close()
        import httpx

        metrics = httpx.get(server.base_url + "/metrics", timeout=10).text  # served by the KServe HTTP app alone
        assert re.search(r'^llmserve_requests_total\{endpoint="kserve_http_infer",status="200"\} 1\.0', metrics, re.M)
        assert re.search(r"^vllm:generation_tokens_total\{", metrics, re.M)

        assert httpx.get(server.base_url + "/v1/models", timeout=10).status_code == 404  # no OpenAI API
        with grpcclient.InferenceServerClient(server.grpc_url) as c:
            assert c.is_model_ready(model_name)
    finally:
        assert server_control.stop(server) == 0
