"""No request can take the server down (#11, HTTP and gRPC frontends): every limit is a 400/413 in
the protocol's own error shape, never a 500, and nothing a client sends is echoed into the log raw.

All against the session's real `llmserve serve --openai` (tests/serve/conftest.py), with real
clients: httpx, openai, tritonclient.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import zlib

import httpx
import numpy as np
import openai
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

MSG = [{"role": "user", "content": "hi"}]
BODY_LIMIT = 8 * 1024 * 1024  # the server's default --max-body-bytes
PROMPT_LIMIT = 200_000  # the default --max-prompt-chars


def _openai_err(r: httpx.Response) -> dict:
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    return body["error"]


def _kserve_err(r: httpx.Response) -> str:
    body = r.json()
    assert set(body) == {"error"} and isinstance(body["error"], str), body
    return body["error"]


def _infer_body(prompt: str = "hi", sampling: dict | None = None) -> dict:
    inputs = [{"name": "text_input", "datatype": "BYTES", "shape": [1], "data": [prompt]}]
    if sampling is not None:
        inputs.append(
            {"name": "sampling_parameters", "datatype": "BYTES", "shape": [1], "data": [json.dumps(sampling)]}
        )
    return {"inputs": inputs}


def _deep(depth: int) -> str:
    return "[" * depth + "]" * depth


def _grpc_inputs(prompt: str, sampling: str | None = None) -> list:
    t = grpcclient.InferInput("text_input", [1], "BYTES")
    t.set_data_from_numpy(np.array([prompt.encode()], dtype=object))
    out = [t]
    if sampling is not None:
        s = grpcclient.InferInput("sampling_parameters", [1], "BYTES")
        s.set_data_from_numpy(np.array([sampling.encode()], dtype=object))
        out.append(s)
    return out


API_KEY = "hardening-key-0123456789"


# This module's own server (the session one's 240 s start timeout is too short on a loaded machine,
# and the hostile requests here should not share a log with other modules' assertions).
@pytest.fixture(scope="module")
def server(tmp_path_factory, serve_package, server_control):
    log = tmp_path_factory.mktemp("hardening-log") / "server.log"
    srv = server_control.start(serve_package, log, api_key=API_KEY, ready_timeout=900)
    yield srv
    assert server_control.stop(srv) == 0, srv.log_text()[-3000:]


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.base_url, headers=server.headers(), timeout=300) as c:
        yield c


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key=server.api_key, timeout=300, max_retries=0)


@pytest.fixture(scope="module")
def grpc(server):
    with grpcclient.InferenceServerClient(server.grpc_url) as c:
        yield c


@pytest.fixture(scope="module")
def auth(server) -> dict:
    return {"authorization": f"Bearer {server.api_key}"}


# ---- 1. compressed KServe bodies are bounded by their decompressed size ---------------------------


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_compression_bomb_is_413(http, model_name, encoding):
    # ~30 KB on the wire, 32 MiB inflated: the limit counts what the body becomes
    inflated = b'{"inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1], "data": ["' + b" " * (
        32 * 1024 * 1024
    )
    packed = gzip.compress(inflated) if encoding == "gzip" else zlib.compress(inflated)
    assert len(packed) < BODY_LIMIT // 100
    r = http.post(
        f"/v2/models/{model_name}/infer",
        content=packed,
        headers={"content-type": "application/json", "content-encoding": encoding},
    )
    assert r.status_code == 413, r.text
    assert "--max-body-bytes" in _kserve_err(r)


def test_compressed_body_under_the_limit_still_works(http, model_name):
    body = json.dumps(_infer_body("hello", {"max_tokens": 2})).encode()
    r = http.post(
        f"/v2/models/{model_name}/infer",
        content=gzip.compress(body),
        headers={"content-type": "application/json", "content-encoding": "gzip"},
    )
    assert r.status_code == 200, r.text
    r = http.post(
        f"/v2/models/{model_name}/infer",
        content=b"\x1f\x8b not gzip",
        headers={"content-type": "application/json", "content-encoding": "gzip"},
    )
    assert r.status_code == 400 and "gzip" in _kserve_err(r)


# ---- 2. chunked bodies over the limit -------------------------------------------------------------


def _chunks(total: int, piece: int = 1024 * 1024):
    yield b'{"prompt": "'
    sent = 0
    while sent < total:
        yield b"x" * piece
        sent += piece
    yield b'"}'


def test_chunked_body_over_the_limit_is_413_openai(http):
    # no Content-Length: the guard can only count the chunks as they arrive
    r = http.post(
        "/v1/completions", content=_chunks(BODY_LIMIT + 1024 * 1024), headers={"content-type": "application/json"}
    )
    assert r.status_code == 413, r.text
    assert _openai_err(r)["code"] == "request_too_large"


def test_chunked_body_over_the_limit_is_413_kserve(http, model_name):
    r = http.post(
        f"/v2/models/{model_name}/infer",
        content=_chunks(BODY_LIMIT + 1024 * 1024),
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 413, r.text
    assert "--max-body-bytes" in _kserve_err(r)


def test_chunked_body_under_the_limit_works(http, model_name):
    def body():
        yield json.dumps({"model": model_name, "prompt": "hi", "max_tokens": 1}).encode()

    r = http.post("/v1/completions", content=body(), headers={"content-type": "application/json"})
    assert r.status_code == 200, r.text


# ---- 3. deeply nested JSON is a 400 naming the problem, not a 500 with the exception ---------------


def test_deep_json_openai(http):
    r = http.post("/v1/chat/completions", content=_deep(100_000), headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    err = _openai_err(r)
    assert err["code"] == "invalid_json" and "nested" in err["message"] and "recursion" not in err["message"]


def test_moderately_deep_json_openai(http, model_name):
    # parses (under the interpreter's recursion limit) but would overflow a recursive walk later
    schema = {}
    for _ in range(200):
        schema = {"type": "object", "properties": {"a": schema}}
    body = {
        "model": model_name,
        "messages": MSG,
        "response_format": {"type": "json_schema", "json_schema": {"name": "deep", "schema": schema}},
    }
    r = http.post("/v1/chat/completions", json=body)
    assert r.status_code == 400, r.text
    assert "nested" in _openai_err(r)["message"]


@pytest.mark.parametrize("route", ["infer", "generate", "generate_stream"])
def test_deep_json_kserve_http(http, model_name, route):
    r = http.post(f"/v2/models/{model_name}/{route}", content=_deep(100_000))
    assert r.status_code == 400, r.text
    msg = _kserve_err(r)
    assert "nested" in msg and "recursion" not in msg


def test_deep_sampling_parameters_kserve_http(http, model_name):
    r = http.post(f"/v2/models/{model_name}/generate", json={"text_input": "hi", "sampling_parameters": _deep(50_000)})
    assert r.status_code == 400, r.text
    msg = _kserve_err(r)
    assert "sampling_parameters" in msg and "nested" in msg and "recursion" not in msg


def test_deep_sampling_parameters_grpc(grpc, model_name, auth):
    with pytest.raises(InferenceServerException) as info:
        grpc.infer(model_name, _grpc_inputs("hi", _deep(50_000)), headers=auth)
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT", info.value.message()
    assert "nested" in info.value.message() and "recursion" not in info.value.message()


# ---- 4. --max-prompt-chars applies to the KServe v2 routes ------------------------------------------


def test_prompt_limit_kserve_http(http, model_name):
    prompt = "x" * (PROMPT_LIMIT + 1)
    r = http.post(f"/v2/models/{model_name}/generate", json={"text_input": prompt})
    assert r.status_code == 400 and "--max-prompt-chars" in _kserve_err(r)
    r = http.post(f"/v2/models/{model_name}/infer", json=_infer_body(prompt))
    assert r.status_code == 400 and "--max-prompt-chars" in _kserve_err(r)


def test_prompt_limit_grpc(grpc, model_name, auth):
    prompt = "x" * (PROMPT_LIMIT + 1)
    with pytest.raises(InferenceServerException) as info:
        grpc.infer(model_name, _grpc_inputs(prompt), headers=auth)
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT" and "--max-prompt-chars" in info.value.message()
    got: list = []
    grpc.start_stream(callback=lambda result, error: got.append(error), headers=auth)
    try:
        grpc.async_stream_infer(model_name, _grpc_inputs(prompt))
    finally:
        grpc.stop_stream()
    assert got and got[0] is not None and "--max-prompt-chars" in str(got[0])


# ---- 5. request-supplied text is escaped in the log -------------------------------------------------


def test_user_field_cannot_forge_log_lines(http, server, model_name):
    forged = "12:00:00 llmserve INFO forged-line-marker"
    user = "mallory\n" + forged + "\r\x1b[2J" + "u" * 5000
    r = http.post(
        "/v1/chat/completions",
        json={"model": model_name, "messages": MSG, "max_tokens": 1, "user": user},
        headers={"x-request-id": b"rid\x85forged"},  # NEL: a line break to some log readers
    )
    assert r.status_code == 200, r.text
    log = server.log_text()
    assert "mallory\\n12:00:00 llmserve INFO forged-line-marker" in log  # logged, escaped
    assert not any(line.startswith(forged) for line in log.splitlines())
    assert "\x1b" not in log and "\x85" not in log and "rid\\x85forged" in log
    assert "u" * 1000 not in log  # bounded


# ---- 6. no server filesystem path in any response ---------------------------------------------------


def test_no_server_paths_in_responses(http, server, grpc, model_name, auth):
    cache = os.environ["LLMSERVE_CACHE"]
    bodies = [
        http.get(p).text for p in ("/v1/models", "/v2", f"/v2/models/{model_name}", f"/v2/models/{model_name}/config")
    ]
    models = http.get("/v1/models").json()["data"][0]
    assert models["root"] == model_name and models["parent"] is None
    bodies.append(str(grpc.get_model_metadata(model_name, headers=auth)))
    bodies.append(str(grpc.get_model_config(model_name, headers=auth)))
    # error answers too
    bodies.append(http.post("/v1/completions", json={"model": model_name, "prompt": "hi " * 3000}).text)
    bodies.append(http.post(f"/v2/models/{model_name}/generate", json={"text_input": "hi " * 3000}).text)
    bodies.append(http.post("/v1/chat/completions", json={"model": "nope", "messages": MSG}).text)
    for body in bodies:
        assert cache not in body and "/tmp/" not in body and not re.search(r"\.llmpkg|/site-packages/", body), body


# ---- 7. top_logprobs are the k most likely tokens, at any temperature --------------------------------


def _check_top(entries, k: int, sampled: float) -> bool:
    """k entries, sorted, every listed logprob >= the sampled token's when that is not listed; True
    when the sampled token was outside the top k (the case vLLM got wrong)."""
    lps = [e[1] for e in entries]
    assert len(entries) == k, entries
    assert lps == sorted(lps, reverse=True), entries
    return sampled < lps[-1]


def test_chat_top_logprobs_are_the_k_most_likely(client, model_name):
    k = 3
    kwargs = {
        "model": model_name,
        "messages": MSG,
        "max_tokens": 24,
        "temperature": 1.0,
        "seed": 1234,
        "logprobs": True,
        "extra_body": {"ignore_eos": True},
    }
    small = client.chat.completions.create(top_logprobs=k, **kwargs).choices[0].logprobs.content
    wide = client.chat.completions.create(top_logprobs=20, **kwargs).choices[0].logprobs.content
    assert len(small) == 24
    outside = 0
    for pos, (s, w) in enumerate(zip(small, wide, strict=True)):
        assert s.logprob is not None and s.bytes is not None
        outside += _check_top([(t.token, t.logprob) for t in s.top_logprobs], k, s.logprob)
        if s.token != w.token:
            break  # the seeded samples diverged: the rest is not comparable
        # the k most likely of the wider list, in the same order (every listed >= any unlisted)
        assert [t.logprob for t in s.top_logprobs] == [t.logprob for t in w.top_logprobs[:k]], pos
    assert outside, "at temperature 1.0 some sampled token should fall outside the top 3 on a random model"


def test_chat_top_logprobs_streamed(client, model_name):
    k = 2
    stream = client.chat.completions.create(
        model=model_name,
        messages=MSG,
        max_tokens=12,
        temperature=1.0,
        seed=7,
        logprobs=True,
        top_logprobs=k,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    seen = 0
    for chunk in stream:
        if chunk.choices and chunk.choices[0].logprobs and chunk.choices[0].logprobs.content:
            for t in chunk.choices[0].logprobs.content:
                _check_top([(x.token, x.logprob) for x in t.top_logprobs], k, t.logprob)
                seen += 1
    assert seen == 12


def test_completion_top_logprobs_are_the_k_most_likely(client, model_name):
    k = 3
    r = client.completions.create(
        model=model_name,
        prompt="the cat",
        max_tokens=24,
        temperature=1.0,
        seed=99,
        logprobs=k,
        extra_body={"ignore_eos": True},
    )
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 24
    outside = 0
    for sampled, top in zip(lp.token_logprobs, lp.top_logprobs, strict=True):
        assert isinstance(sampled, float)
        # exactly k even when two of them decode alike (the less likely is keyed "token_id:<id>")
        outside += _check_top(list(top.items()), k, sampled)
    assert outside, "at temperature 1.0 some sampled token should fall outside the top 3 on a random model"


# ---- 8. other per-request costs are bounded ---------------------------------------------------------


@pytest.mark.parametrize(
    "field,value",
    [
        ("stop", [f"s{i}" for i in range(5)]),  # OpenAI's limit, which vLLM's request types enforce
        ("stop", ["x" * 1001]),
        ("logit_bias", {str(i): 1 for i in range(1025)}),
        ("stop_token_ids", list(range(1025))),
    ],
)
def test_openai_field_limits(http, model_name, field, value):
    r = http.post("/v1/chat/completions", json={"model": model_name, "messages": MSG, "max_tokens": 1, field: value})
    assert r.status_code == 400, r.text
    err = _openai_err(r)
    assert err["param"] == field and "at most" in err["message"]


def test_n_over_the_servers_limit(http, model_name):
    # --max-n (default 8), the engine handle's max_n
    r = http.post("/v1/chat/completions", json={"model": model_name, "messages": MSG, "max_tokens": 1, "n": 9})
    assert r.status_code == 400 and _openai_err(r)["param"] == "n" and "--max-n" in _openai_err(r)["message"]


def test_openai_message_and_prompt_counts(http, model_name):
    r = http.post("/v1/chat/completions", json={"model": model_name, "messages": MSG * 2049, "max_tokens": 1})
    assert r.status_code == 400 and _openai_err(r)["param"] == "messages" and "at most" in _openai_err(r)["message"]
    r = http.post("/v1/completions", json={"model": model_name, "prompt": ["a"] * 257, "max_tokens": 1})
    assert r.status_code == 400 and _openai_err(r)["param"] == "prompt" and "at most" in _openai_err(r)["message"]


@pytest.mark.parametrize(
    "key,value",
    [
        ("stop", [f"s{i}" for i in range(17)]),
        ("bad_words", ["w"] * 1025),
        ("logit_bias", {str(i): 1 for i in range(1025)}),
    ],
)
def test_kserve_sampling_limits(http, grpc, model_name, auth, key, value):
    r = http.post(f"/v2/models/{model_name}/generate", json={"text_input": "hi", "parameters": {key: value}})
    assert r.status_code == 400 and "at most" in _kserve_err(r) and key in _kserve_err(r)
    with pytest.raises(InferenceServerException) as info:
        grpc.infer(model_name, _grpc_inputs("hi", json.dumps({key: value})), headers=auth)
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT" and "at most" in info.value.message()


def test_kserve_element_counts_and_ids(http, model_name):
    # a BYTES tensor of shape [1] whose binary data holds a million empty elements
    raw = b"\x00\x00\x00\x00" * 1_000_000
    header = json.dumps(
        {
            "inputs": [
                {"name": "text_input", "datatype": "BYTES", "shape": [1], "parameters": {"binary_data_size": len(raw)}}
            ]
        }
    ).encode()
    r = http.post(
        f"/v2/models/{model_name}/infer",
        content=header + raw,
        headers={"Inference-Header-Content-Length": str(len(header))},
    )
    assert r.status_code == 400 and "element" in _kserve_err(r)
    r = http.post(f"/v2/models/{model_name}/infer", json={**_infer_body(), "id": "i" * 257})
    assert r.status_code == 400 and "'id'" in _kserve_err(r)
    body = _infer_body()
    body["inputs"][0]["data"] = [["hi"] * 100_000]
    r = http.post(f"/v2/models/{model_name}/infer", json=body)
    assert r.status_code == 400 and "element" in _kserve_err(r)


def test_grpc_message_over_the_limit(grpc, model_name, auth):
    with pytest.raises(InferenceServerException) as info:
        grpc.infer(model_name, _grpc_inputs("x" * (BODY_LIMIT + 10)), headers=auth)
    assert info.value.status() == "StatusCode.RESOURCE_EXHAUSTED"


def test_server_survived(client, model_name):
    r = client.chat.completions.create(model=model_name, messages=MSG, max_tokens=2)
    assert r.choices[0].message.content is not None
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=model_name, messages=MSG, max_tokens=2, stop=["s"] * 17)
