"""KServe v2 over gRPC through tritonclient.grpc, on the real engine."""

from __future__ import annotations

import json
import queue

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from support.kserve_inputs import text_inputs
from tritonclient.utils import InferenceServerException

from llmserve.formats.tensors import LLM_TEXT_CONTRACT

pytestmark = pytest.mark.engine

GREEDY = {"temperature": 0, "max_tokens": 12, "ignore_eos": True}


def inputs(prompt: str, *, stream: bool | None = None, sampling: dict | None = None, exclude: bool | None = None):
    return text_inputs(grpcclient, prompt, stream=stream, sampling=sampling, exclude=exclude)


def text_of(result) -> str:
    arr = result.as_numpy("text_output")
    assert arr.shape == (1,)
    return arr[0].decode("utf-8")


def error_of(call) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as info:
        call()
    return info.value


def test_readiness_before_engine(kserve_server):
    seen = kserve_server.before_ready
    assert seen["grpc_live"] is True
    assert seen["grpc_ready"] is False
    assert seen["grpc_model_ready"] is False
    status, message = seen["grpc_infer"]
    assert status == "StatusCode.UNAVAILABLE"
    assert "not ready" in message
    ((result, error),) = seen["grpc_stream"]
    assert result is None and "UNAVAILABLE" in str(error)


def test_health_and_metadata(grpc_client, kserve_server):
    assert grpc_client.is_server_live()
    assert grpc_client.is_server_ready()
    assert grpc_client.is_model_ready(kserve_server.model)
    assert grpc_client.is_model_ready(kserve_server.model, kserve_server.version)
    assert not grpc_client.is_model_ready("no-such-model")
    assert not grpc_client.is_model_ready(kserve_server.model, "99")

    server = grpc_client.get_server_metadata(as_json=True)
    assert server["name"] == "llmserve"
    assert "generate" in server["extensions"]

    meta = grpc_client.get_model_metadata(kserve_server.model, as_json=True)
    assert meta["name"] == kserve_server.model
    assert meta["versions"] == [kserve_server.version]
    want_in = [(t.name, t.datatype, [str(d) for d in t.dims]) for t in LLM_TEXT_CONTRACT.inputs]
    assert [(t["name"], t["datatype"], t["shape"]) for t in meta["inputs"]] == want_in
    want_out = [(t.name, t.datatype, [str(d) for d in t.dims]) for t in LLM_TEXT_CONTRACT.outputs]
    assert [(t["name"], t["datatype"], t["shape"]) for t in meta["outputs"]] == want_out


def test_model_config_is_decoupled(grpc_client, kserve_server):
    config = grpc_client.get_model_config(kserve_server.model, as_json=True)["config"]
    assert config["name"] == kserve_server.model
    assert config["model_transaction_policy"]["decoupled"] is True
    names = {i["name"]: i for i in config["input"]}
    assert names["text_input"]["data_type"] == "TYPE_STRING"
    assert names["stream"].get("optional") is True
    assert [o["name"] for o in config["output"]] == ["text_output"]


def test_infer_returns_text(grpc_client, kserve_server):
    result = grpc_client.infer(
        kserve_server.model, inputs("The sky is", sampling=GREEDY, exclude=True), request_id="r-1"
    )
    text = text_of(result)
    assert text  # 12 tokens of a random model, never empty with ignore_eos
    assert result.get_response().id == "r-1"
    assert result.get_response().model_version == kserve_server.version
    # deterministic under greedy sampling
    again = text_of(grpc_client.infer(kserve_server.model, inputs("The sky is", sampling=GREEDY, exclude=True)))
    assert again == text
    # by default the prompt is prepended (Triton vLLM backend behaviour)
    full = text_of(grpc_client.infer(kserve_server.model, inputs("The sky is", sampling=GREEDY)))
    assert full == "The sky is" + text


def test_infer_with_version_and_request_parameters(grpc_client, kserve_server):
    result = grpc_client.infer(
        kserve_server.model,
        inputs("Hello"),
        model_version=kserve_server.version,
        parameters={"temperature": 0.0, "max_tokens": 3, "ignore_eos": True},
    )
    assert text_of(result).startswith("Hello")


def stream_requests(client, model, requests, *, timeout=240):
    """Send (request_id, inputs) on one stream; collect responses per id until each is final."""
    responses: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    try:
        for rid, ins in requests:
            client.async_stream_infer(model, ins, request_id=rid)
        got: dict[str, list] = {rid: [] for rid, _ in requests}
        errors: dict[str, str] = {}
        pending = set(got)
        while pending:
            result, error = responses.get(timeout=timeout)
            if error is not None:
                errors[str(len(errors))] = str(error)
                pending.pop()
                continue
            resp = result.get_response()
            final = resp.parameters["triton_final_response"].bool_param
            got[resp.id].append((text_of(result), final))
            if final:
                pending.discard(resp.id)
        return got, errors
    finally:
        client.stop_stream()


def test_stream_infer_token_deltas(grpc_client, kserve_server):
    prompt = "Once upon a time"
    full = text_of(grpc_client.infer(kserve_server.model, inputs(prompt, sampling=GREEDY, exclude=True)))
    got, errors = stream_requests(
        grpc_client, kserve_server.model, [("s-1", inputs(prompt, stream=True, sampling=GREEDY))]
    )
    assert not errors
    parts = got["s-1"]
    assert len(parts) > 1, "a token stream sends one response per delta"
    assert [f for _, f in parts] == [False] * (len(parts) - 1) + [True]
    assert all(t for t, f in parts[:-1])  # no empty non-final responses
    # The non-streamed text is vLLM's one-shot detokenization (FINAL_ONLY); deltas split mid-character
    # would each carry a U+FFFD and the concatenation would differ from it.
    assert "".join(t for t, _ in parts) == full


def test_stream_concurrent_requests_on_one_stream(grpc_client, kserve_server):
    reqs = [(f"c-{i}", inputs(f"Prompt number {i}", stream=True, sampling=GREEDY)) for i in range(3)]
    got, errors = stream_requests(grpc_client, kserve_server.model, reqs)
    assert not errors
    for rid, _ in reqs:
        assert got[rid][-1][1] is True
        assert "".join(t for t, _ in got[rid])


def test_stream_without_stream_flag_sends_one_final_response(grpc_client, kserve_server):
    got, errors = stream_requests(
        grpc_client, kserve_server.model, [("one", inputs("Hi there", sampling={"max_tokens": 4}))]
    )
    assert not errors
    assert len(got["one"]) == 1
    text, final = got["one"][0]
    assert final and text.startswith("Hi there")


def test_stream_bad_request_reports_error_and_stream_survives(grpc_client, kserve_server):
    responses: queue.Queue = queue.Queue()
    grpc_client.start_stream(callback=lambda result, error: responses.put((result, error)))
    try:
        grpc_client.async_stream_infer(kserve_server.model, inputs("x", sampling={"nope": 1}), request_id="bad")
        result, error = responses.get(timeout=120)
        assert result is None and "nope" in str(error)
        grpc_client.async_stream_infer(
            kserve_server.model, inputs("y", stream=True, sampling={"max_tokens": 2}), request_id="good"
        )
        finals = 0
        while not finals:
            result, error = responses.get(timeout=120)
            assert error is None
            finals += result.get_response().parameters["triton_final_response"].bool_param
    finally:
        grpc_client.stop_stream()


def test_structured_outputs_json_schema(grpc_client, kserve_server):
    # bounded on purpose: a random-weight model fills an unbounded string or number until max_tokens
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 8}, "ok": {"type": "boolean"}},
        "required": ["name", "ok"],
        "additionalProperties": False,
    }
    import jsonschema

    for seed in range(3):
        sampling = {"temperature": 1.0, "seed": seed, "max_tokens": 64, "structured_outputs": {"json": schema}}
        text = text_of(grpc_client.infer(kserve_server.model, inputs("Person:", sampling=sampling, exclude=True)))
        jsonschema.validate(json.loads(text), schema), text


@pytest.mark.parametrize(
    "sampling, needle",
    [
        ({"nope": 1}, "'nope'"),
        ({"logprobs": 2}, "'logprobs'"),
        ({"guided_json": {}}, "structured_outputs"),
        ({"temperature": "hot"}, "'temperature'"),
        ({"n": 2}, "n=1"),
        ({"structured_outputs": {"json": {"type": "object"}, "regex": "a+"}}, "exactly one"),
        ({"structured_outputs": {"jsn": {}}}, "jsn"),
        ({"temperature": -1}, "temperature"),
    ],
)
def test_bad_sampling_is_invalid_argument(grpc_client, kserve_server, sampling, needle):
    err = error_of(lambda: grpc_client.infer(kserve_server.model, inputs("x", sampling=sampling)))
    assert err.status() == "StatusCode.INVALID_ARGUMENT"
    assert needle in err.message()


def test_bad_request_parameter_and_conflict(grpc_client, kserve_server):
    err = error_of(lambda: grpc_client.infer(kserve_server.model, inputs("x"), parameters={"temprature": 1.0}))
    assert err.status() == "StatusCode.INVALID_ARGUMENT" and "'temprature'" in err.message()
    err = error_of(
        lambda: grpc_client.infer(
            kserve_server.model, inputs("x", sampling={"max_tokens": 2}), parameters={"max_tokens": 3}
        )
    )
    assert err.status() == "StatusCode.INVALID_ARGUMENT" and "both" in err.message()
    err = error_of(lambda: grpc_client.infer(kserve_server.model, inputs("x"), sequence_id=7, sequence_start=True))
    assert err.status() == "StatusCode.INVALID_ARGUMENT" and "sequence" in err.message()


def test_unknown_model_and_version(grpc_client, kserve_server):
    err = error_of(lambda: grpc_client.infer("no-such-model", inputs("x")))
    assert err.status() == "StatusCode.NOT_FOUND" and kserve_server.model in err.message()
    err = error_of(lambda: grpc_client.infer(kserve_server.model, inputs("x"), model_version="7"))
    assert err.status() == "StatusCode.NOT_FOUND" and "version" in err.message()
    err = error_of(lambda: grpc_client.get_model_metadata("no-such-model"))
    assert err.status() == "StatusCode.NOT_FOUND"


def test_bad_tensors(grpc_client, kserve_server):
    t = grpcclient.InferInput("text_input", [1], "INT32")
    t.set_data_from_numpy(np.array([1], dtype=np.int32))
    err = error_of(lambda: grpc_client.infer(kserve_server.model, [t]))
    assert err.status() == "StatusCode.INVALID_ARGUMENT" and "datatype INT32" in err.message()

    t = grpcclient.InferInput("prompt", [1], "BYTES")
    t.set_data_from_numpy(np.array([b"x"], dtype=object))
    err = error_of(lambda: grpc_client.infer(kserve_server.model, [t]))
    assert err.status() == "StatusCode.INVALID_ARGUMENT" and "unknown input 'prompt'" in err.message()

    t = grpcclient.InferInput("text_input", [2], "BYTES")
    t.set_data_from_numpy(np.array([b"x", b"y"], dtype=object))
    err = error_of(lambda: grpc_client.infer(kserve_server.model, [t]))
    assert err.status() == "StatusCode.INVALID_ARGUMENT" and "shape" in err.message()

    s = grpcclient.InferInput("stream", [1], "BOOL")
    s.set_data_from_numpy(np.array([True], dtype=bool))
    err = error_of(lambda: grpc_client.infer(kserve_server.model, [s]))
    assert err.status() == "StatusCode.INVALID_ARGUMENT" and "text_input" in err.message()

    err = error_of(lambda: grpc_client.infer(kserve_server.model, inputs("x", stream=True)))
    assert err.status() == "StatusCode.INVALID_ARGUMENT" and "ModelStreamInfer" in err.message()

    err = error_of(
        lambda: grpc_client.infer(kserve_server.model, inputs("x"), outputs=[grpcclient.InferRequestedOutput("logits")])
    )
    assert err.status() == "StatusCode.INVALID_ARGUMENT" and "unknown output 'logits'" in err.message()

    bad_json = grpcclient.InferInput("sampling_parameters", [1], "BYTES")
    bad_json.set_data_from_numpy(np.array([b"{temperature: 0"], dtype=object))
    err = error_of(lambda: grpc_client.infer(kserve_server.model, [*inputs("x")[:1], bad_json]))
    assert err.status() == "StatusCode.INVALID_ARGUMENT" and "not valid JSON" in err.message()


def test_prompt_too_long_is_invalid(grpc_client, kserve_server):
    err = error_of(lambda: grpc_client.infer(kserve_server.model, inputs("word " * 3000)))
    assert err.status() == "StatusCode.INVALID_ARGUMENT"


def test_unimplemented_rpcs_say_so(grpc_client):
    err = error_of(lambda: grpc_client.get_inference_statistics())
    assert err.status() == "StatusCode.UNIMPLEMENTED" and "ModelStatistics" in err.message()
    err = error_of(lambda: grpc_client.get_model_repository_index())
    assert err.status() == "StatusCode.UNIMPLEMENTED" and "RepositoryIndex" in err.message()


def test_api_key_on_grpc(kserve_server):
    API_KEY = kserve_server.api_key
    with grpcclient.InferenceServerClient(kserve_server.grpc_auth_url) as c:
        assert c.is_server_ready()  # health RPCs are open, like /health
        err = error_of(lambda: c.get_model_metadata(kserve_server.model))
        assert err.status() == "StatusCode.UNAUTHENTICATED"
        assert API_KEY not in err.message()
        meta = c.get_model_metadata(kserve_server.model, headers={"authorization": f"Bearer {API_KEY}"})
        assert meta.name == kserve_server.model
        err = error_of(lambda: c.infer(kserve_server.model, inputs("x"), headers={"authorization": "Bearer wrong"}))
        assert err.status() == "StatusCode.UNAUTHENTICATED"


def test_stream_echoes_multibyte_prompt_and_empty_final_option(grpc_client, kserve_server):
    prompt = "Grüße, 世界 ✓"
    responses: queue.Queue = queue.Queue()
    grpc_client.start_stream(callback=lambda result, error: responses.put((result, error)))
    try:
        grpc_client.async_stream_infer(
            kserve_server.model,
            inputs(prompt, stream=True, exclude=False, sampling={"max_tokens": 5, "ignore_eos": True}),
            request_id="mb",
            enable_empty_final_response=True,
        )
        parts = []
        while not parts or not parts[-1][1]:
            result, error = responses.get(timeout=120)
            assert error is None, error
            parts.append((text_of(result), result.get_response().parameters["triton_final_response"].bool_param))
    finally:
        grpc_client.stop_stream()
    assert parts[0][0].startswith(prompt)  # exclude_input_in_output=false echoes the prompt first


def test_priority_without_priority_scheduling_is_refused(grpc_client, kserve_server):
    err = error_of(lambda: grpc_client.infer(kserve_server.model, inputs("x"), priority=3))
    assert err.status() == "StatusCode.INVALID_ARGUMENT" and "priority" in err.message().lower()


def test_drain_finishes_in_flight_and_refuses_new(kserve_server):
    """A second frontend on the same engine: drain lets the running request finish, then closes."""
    import threading

    from llmserve.serve.kserve import KServeGrpcFrontend
    from llmserve.serve.readiness import Readiness

    readiness = Readiness()
    readiness.set_ready(kserve_server.readiness.handle)
    frontend = KServeGrpcFrontend("127.0.0.1", 0, model_version=kserve_server.version)
    kserve_server.loop.run(frontend.start(readiness), 30)
    url = frontend.address.split("://", 1)[1]
    outcome: dict = {}

    def long_request():
        with grpcclient.InferenceServerClient(url) as c:
            try:
                outcome["text"] = text_of(
                    c.infer(
                        kserve_server.model,
                        inputs("Tell", sampling={"max_tokens": 48, "ignore_eos": True}, exclude=True),
                    )
                )
            except InferenceServerException as exc:
                outcome["error"] = exc

    t = threading.Thread(target=long_request)
    t.start()
    import time

    time.sleep(0.5)

    async def drain():
        readiness.set_draining()
        await frontend.drain(60)

    kserve_server.loop.run(drain(), 90)
    t.join(60)
    assert "text" in outcome, outcome.get("error")
    with grpcclient.InferenceServerClient(url) as c, pytest.raises(InferenceServerException):
        c.is_server_live(client_timeout=5)
