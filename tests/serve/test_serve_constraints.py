"""Constraints over the OpenAI API (issue 4 item 6), on the session server.

`llmserve serve` loads llmserve's constraint processor by default (`--no-constraints` leaves it
out). A request carries one constraint in `vllm_xargs` (the only keys of `vllm_xargs` honoured);
the tiny model has random weights, so every valid output below is the processor's doing.
No per-request `seed` here: with chunked prefill it crashes vLLM's CPU sampler.
"""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import openai
import pytest

from llmserve.serve.constraint_keys import ConstraintSupport
from llmserve.serve.openai.errors import RequestRejected
from llmserve.serve.openai.request_check import check_request

DATE = r"\d{4}-\d{2}-\d{2}"
MSG = [{"role": "user", "content": "When?"}]
SCHEMA = {
    "type": "object",
    "properties": {
        "ok": {"type": "boolean"},
        "color": {"enum": ["red", "green", "blue"]},
        "count": {"type": "integer"},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3},
        "inner": {"type": "object", "properties": {"n": {"type": "null"}}, "required": ["n"]},
    },
    "required": ["ok", "color", "count", "tags", "inner"],
}
N = 8


# ---- the field check (no engine) -----------------------------------------------------------------


@pytest.fixture
def loaded() -> ConstraintSupport:
    """What an engine running the constraint processor reports (its EngineHandle.constraints)."""
    return ConstraintSupport(True)


def _body(kind: str, xargs) -> dict:
    base = {"model": "m", "max_tokens": 4, "vllm_xargs": xargs}
    return {**base, "messages": MSG} if kind == "chat" else {**base, "prompt": "x"}


@pytest.mark.parametrize("kind", ["chat", "completion"])
def test_constraint_keys_are_forwarded_objects_as_json(kind, loaded):
    fwd, _ = check_request(kind, _body(kind, {"constraint": {"regex": DATE}}), loaded)
    assert json.loads(fwd["vllm_xargs"]["constraint"]) == {"regex": DATE}
    fwd, _ = check_request(kind, _body(kind, {"constraint_json_schema": SCHEMA}), loaded)
    assert json.loads(fwd["vllm_xargs"]["constraint_json_schema"]) == SCHEMA
    fwd, _ = check_request(kind, _body(kind, {"constraint_choice": ["a", "b"]}), loaded)
    assert fwd["vllm_xargs"] == {"constraint_choice": ["a", "b"]}


@pytest.mark.parametrize(
    "xargs,needle",
    [
        ({"session_id": "s1"}, "'session_id'"),
        ({"constraint_regex": "a", "other": 1}, "'other'"),
        ({"constraint_regex": "a", "constraint_choice": ["a"]}, "one constraint"),
        ({"constraint_choice": "yes"}, "constraint_choice"),
        ("constraint_regex=a", "object"),
    ],
)
def test_bad_vllm_xargs_shapes(xargs, needle, loaded):
    with pytest.raises(RequestRejected) as info:
        check_request("completion", _body("completion", xargs), loaded)
    assert info.value.status == 400 and info.value.param == "vllm_xargs" and needle in info.value.message


def test_constraint_without_the_processor_is_400():
    without = ConstraintSupport(False, "the server was started with --no-constraints")
    with pytest.raises(RequestRejected) as info:
        check_request("chat", _body("chat", {"constraint_regex": DATE}), without)
    assert "not loaded" in info.value.message and "--no-constraints" in info.value.message
    check_request("chat", _body("chat", {}), without)  # no constraint: nothing to refuse


def test_the_server_adds_the_processor_to_the_package_list():
    from llmserve.constraints.vllm_processor import PROCESSOR_PATH
    from llmserve.serve.engine import merged_engine_args
    from llmserve.serve.options import CONSTRAINT_PROCESSOR, ServeOptions

    assert CONSTRAINT_PROCESSOR == PROCESSOR_PATH
    on = ServeOptions(package=".").engine_overrides()
    assert on["logits_processors"] == [PROCESSOR_PATH]
    assert "logits_processors" not in ServeOptions(package=".", constraints=False).engine_overrides()
    args = merged_engine_args({"logits_processors": ["pkg.mod:Proc"]}, on)
    assert args["logits_processors"] == ["pkg.mod:Proc", PROCESSOR_PATH]
    assert "logits_processors" not in merged_engine_args({}, {})


# ---- through the real server -------------------------------------------------------------------


def test_startup_says_the_processor_is_loaded(server):
    assert "constraint processor loaded" in server.log_text()


def _many(fn, n=N):
    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(lambda _: fn(), range(n)))


def test_regex_on_every_request(client, model_name):
    def completion():
        r = client.completions.create(
            model=model_name,
            prompt="Date: ",
            max_tokens=40,
            temperature=1.0,
            extra_body={"vllm_xargs": {"constraint_regex": DATE}},
        )
        return r.choices[0]

    def chat():
        r = client.chat.completions.create(
            model=model_name,
            messages=MSG,
            max_tokens=40,
            temperature=1.0,
            extra_body={"vllm_xargs": {"constraint": {"regex": DATE}}},
        )
        return r.choices[0]

    outs = _many(completion) + _many(chat)
    for choice in outs:
        text = choice.text if hasattr(choice, "text") else choice.message.content
        assert re.fullmatch(DATE, text), text
        assert choice.finish_reason == "stop"


def test_choice_and_n(client, model_name):
    choices = ["yes", "no", "maybe later"]
    r = client.completions.create(
        model=model_name,
        prompt="Answer: ",
        max_tokens=20,
        n=N,
        temperature=1.0,
        extra_body={"vllm_xargs": {"constraint_choice": choices}},
    )
    assert len(r.choices) == N
    for c in r.choices:
        assert c.text in choices, c.text


@pytest.mark.parametrize("form", ["nested", "flat", "flat-string"])
def test_json_schema_validates(client, model_name, form):
    xargs = {
        "nested": {"constraint": {"json_schema": SCHEMA}},
        "flat": {"constraint_json_schema": SCHEMA},
        "flat-string": {"constraint_json_schema": json.dumps(SCHEMA)},
    }[form]

    def one():
        r = client.chat.completions.create(
            model=model_name, messages=MSG, max_tokens=120, temperature=1.0, extra_body={"vllm_xargs": xargs}
        )
        return r.choices[0]

    for choice in _many(one, 4):
        assert choice.finish_reason == "stop", choice
        jsonschema.validate(json.loads(choice.message.content), SCHEMA)


def test_streaming_with_a_constraint(client, model_name):
    stream = client.chat.completions.create(
        model=model_name,
        messages=MSG,
        max_tokens=40,
        stream=True,
        extra_body={"vllm_xargs": {"constraint_regex": DATE}},
    )
    text, finish = "", None
    for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
    assert re.fullmatch(DATE, text) and finish == "stop", (text, finish)
    stream = client.completions.create(
        model=model_name,
        prompt="Pick: ",
        max_tokens=20,
        stream=True,
        extra_body={"vllm_xargs": {"constraint_choice": ["alpha", "beta"]}},
    )
    assert "".join(c.choices[0].text for c in stream if c.choices) in ("alpha", "beta")


@pytest.mark.parametrize(
    "xargs,needle",
    [
        ({"constraint_regex": "([0-9]"}, "regex"),
        (
            {
                "constraint": {
                    "json_schema": {"type": "array", "contains": {"type": "integer"}, "unevaluatedItems": False}
                }
            },
            "['unevaluatedItems']",
        ),
        ({"constraint": {"grammar": "x"}}, "regex, choice, json_schema"),
        ({"constraint": "{not json"}, "JSON"),
    ],
)
def test_invalid_constraint_is_400(client, model_name, xargs, needle):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=model_name, messages=MSG, max_tokens=4, extra_body={"vllm_xargs": xargs})
    assert needle in info.value.message, info.value.message
    # checked by the frontend, so the error names the field and the key
    assert info.value.param == "vllm_xargs" and f"key '{next(iter(xargs))}'" in info.value.message, info.value.message


def test_unknown_vllm_xargs_key_is_400(http, model_name):
    r = http.post(
        "/v1/completions",
        json={
            "model": model_name,
            "prompt": "x",
            "max_tokens": 2,
            "vllm_xargs": {"constraint_regex": "a", "session_id": "s"},
        },
    )
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "vllm_xargs" and "'session_id'" in err["message"]
