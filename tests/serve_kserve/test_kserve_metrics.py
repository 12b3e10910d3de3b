"""KServe v2 requests are counted in llmserve_requests_total / llmserve_request_seconds, read back through
ServerMetrics.exposition() (what `llmserve serve` answers on /metrics), on the real engine."""

from __future__ import annotations

import queue
from collections import Counter

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from support.kserve_inputs import text_inputs
from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.engine

SHORT = {"temperature": 0, "max_tokens": 2}


def series(metrics) -> tuple[Counter, Counter]:
    """(requests by (endpoint, status), latency observations by endpoint) from the exposition text."""
    from prometheus_client.parser import text_string_to_metric_families

    body, _ = metrics.exposition()
    requests, observed = Counter(), Counter()
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            if s.name == "llmserve_requests_total" and s.labels["endpoint"].startswith("kserve_"):
                requests[(s.labels["endpoint"], s.labels["status"])] += s.value
            elif s.name == "llmserve_request_seconds_count" and s.labels["endpoint"].startswith("kserve_"):
                observed[s.labels["endpoint"]] += s.value
    return requests, observed


def test_requests_before_ready_were_counted_as_refused(kserve_server):
    requests, _ = series(kserve_server.metrics)
    # conftest's _observe_not_ready: one of each while the engine was starting
    assert requests[("kserve_http_generate", "503")] == 1
    assert requests[("kserve_grpc_ModelInfer", "UNAVAILABLE")] == 1
    assert requests[("kserve_grpc_ModelStreamInfer", "UNAVAILABLE")] == 1


def test_kserve_requests_are_counted_by_endpoint_and_status(kserve_server, grpc_client, http_client, http):
    model = kserve_server.model
    before, seen_before = series(kserve_server.metrics)

    # gRPC: one success, one INVALID_ARGUMENT, one stream with one request
    grpc_client.infer(model, text_inputs(grpcclient, "Hi", sampling=SHORT))
    with pytest.raises(InferenceServerException) as info:
        grpc_client.infer(model, text_inputs(grpcclient, "Hi", sampling={"max_tokens": 2, "bogus_key": 1}))
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
    got: queue.Queue = queue.Queue()
    grpc_client.start_stream(callback=lambda result, error: got.put((result, error)))
    try:
        grpc_client.async_stream_infer(model, text_inputs(grpcclient, "Hi", stream=False, sampling=SHORT))
        _result, error = got.get(timeout=120)
        assert error is None
    finally:
        grpc_client.stop_stream()

    # HTTP: infer 200 and 400, generate 200 and 400, generate_stream 200
    http_client.infer(model, text_inputs(httpclient, "Hi", sampling=SHORT))
    r = http.post(f"/v2/models/{model}/infer", json={"inputs": [], "extra": 1})
    assert r.status_code == 400
    assert http.post(f"/v2/models/{model}/generate", json={"text_input": "Hi", "parameters": SHORT}).status_code == 200
    r = http.post(f"/v2/models/{model}/generate", json={"text_input": "Hi", "parameters": {"bogus": 1}})
    assert r.status_code == 400
    r = http.post(f"/v2/models/{model}/generate_stream", json={"text_input": "Hi", "parameters": SHORT})
    assert r.status_code == 200 and "data: " in r.text

    # health and metadata are not counted (as the OpenAI app does not count /health and /v1/models)
    assert grpc_client.is_server_ready() and grpc_client.get_model_metadata(model)
    assert http_client.is_model_ready(model) and http_client.get_model_metadata(model)

    after, seen_after = series(kserve_server.metrics)
    assert after - before == Counter(
        {
            ("kserve_grpc_ModelInfer", "OK"): 1,
            ("kserve_grpc_ModelInfer", "INVALID_ARGUMENT"): 1,
            ("kserve_grpc_ModelStreamInfer", "OK"): 1,
            ("kserve_http_infer", "200"): 1,
            ("kserve_http_infer", "400"): 1,
            ("kserve_http_generate", "200"): 1,
            ("kserve_http_generate", "400"): 1,
            ("kserve_http_generate_stream", "200"): 1,
        }
    )
    assert seen_after - seen_before == Counter(
        {
            "kserve_grpc_ModelInfer": 2,
            "kserve_grpc_ModelStreamInfer": 1,
            "kserve_http_infer": 2,
            "kserve_http_generate": 2,
            "kserve_http_generate_stream": 1,
        }
    )
