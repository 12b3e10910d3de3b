"""Constraints over KServe v2 (gRPC ModelInfer / ModelStreamInfer, HTTP infer and generate), on the
session's real engine, which runs llmserve's constraint processor as `llmserve serve` does.

A request carries one constraint under the keys the OpenAI API takes in `vllm_xargs`
(constraint_regex, constraint_choice, constraint_json_schema, constraint), in the
sampling_parameters JSON or as request parameters, or under `extra_args` (Triton's vLLM backend
spelling). The tiny model has random weights, so every matching output below is the processor's doing.
No per-request `seed`: with chunked prefill it crashes vLLM's CPU sampler.
"""

from __future__ import annotations

import dataclasses
import json
import queue
import re

import jsonschema
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from support.kserve_inputs import text_inputs
from tritonclient.utils import InferenceServerException

from llmserve.serve.constraint_keys import ConstraintSupport
from llmserve.serve.kserve.errors import KServeError
from llmserve.serve.kserve.sampling import build_settings

pytestmark = pytest.mark.engine

DATE = r"\d{4}-\d{2}-\d{2}"
CHOICES = ["yes", "no", "maybe later"]
SAMPLE = {"temperature": 1.0, "max_tokens": 40}
N = 4


def _inputs(module, prompt: str, sampling: dict | None = None, *, stream: bool | None = None):
    return text_inputs(module, prompt, stream=stream, sampling=sampling, exclude=True)


def _text(result) -> str:
    value = result.as_numpy("text_output")[0]
    return value.decode("utf-8") if isinstance(value, bytes) else value


def _support(kserve_server) -> ConstraintSupport:
    """What the session engine reports (its EngineHandle.constraints, which the frontends check against)."""
    return kserve_server.readiness.handle.constraints


@pytest.fixture
def without_processor(kserve_server):
    """What the frontends see on a server started with --no-constraints: the same engine, its handle
    reporting the processor not loaded (the frontends read it from the readiness they were given)."""
    readiness = kserve_server.readiness
    handle = readiness.handle
    readiness.handle = dataclasses.replace(
        handle, constraints=ConstraintSupport(False, "the server was started with --no-constraints")
    )
    yield
    readiness.handle = handle


# ---- the mapping (no request to the engine; the session engine has reported the processor loaded) --


def test_the_engine_reports_the_processor(kserve_server):
    assert _support(kserve_server).loaded, _support(kserve_server).reason


@pytest.mark.parametrize(
    "tensor, params, extra_args",
    [
        ({"constraint_regex": DATE}, {}, {"constraint_regex": DATE}),
        ({}, {"constraint_regex": DATE}, {"constraint_regex": DATE}),
        ({}, {"constraint_choice": json.dumps(CHOICES)}, {"constraint_choice": CHOICES}),  # gRPC: lists as JSON text
        ({"constraint": {"regex": DATE}}, {}, {"constraint": json.dumps({"regex": DATE})}),
        ({"extra_args": {"constraint_choice": CHOICES}}, {}, {"constraint_choice": CHOICES}),
        ({"extra_args": json.dumps({"constraint_regex": DATE})}, {}, {"constraint_regex": DATE}),
        ({"constraint_regex": None, "max_tokens": 3}, {}, None),
    ],
)
def test_constraint_keys_reach_extra_args(kserve_server, tensor, params, extra_args):
    settings = build_settings(tensor, params, transport="grpc", constraints=_support(kserve_server))
    assert settings.sampling.get("extra_args") == extra_args


@pytest.mark.parametrize(
    "tensor, params, needle",
    [
        ({"constraint_regex": "[0-9"}, {}, "sampling_parameters key 'constraint_regex': invalid constraint"),
        ({}, {"constraint": json.dumps({"regx": "a"})}, "request parameter key 'constraint': invalid constraint"),
        ({"constraint_json_schema": {"type": "bogus"}}, {}, "key 'constraint_json_schema': invalid constraint"),
        ({"constraint_choice": "yes"}, {}, "key 'constraint_choice' must be a non-empty array of strings"),
        ({"constraint_regex": "a", "constraint_choice": ["a"]}, {}, "give one constraint per request"),
        ({"constraint_regex": "a"}, {"constraint_regex": "b"}, "set it in one place"),
        ({"extra_args": {"session": "s1"}}, {}, "'extra_args.session' is not supported"),
        ({"vllm_xargs": {"constraint_regex": "a"}}, {}, "'vllm_xargs' is not supported"),
    ],
)
def test_bad_constraints_name_the_key(kserve_server, tensor, params, needle):
    with pytest.raises(KServeError) as info:
        build_settings(tensor, params, transport="grpc", constraints=_support(kserve_server))
    assert info.value.http_status == 400 and needle in info.value.message


# ---- gRPC --------------------------------------------------------------------------------------------


def test_grpc_regex_fully_matches(grpc_client, kserve_server):
    for i in range(N):
        where = (
            {"sampling": {**SAMPLE, "constraint_regex": DATE}}
            if i % 2
            else {"sampling": SAMPLE, "parameters": {"constraint_regex": DATE}}
        )
        result = grpc_client.infer(
            kserve_server.model, _inputs(grpcclient, "Date: ", where["sampling"]), parameters=where.get("parameters")
        )
        assert re.fullmatch(DATE, _text(result)), _text(result)


def test_grpc_stream_regex_fully_matches(grpc_client, kserve_server):
    responses: queue.Queue = queue.Queue()
    grpc_client.start_stream(callback=lambda result, error: responses.put((result, error)))
    try:
        sampling = {**SAMPLE, "constraint": {"regex": DATE}}
        grpc_client.async_stream_infer(
            kserve_server.model, _inputs(grpcclient, "Date: ", sampling, stream=True), request_id="c-1"
        )
        parts, final = [], False
        while not final:
            result, error = responses.get(timeout=120)
            assert error is None, error
            parts.append(_text(result))
            final = result.get_response().parameters["triton_final_response"].bool_param
    finally:
        grpc_client.stop_stream()
    assert re.fullmatch(DATE, "".join(parts)), parts


def test_grpc_choice(grpc_client, kserve_server):
    for i in range(N):
        kwargs = {"parameters": {"constraint_choice": json.dumps(CHOICES)}} if i % 2 else {}
        sampling = SAMPLE if i % 2 else {**SAMPLE, "constraint_choice": CHOICES}
        text = _text(grpc_client.infer(kserve_server.model, _inputs(grpcclient, "Answer: ", sampling), **kwargs))
        assert text in CHOICES, text


@pytest.mark.parametrize(
    "sampling, parameters, needle",
    [
        ({"constraint_regex": "[0-9"}, None, "'constraint_regex'"),
        ({"constraint": {"json_schema": {"type": "bogus"}}}, None, "'constraint'"),
        (None, {"constraint_choice": "yes"}, "'constraint_choice'"),
    ],
)
def test_grpc_invalid_constraint_is_invalid_argument(grpc_client, kserve_server, sampling, parameters, needle):
    with pytest.raises(InferenceServerException) as info:
        grpc_client.infer(kserve_server.model, _inputs(grpcclient, "x", sampling), parameters=parameters)
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert needle in info.value.message()


def test_grpc_refused_without_the_processor(grpc_client, kserve_server, without_processor):
    with pytest.raises(InferenceServerException) as info:
        grpc_client.infer(kserve_server.model, _inputs(grpcclient, "x", {"constraint_regex": DATE}))
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "'constraint_regex'" in info.value.message() and "not loaded" in info.value.message()
    assert "--no-constraints" in info.value.message()
    # a request without a constraint is served as before
    assert _text(grpc_client.infer(kserve_server.model, _inputs(grpcclient, "x", {"max_tokens": 2})))


# ---- HTTP ----------------------------------------------------------------------------------------------


def test_http_infer_regex_fully_matches(http_client, kserve_server):
    result = http_client.infer(kserve_server.model, _inputs(httpclient, "Date: ", {**SAMPLE, "constraint_regex": DATE}))
    assert re.fullmatch(DATE, _text(result)), _text(result)


@pytest.mark.parametrize(
    "body",
    [
        {"parameters": {**SAMPLE, "constraint_regex": DATE}},
        {**SAMPLE, "constraint": {"regex": DATE}},  # top-level keys are parameters in the generate extension
        {"sampling_parameters": json.dumps({**SAMPLE, "extra_args": {"constraint_regex": DATE}})},  # Triton vLLM style
    ],
)
def test_http_generate_regex_fully_matches(http, kserve_server, body):
    r = http.post(
        f"/v2/models/{kserve_server.model}/generate",
        json={"text_input": "Date: ", "exclude_input_in_output": True, **body},
    )
    assert r.status_code == 200, r.text
    assert re.fullmatch(DATE, r.json()["text_output"]), r.json()


def test_http_generate_stream_choice_and_json_schema(http, kserve_server):
    with http.stream(
        "POST",
        f"/v2/models/{kserve_server.model}/generate_stream",
        json={"text_input": "Answer: ", "parameters": {**SAMPLE, "constraint_choice": CHOICES}},
    ) as r:
        assert r.status_code == 200
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    assert all("error" not in e for e in events)
    assert "".join(e["text_output"] for e in events) in CHOICES

    schema = {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}, "color": {"enum": ["red", "blue"]}},
        "required": ["ok", "color"],
    }
    r = http.post(
        f"/v2/models/{kserve_server.model}/generate",
        json={
            "text_input": "JSON: ",
            "exclude_input_in_output": True,
            "parameters": {**SAMPLE, "max_tokens": 60, "constraint_json_schema": json.dumps(schema)},
        },
    )
    assert r.status_code == 200, r.text
    jsonschema.validate(json.loads(r.json()["text_output"]), schema)


@pytest.mark.parametrize("path", ["generate", "generate_stream"])
def test_http_invalid_constraint_is_400(http, kserve_server, path):
    r = http.post(
        f"/v2/models/{kserve_server.model}/{path}",
        json={"text_input": "x", "parameters": {"constraint": {"regex": "(a"}}},
    )
    assert r.status_code == 400, r.text
    assert "'constraint'" in r.json()["error"] and "invalid constraint" in r.json()["error"]


def test_http_refused_without_the_processor(http, http_client, kserve_server, without_processor):
    r = http.post(f"/v2/models/{kserve_server.model}/generate", json={"text_input": "x", "constraint_choice": CHOICES})
    assert r.status_code == 400 and "not loaded" in r.json()["error"] and "'constraint_choice'" in r.json()["error"]
    with pytest.raises(InferenceServerException) as info:
        http_client.infer(kserve_server.model, _inputs(httpclient, "x", {"constraint_regex": DATE}))
    assert "not loaded" in info.value.message()
