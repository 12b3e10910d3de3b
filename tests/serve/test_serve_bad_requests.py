"""Bad inputs: each one a 400 (or 401/413) in OpenAI's error shape, naming what is wrong."""

from __future__ import annotations

import openai
import pytest

MSG = [{"role": "user", "content": "hi"}]


def _err(r):
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


def test_unknown_model_through_the_client(client):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="no-such-model", messages=MSG, max_tokens=2)
    assert info.value.body["param"] == "model" and "no-such-model" in info.value.message
    assert info.value.body["code"] == "model_not_found"


def test_malformed_json(http):
    r = http.post(
        "/v1/chat/completions",
        content=b'{"model": "tiny-chat", "messages": [',
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 400 and _err(r)["code"] == "invalid_json"
    assert "not valid JSON" in _err(r)["message"]


def test_invalid_json_schema(client, model_name):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model=model_name,
            messages=MSG,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "bad", "schema": {"type": "object", "properties": {"a": {"type": 12}}}},
            },
        )
    assert info.value.body["param"] == "response_format" and "not a valid JSON Schema" in info.value.message


@pytest.mark.parametrize(
    "field,value,needle",
    [
        ("temperature", -1.0, "temperature"),
        ("response_format", {"type": "xml"}, "'xml'"),
        ("tool_choice", "required", "'none'"),
        ("n", 0, "n"),
        ("store", True, "False"),
        ("service_tier", "priority", "priority"),
    ],
)
def test_unsupported_field_value(http, model_name, field, value, needle):
    r = http.post("/v1/chat/completions", json={"model": model_name, "messages": MSG, "max_tokens": 2, field: value})
    assert r.status_code == 400, r.text
    err = _err(r)
    assert err["param"] == field and needle in err["message"] and err["type"] == "invalid_request_error"


def test_oversized_prompt_names_the_limit(client, model_name):
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=model_name, prompt="hello " * 2000, max_tokens=2)
    assert "512" in info.value.message and info.value.body["code"] == "context_length_exceeded"


def test_prompt_over_the_character_limit(http, model_name):
    r = http.post("/v1/completions", json={"model": model_name, "prompt": "x" * 200_001, "max_tokens": 1})
    assert r.status_code == 400 and "--max-prompt-chars" in _err(r)["message"] and _err(r)["param"] == "prompt"


def test_unknown_field(http, model_name):
    r = http.post("/v1/chat/completions", json={"model": model_name, "messages": MSG, "frobnicate": True})
    assert r.status_code == 400 and _err(r)["param"] == "frobnicate" and _err(r)["code"] == "unknown_parameter"


def test_non_text_content_part(http, model_name):
    msg = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]
    r = http.post("/v1/chat/completions", json={"model": model_name, "messages": msg})
    assert r.status_code == 400 and _err(r)["param"] == "messages" and "image_url" in _err(r)["message"]


def test_body_too_large_is_413(http, model_name):
    r = http.post(
        "/v1/completions",
        content=b'{"prompt": "' + b"x" * (9 * 1024 * 1024) + b'"}',
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 413 and "--max-body-bytes" in _err(r)["message"]


def test_api_key_required_everywhere_but_health(server):
    import httpx

    for method, path in (("GET", "/v1/models"), ("POST", "/v1/chat/completions"), ("GET", "/metrics")):
        r = httpx.request(method, server.base_url + path, json={} if method == "POST" else None)
        assert r.status_code == 401, path
        r = httpx.request(
            method,
            server.base_url + path,
            headers={"Authorization": "Bearer wrong"},
            json={} if method == "POST" else None,
        )
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    assert httpx.get(server.base_url + "/health").status_code == 200


def test_api_key_never_logged(server):
    assert server.api_key not in server.log_text()
