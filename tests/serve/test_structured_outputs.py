"""One engine for every structured request (issue #17 items 1 and 3), on the session server.

`response_format` (json_object, json_schema), vLLM's `structured_outputs` (OpenAI extension field and
KServe sampling parameter) and the constraint keys are all served by llmserve's constraint processor by
default; the tiny model has random weights and never closes a string, array or object by itself, so
every complete answer at small max_tokens is the processor's steering. `--structured-outputs-backend
guidance` keeps vLLM's own backend for comparison (its own short-lived server, at the end).
No per-request `seed`: with chunked prefill it crashes vLLM's CPU sampler.
"""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor

import httpx
import jsonschema
import numpy as np
import openai
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from support.schemas import PERSON
from tritonclient.utils import InferenceServerException

from llmserve.serve.constraint_keys import ConstraintSupport, no_additional_properties, structured_outputs_constraint
from llmserve.serve.kserve.errors import KServeError
from llmserve.serve.kserve.sampling import build_settings
from llmserve.serve.openai.errors import RequestRejected
from llmserve.serve.openai.request_check import check_request

MSG = [{"role": "user", "content": "Describe someone."}]
OBJECT = {"type": "object"}  # what json_object means (OpenAI's JSON mode answers an object)
SCHEMA = PERSON  # the shortest answer: 12 tokens of the tiny vocabulary
BUDGETS = (20, 50, 200)
REPEATS = 3
FORMATS = {
    "json_object": ({"type": "json_object"}, {"json_object": True}, OBJECT),
    "json_schema": (
        {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA, "strict": True}},
        {"json": SCHEMA},
        SCHEMA,
    ),
}
CASES = [(form, budget) for form in FORMATS for budget in BUDGETS]
LLMSERVE = ConstraintSupport(True)
GUIDANCE = ConstraintSupport(True, structured="guidance")
API_KEY = "structured-key-0123456789"


# This module's own server: the session one's 240 s start timeout is too short on a loaded machine.
@pytest.fixture(scope="module")
def server(tmp_path_factory, serve_package, server_control):
    log = tmp_path_factory.mktemp("structured-log") / "server.log"
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


def _many(fn, n=REPEATS):
    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(lambda _: fn(), range(n)))


def _valid(text: str, schema: dict) -> None:
    value = json.loads(text)
    jsonschema.validate(value, schema)
    if schema is OBJECT:
        assert isinstance(value, dict), text


# ---- the field checks (no engine) ----------------------------------------------------------------


DEEP_TEXT = '{"not":' * 5000 + "{}" + "}" * 5000


def _chat(**fields) -> dict:
    return {"model": "m", "messages": MSG, **fields}


def test_response_format_becomes_llmserves_constraint():
    fwd, _ = check_request("chat", _chat(response_format=FORMATS["json_object"][0]), LLMSERVE)
    assert "response_format" not in fwd and json.loads(fwd["vllm_xargs"]["constraint"]) == {"json_schema": OBJECT}
    body = _chat(response_format=FORMATS["json_schema"][0], vllm_xargs={"constraint_budget": False})
    fwd, _ = check_request("chat", body, LLMSERVE)
    assert json.loads(fwd["vllm_xargs"]["constraint"]) == {"json_schema": SCHEMA}
    assert fwd["vllm_xargs"]["constraint_budget"] is False
    fwd, _ = check_request("chat", _chat(response_format={"type": "text"}), LLMSERVE)
    assert "vllm_xargs" not in fwd  # text: unconstrained


def test_structured_outputs_become_llmserves_constraint():
    for so, want in [
        ({"json": SCHEMA}, {"json_schema": SCHEMA}),
        ({"json": json.dumps(SCHEMA)}, {"json_schema": SCHEMA}),
        ({"json_object": True, "disable_any_whitespace": True}, {"json_schema": OBJECT}),
        ({"regex": "[0-9]+"}, {"regex": "[0-9]+"}),
        ({"choice": ["a", "b"]}, {"choice": ["a", "b"]}),
    ]:
        fwd, _ = check_request("completion", {"model": "m", "prompt": "x", "structured_outputs": so}, LLMSERVE)
        assert "structured_outputs" not in fwd and json.loads(fwd["vllm_xargs"]["constraint"]) == want
        settings = build_settings({"structured_outputs": so}, {}, transport="http", constraints=LLMSERVE)
        assert "structured_outputs" not in settings.sampling
        assert json.loads(settings.sampling["extra_args"]["constraint"]) == want


def test_disable_additional_properties_as_guidance_applies_it():
    schema = {"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {}}}}, "$defs": {}}
    got = structured_outputs_constraint({"json": schema, "disable_additional_properties": True})["json_schema"]
    assert got["additionalProperties"] is False and got["properties"]["a"]["additionalProperties"] is False
    assert "additionalProperties" not in schema  # the request's schema is not changed
    assert no_additional_properties({"type": "object"}) == {"type": "object"}  # no properties: as it was
    # a string holding JSON text (pydantic's Json[T]): its content schema's objects too
    held = {"type": "string", "contentMediaType": "application/json", "contentSchema": {"properties": {"b": {}}}}
    assert no_additional_properties(held)["contentSchema"]["additionalProperties"] is False


@pytest.mark.parametrize(
    "fields,param,needle",
    [
        ({"structured_outputs": {"grammar": 'start: "a"'}}, "structured_outputs", "key 'grammar'"),
        ({"structured_outputs": {"structural_tag": "{}"}}, "structured_outputs", "key 'structural_tag'"),
        ({"structured_outputs": {"json": {}, "whitespace_pattern": " "}}, "structured_outputs", "whitespace_pattern"),
        ({"structured_outputs": {"json": {}, "regex": "a"}}, "structured_outputs", "exactly one"),
        # a misspelt kind: the ones it takes are named
        ({"structured_outputs": {"jsn": {}}}, "structured_outputs", "unknown key(s) jsn; it takes one of json,"),
        ({"structured_outputs": "json"}, "structured_outputs", 'e.g. {"json": {...}}'),
        (
            {"response_format": {"type": "json_object"}, "vllm_xargs": {"constraint_regex": "a"}},
            "response_format",
            "not both",
        ),
        (
            {"response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a"}},
            "response_format",
            "not both",
        ),
        ({"vllm_xargs": {"constraint_regex": "a", "constraint_budget": "maybe"}}, "vllm_xargs", "true or false"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": {"not": {}}}}},
            "response_format",
            "'not' of a schema every value satisfies",
        ),
        (  # a common slip: strict one level too high, which would otherwise go unnoticed
            {"response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": {}}, "strict": True}},
            "response_format",
            "`strict` goes inside `json_schema`",
        ),
        ({"structured_outputs": {"json": {"type": 12}}}, "structured_outputs", "not a valid JSON Schema at type"),
        # jsonschema's validator_for raised on it (a 500)
        ({"structured_outputs": {"json": {"$schema": 5}}}, "structured_outputs", "at $schema: must be a string"),
        # a schema as deeply nested JSON text: the body's depth limit never saw inside the string (a 500)
        ({"structured_outputs": {"json": DEEP_TEXT}}, "structured_outputs", "nested more than 64 levels"),
        ({"structured_outputs": '{"json": ' + DEEP_TEXT + "}"}, "structured_outputs", "nested more than 64 levels"),
        ({"vllm_xargs": {"constraint_json_schema": DEEP_TEXT}}, "vllm_xargs", "nested too deeply"),
        ({"vllm_xargs": {"constraint": '{"json_schema": ' + DEEP_TEXT + "}"}}, "vllm_xargs", "nested too deeply"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": {"$schema": [1]}}}},
            "response_format",
            "at $schema: must be a string",
        ),
    ],
)
def test_refused_with_the_field_named(fields, param, needle):
    with pytest.raises(RequestRejected) as info:
        check_request("chat", _chat(**fields), LLMSERVE)
    assert info.value.status == 400 and info.value.param == param and needle in info.value.message, info.value.message


# ECMA-262 patterns Python's re cannot read (the metaschema's "regex" format would check them with it)
NAMED = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "pattern": "^[\\p{L} .'-]+$", "maxLength": 12},
        "year": {"type": "string", "pattern": "^(?<year>\\d{4})$"},
    },
    "required": ["name", "year"],
    "additionalProperties": False,
}


def _named_valid(text: str) -> None:
    import regex  # the patterns' dialect: \p{..} and (?<name>..), which re lacks

    value = json.loads(text)
    assert set(value) == {"name", "year"}, text
    assert regex.fullmatch(r"[\p{L} .'-]+", value["name"]) and len(value["name"]) <= 12, text
    assert regex.fullmatch(r"\d{4}", value["year"]), text


def test_patterns_python_cannot_read_are_not_an_invalid_schema():
    rf = {"type": "json_schema", "json_schema": {"name": "named", "schema": NAMED}}
    fwd, _ = check_request("chat", _chat(response_format=rf), LLMSERVE)
    assert json.loads(fwd["vllm_xargs"]["constraint"]) == {"json_schema": NAMED}
    fwd, _ = check_request("chat", _chat(structured_outputs={"json": NAMED}), LLMSERVE)
    assert json.loads(fwd["vllm_xargs"]["constraint"]) == {"json_schema": NAMED}
    for so in ({"json": NAMED}, {"json": json.dumps(NAMED)}):
        settings = build_settings({"structured_outputs": so}, {}, transport="grpc", constraints=LLMSERVE)
        assert json.loads(settings.sampling["extra_args"]["constraint"]) == {"json_schema": NAMED}
    fwd, _ = check_request("chat", _chat(response_format=rf), GUIDANCE)  # vLLM's backend reads them too
    assert fwd["response_format"] == rf


STOP_CUTS = "may occur inside this constraint's answers"


@pytest.mark.parametrize(
    "fields,cut",
    [
        ({"response_format": FORMATS["json_schema"][0], "stop": ","}, True),
        ({"response_format": FORMATS["json_object"][0], "stop": ["\n\nUser:", "}"]}, True),
        ({"structured_outputs": {"choice": ["a", "b,c"]}, "stop": [","]}, True),
        ({"vllm_xargs": {"constraint_regex": "[a-z]+"}, "stop": "q"}, True),
        # cannot occur: a raw control character is never in compact JSON; in none of the choices
        ({"response_format": FORMATS["json_object"][0], "stop": ["\n\nUser:", "\n"]}, False),
        ({"structured_outputs": {"choice": ["a", "b,c"]}, "stop": ["zz"]}, False),
        ({"vllm_xargs": {"constraint_regex": "[0-9]{3}"}, "stop": ["\n", "x9"]}, False),  # 'x' never matches
        # read off the automaton: no answer holds the text, though each character occurs
        ({"structured_outputs": {"json": {"enum": ["red", "blue"]}}, "stop": ["END", "dr", "Observation:"]}, False),
        ({"structured_outputs": {"json": {"type": "integer"}}, "stop": ["END", "--", "1.5"]}, False),
        ({"vllm_xargs": {"constraint_regex": "[a-z]+@[a-z]+"}, "stop": ["@@", "a@b@"]}, False),
        ({"structured_outputs": {"json": {"enum": ["red", "blue"]}}, "stop": ["END", "ed"]}, True),
        (
            {
                "structured_outputs": {"json": {"type": "object", "properties": {"a": {"type": "string"}}}},
                "stop": "END",
            },
            True,
        ),
        # steering off: the client accepts answers that end early
        (
            {"response_format": FORMATS["json_schema"][0], "stop": ",", "vllm_xargs": {"constraint_budget": False}},
            False,
        ),
    ],
)
def test_a_stop_string_that_could_cut_a_constrained_answer_is_refused(fields, cut):
    """A stop string ends the answer where it appears: inside a steered answer that is broken JSON
    with finish_reason "stop". One that cannot occur changes nothing."""
    if not cut:
        check_request("chat", _chat(**fields), LLMSERVE)
        return
    with pytest.raises(RequestRejected) as info:
        check_request("chat", _chat(**fields), LLMSERVE)
    assert info.value.status == 400 and STOP_CUTS in info.value.message and "constraint_budget" in info.value.message


@pytest.fixture
def byte_vocab():
    """A vocabulary registered for the frontend's checks (as `serve` registers the model's): every single byte, an
    end-of-sequence id, a special token (no bytes), "zz", and the first two bytes of a three-byte character."""
    from llmserve.constraints import vllm_processor
    from llmserve.constraints.vocab import Vocab

    saved = list(vllm_processor._VALIDATION_VOCAB)
    tokens = [bytes([b]) for b in range(256)] + [None, None, b"zz", "☃".encode()[:2]]
    vllm_processor.register_vocab(Vocab(tokens=tokens, eos_ids=(256,)))
    try:
        yield {"eos": 256, "special": 257, "zz": 258, "part": 259, **{chr(b): b for b in range(128)}}
    finally:
        vllm_processor._VALIDATION_VOCAB[:] = saved


def test_a_stop_token_that_could_cut_a_constrained_answer_is_refused(byte_vocab):
    """stop_token_ids end the answer at the token, as a stop string does at its text."""
    ids = byte_vocab
    cut = [
        {"response_format": FORMATS["json_schema"][0], "stop_token_ids": [ids["eos"], ids[","]]},
        {"structured_outputs": {"choice": ["a", "b,c"]}, "stop_token_ids": [ids["b"]]},
        {"structured_outputs": {"choice": ["a☃"]}, "stop_token_ids": [ids["part"]]},
        {"vllm_xargs": {"constraint_regex": "[a-z☃]+"}, "stop_token_ids": [ids["part"]]},
        {"structured_outputs": {"json": {"enum": ["red", "blue"]}}, "stop_token_ids": [ids["E"], ids["u"]]},
    ]
    whole = [
        # an end-of-sequence id (only once the answer is complete), a special token, a raw control byte in JSON
        {"response_format": FORMATS["json_object"][0], "stop_token_ids": [ids["eos"], ids["special"], ids["\n"]]},
        {"structured_outputs": {"choice": ["a", "b,c"]}, "stop_token_ids": [ids["zz"], ids["part"]]},
        {"vllm_xargs": {"constraint_regex": "[0-9]{3}"}, "stop_token_ids": [ids["x"], ids["part"], 10**6]},
        {"structured_outputs": {"json": {"enum": ["red", "blue"]}}, "stop_token_ids": [ids["E"], ids["zz"]]},
        {
            "response_format": FORMATS["json_schema"][0],
            "stop_token_ids": [ids[","]],
            "vllm_xargs": {"constraint_budget": False},
        },
    ]
    for fields in cut:
        with pytest.raises(RequestRejected) as info:
            check_request("chat", _chat(**fields), LLMSERVE)
        assert info.value.status == 400 and "stop token id" in info.value.message, info.value.message
        assert STOP_CUTS in info.value.message and "constraint_budget" in info.value.message
    for fields in whole:
        check_request("chat", _chat(**fields), LLMSERVE)
    with pytest.raises(KServeError, match="stop token id 44"):
        sampling = {"constraint_regex": "[a-z,]+", "stop_token_ids": [ids[","]], "max_tokens": 50}
        build_settings(sampling, {}, transport="grpc", constraints=LLMSERVE)
    sampling = {"structured_outputs": {"json": SCHEMA}, "stop_token_ids": [ids["\n"]], "max_tokens": 50}
    assert build_settings(sampling, {}, transport="grpc", constraints=LLMSERVE).sampling["stop_token_ids"] == [10]


def test_the_budget_a_completion_is_checked_against():
    """/v1/completions without max_tokens gets vLLM's default of 16; max_tokens null is what the
    context leaves (vLLM's reading), which the frontend cannot know: the engine checks that."""
    from llmserve.serve.openai.fields import CheckContext, _budget_limit, _max_tokens

    def ctx(kind, **fields):
        return CheckContext({"model": "m", "prompt": "x", **fields}, LLMSERVE, kind)

    assert _max_tokens(ctx("completion")) == 16 and "the default of /v1/completions" in _budget_limit(ctx("completion"))
    assert (
        _max_tokens(ctx("completion", max_tokens=None)) is None
        and _budget_limit(ctx("completion", max_tokens=None)) is None
    )
    assert (
        _max_tokens(ctx("completion", max_tokens=40)) == 40 and _budget_limit(ctx("completion", max_tokens=40)) is None
    )
    assert _max_tokens(ctx("chat")) is None and _max_tokens(ctx("chat", max_completion_tokens=9)) == 9


def test_kserve_refuses_a_stop_string_that_could_cut_the_answer():
    for sampling in (
        {"structured_outputs": {"json": SCHEMA}, "stop": "}"},
        {"constraint_regex": "[a-z]+", "stop": ["q"]},
    ):
        with pytest.raises(KServeError, match=STOP_CUTS):
            build_settings(sampling, {}, transport="grpc", constraints=LLMSERVE)
    settings = build_settings(
        {"structured_outputs": {"json": SCHEMA}, "stop": ["\n\n"]}, {}, transport="grpc", constraints=LLMSERVE
    )
    assert settings.sampling["stop"] == ["\n\n"]


def test_kserve_refuses_by_name():
    for sampling, needle in [
        ({"structured_outputs": {"grammar": "x"}}, "key 'grammar'"),
        ({"structured_outputs": {"json": {}}, "constraint_regex": "a"}, "not both"),
        ({"constraint_budget": 3, "constraint_regex": "a"}, "constraint_budget"),
        ({"structured_outputs": {"json": {"required": "a"}}}, "not a valid JSON Schema at required"),
    ]:
        with pytest.raises(KServeError) as info:
            build_settings(sampling, {}, transport="grpc", constraints=LLMSERVE)
        assert needle in info.value.message, info.value.message


def test_with_a_vllm_backend_the_fields_go_to_vllm():
    fwd, _ = check_request("chat", _chat(response_format=FORMATS["json_object"][0]), GUIDANCE)
    assert fwd["response_format"] == {"type": "json_object"} and "vllm_xargs" not in fwd
    fwd, _ = check_request("chat", _chat(structured_outputs={"grammar": 'start: "a"'}), GUIDANCE)
    assert fwd["structured_outputs"] == {"grammar": 'start: "a"'}
    settings = build_settings({"structured_outputs": {"grammar": "x"}}, {}, transport="grpc", constraints=GUIDANCE)
    assert settings.sampling["structured_outputs"].grammar == "x"
    # the constraint keys stay llmserve's; both at once is still one constraint too many
    fwd, _ = check_request("chat", _chat(vllm_xargs={"constraint_regex": "a"}), GUIDANCE)
    assert fwd["vllm_xargs"] == {"constraint_regex": "a"}
    with pytest.raises(RequestRejected, match="not both"):
        check_request(
            "chat", _chat(response_format={"type": "json_object"}, vllm_xargs={"constraint_regex": "a"}), GUIDANCE
        )


def test_without_the_processor_structured_requests_are_400():
    without = ConstraintSupport(False, "the server was started with --no-constraints")
    with pytest.raises(RequestRejected) as info:
        check_request("chat", _chat(response_format={"type": "json_object"}), without)
    assert "--no-constraints" in info.value.message and "--structured-outputs-backend" in info.value.message


# ---- through the real server: always valid, always finished, within max_tokens ------------------


def test_startup_says_who_serves_structured_outputs(server):
    assert "structured outputs (response_format, structured_outputs) served by llmserve's" in server.log_text()


@pytest.mark.parametrize("form,budget", CASES)
def test_openai_chat(client, model_name, form, budget):
    response_format, _, schema = FORMATS[form]

    def one():
        r = client.chat.completions.create(
            model=model_name, messages=MSG, max_tokens=budget, temperature=1.0, response_format=response_format
        )
        return r.choices[0], r.usage.completion_tokens

    for choice, tokens in _many(one):
        assert choice.finish_reason == "stop" and tokens <= budget, (choice, tokens)
        _valid(choice.message.content, schema)


@pytest.mark.parametrize("form,budget", CASES)
def test_openai_chat_streamed(client, model_name, form, budget):
    response_format, _, schema = FORMATS[form]

    def one():
        stream = client.chat.completions.create(
            model=model_name,
            messages=MSG,
            max_tokens=budget,
            temperature=1.0,
            stream=True,
            response_format=response_format,
        )
        text, finish = "", None
        for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
                finish = chunk.choices[0].finish_reason or finish
        return text, finish

    for text, finish in _many(one):
        assert finish == "stop", (text, finish)
        _valid(text, schema)


@pytest.mark.parametrize("form", FORMATS)
def test_openai_completions_structured_outputs(client, model_name, form):
    _, so, schema = FORMATS[form]
    r = client.completions.create(
        model=model_name,
        prompt="JSON: ",
        max_tokens=20,
        n=REPEATS,
        temperature=1.0,
        extra_body={"structured_outputs": so},
    )
    for choice in r.choices:
        assert choice.finish_reason == "stop", choice
        _valid(choice.text, schema)


def _tensors(module, prompt: str, sampling: dict) -> list:
    text = module.InferInput("text_input", [1], "BYTES")
    text.set_data_from_numpy(np.array([prompt.encode()], dtype=np.object_))
    params = module.InferInput("sampling_parameters", [1], "BYTES")
    params.set_data_from_numpy(np.array([json.dumps(sampling).encode()], dtype=np.object_))
    flag = module.InferInput("exclude_input_in_output", [1], "BOOL")
    flag.set_data_from_numpy(np.array([True]))
    return [text, params, flag]


@pytest.mark.parametrize("form,budget", CASES)
def test_kserve_grpc(server, model_name, form, budget):
    _, so, schema = FORMATS[form]
    auth = {"authorization": f"Bearer {server.api_key}"}
    sampling = {"max_tokens": budget, "temperature": 1.0, "structured_outputs": so}
    with grpcclient.InferenceServerClient(server.grpc_url) as c:

        def one():
            return c.infer(model_name, _tensors(grpcclient, "JSON:", sampling), headers=auth).as_numpy("text_output")

        for out in _many(one):
            _valid(out[0].decode(), schema)


@pytest.mark.parametrize("form,budget", CASES)
def test_kserve_http(server, http, model_name, form, budget):
    _, so, schema = FORMATS[form]
    auth = {"authorization": f"Bearer {server.api_key}"}
    sampling = {"max_tokens": budget, "temperature": 1.0, "structured_outputs": so}

    def one():  # a client per call: tritonclient.http's client is not safe to share between threads
        client = httpclient.InferenceServerClient(server.base_url.removeprefix("http://"), network_timeout=300)
        try:
            out = client.infer(model_name, _tensors(httpclient, "JSON:", sampling), headers=auth)
            return out.as_numpy("text_output")[0].decode()
        finally:
            client.close()

    for text in _many(one):
        _valid(text, schema)
    # the generate extension, the parameter as JSON text (its request-parameter spelling)
    r = http.post(
        f"/v2/models/{model_name}/generate",
        json={
            "text_input": "JSON:",
            "exclude_input_in_output": True,
            "parameters": {"max_tokens": budget, "structured_outputs": json.dumps(so)},
        },
    )
    assert r.status_code == 200, r.text
    _valid(r.json()["text_output"], schema)


def test_patterns_python_cannot_read_are_served(client, server, model_name):
    rf = {"type": "json_schema", "json_schema": {"name": "named", "schema": NAMED, "strict": True}}
    for budget in (30, 200):
        r = client.chat.completions.create(
            model=model_name, messages=MSG, max_tokens=budget, temperature=1.0, n=2, response_format=rf
        )
        for choice in r.choices:
            assert choice.finish_reason == "stop", choice
            _named_valid(choice.message.content)
    auth = {"authorization": f"Bearer {server.api_key}"}
    sampling = {"max_tokens": 60, "temperature": 1.0, "structured_outputs": {"json": NAMED}}
    with grpcclient.InferenceServerClient(server.grpc_url) as c:
        out = c.infer(model_name, _tensors(grpcclient, "JSON:", sampling), headers=auth).as_numpy("text_output")
    _named_valid(out[0].decode())


def test_a_stop_string_that_cannot_occur_leaves_answers_whole(client, model_name):
    r = client.chat.completions.create(
        model=model_name,
        messages=MSG,
        max_tokens=50,
        temperature=1.0,
        n=3,
        stop=["\n\nUser:", "\n"],
        response_format=FORMATS["json_schema"][0],
    )
    for choice in r.choices:
        assert choice.finish_reason == "stop", choice
        _valid(choice.message.content, SCHEMA)


# ---- through the real server: refusals ---------------------------------------------------------


NEEDS = re.compile(r"needs (\d+) tokens")


def test_impossible_budget_is_400_with_the_tokens_needed(client, http, server, model_name):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model=model_name, messages=MSG, max_tokens=3, response_format=FORMATS["json_schema"][0]
        )
    assert info.value.body["param"] == "response_format", info.value.body
    need = int(NEEDS.search(info.value.message).group(1))
    assert need > 3, info.value.message
    # the same constraint fits in exactly that many tokens
    r = client.chat.completions.create(
        model=model_name, messages=MSG, max_tokens=need, response_format=FORMATS["json_schema"][0]
    )
    assert r.choices[0].finish_reason == "stop"
    _valid(r.choices[0].message.content, SCHEMA)
    # json_object: "{}" and end of sequence
    with pytest.raises(openai.BadRequestError, match=r"needs \d+ tokens"):
        client.chat.completions.create(
            model=model_name, messages=MSG, max_tokens=1, response_format={"type": "json_object"}
        )
    # a constraint key, over vllm_xargs, and over KServe
    with pytest.raises(openai.BadRequestError, match=r"vllm_xargs.*needs \d+ tokens|needs \d+ tokens"):
        client.chat.completions.create(
            model=model_name, messages=MSG, max_tokens=1, extra_body={"vllm_xargs": {"constraint_regex": "[a-z]{5}"}}
        )
    auth = {"authorization": f"Bearer {server.api_key}"}
    with grpcclient.InferenceServerClient(server.grpc_url) as c, pytest.raises(InferenceServerException) as grpc_err:
        c.infer(
            model_name,
            _tensors(grpcclient, "x", {"max_tokens": 3, "structured_outputs": {"json": SCHEMA}}),
            headers=auth,
        )
    assert (
        grpc_err.value.status() == "StatusCode.INVALID_ARGUMENT" and f"needs {need} tokens" in grpc_err.value.message()
    )
    r = http.post(
        f"/v2/models/{model_name}/generate",
        json={"text_input": "x", "parameters": {"max_tokens": 3, "structured_outputs": json.dumps({"json": SCHEMA})}},
    )
    assert r.status_code == 400 and f"needs {need} tokens" in r.json()["error"], r.text


def test_a_stop_token_that_could_cut_the_answer_is_a_400_through_the_server(client, tiny_model_dir, model_name):
    """The server registered the model's vocabulary: the token of "," may occur inside a JSON answer."""
    from transformers import AutoTokenizer

    comma = AutoTokenizer.from_pretrained(str(tiny_model_dir)).convert_tokens_to_ids(",")
    with pytest.raises(openai.BadRequestError, match=f"stop token id {comma} "):
        client.chat.completions.create(
            model=model_name,
            messages=MSG,
            max_tokens=50,
            response_format=FORMATS["json_schema"][0],
            extra_body={"stop_token_ids": [comma]},
        )


# its shortest answer needs more than 16 tokens of the tiny vocabulary
LONG = {
    "type": "object",
    "properties": {"a": {"type": "array", "items": {"type": "string", "minLength": 2}, "minItems": 20}},
    "required": ["a"],
}


def test_a_budget_the_client_did_not_set_is_named_as_such(client, http, model_name):
    """The 400 says where its figure comes from: /v1/completions' default of 16, or the context
    the prompt leaves (the engine cuts max_tokens to it), not a max_tokens the client never sent."""
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=model_name, prompt="x", extra_body={"structured_outputs": {"json": LONG}})
    assert info.value.body["param"] == "structured_outputs", info.value.body
    assert "max_tokens=16 (the default of /v1/completions: set max_tokens)" in info.value.message
    need = int(NEEDS.search(info.value.message).group(1))
    r = http.post(
        f"/v2/models/{model_name}/generate",
        json={"text_input": "x", "parameters": {"structured_outputs": json.dumps({"json": LONG})}},
    )
    assert r.status_code == 400 and "max_tokens=16 (the default: set max_tokens)" in r.json()["error"], r.text
    rf = {"type": "json_schema", "json_schema": {"name": "long", "schema": LONG}}

    def prompt_tokens(words: int) -> int:
        r = client.chat.completions.create(
            model=model_name, messages=[{"role": "user", "content": "hello " * words}], max_tokens=1
        )
        return r.usage.prompt_tokens

    # a prompt leaving about half the answer's tokens of the tiny model's 512-token context
    at_50, at_100 = prompt_tokens(50), prompt_tokens(100)
    per_word = (at_100 - at_50) / 50
    words = 50 + int((512 - need // 2 - at_50) / per_word)
    room = 512 - prompt_tokens(words)
    assert 0 < room < need, (room, need, per_word)
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model=model_name,
            messages=[{"role": "user", "content": "hello " * words}],
            max_tokens=need + 50,
            response_format=rf,
        )
    assert f"a budget of {room} tokens (the lesser of max_tokens and what the context leaves" in info.value.message
    assert f"needs {need} tokens" in info.value.message


def test_constraint_budget_false_is_accepted_over_http(client, model_name):
    # the steering off: a random model then runs to max_tokens inside the JSON (finish_reason "length")
    r = client.chat.completions.create(
        model=model_name,
        messages=MSG,
        max_tokens=3,
        response_format={"type": "json_object"},
        extra_body={"vllm_xargs": {"constraint_budget": False}},
    )
    assert r.choices[0].finish_reason in ("stop", "length")


@pytest.mark.parametrize(
    "kwargs,param,needle",
    [
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {
                        "name": "n",
                        "schema": {"type": "array", "contains": {"type": "integer"}, "unevaluatedItems": False},
                    },
                }
            },
            "response_format",
            "['unevaluatedItems']",
        ),
        ({"extra_body": {"structured_outputs": {"grammar": 'start: "yes"'}}}, "structured_outputs", "key 'grammar'"),
        (
            {"response_format": {"type": "json_object"}, "extra_body": {"vllm_xargs": {"constraint_regex": "a+"}}},
            "response_format",
            "not both",
        ),
    ],
)
def test_refused_keyword_named_in_the_400(client, model_name, kwargs, param, needle):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=model_name, messages=MSG, max_tokens=20, **kwargs)
    assert info.value.body["param"] == param and needle in info.value.message, info.value.message


def test_kserve_grpc_refuses_grammar_by_name(server, model_name):
    auth = {"authorization": f"Bearer {server.api_key}"}
    with grpcclient.InferenceServerClient(server.grpc_url) as c, pytest.raises(InferenceServerException) as info:
        c.infer(model_name, _tensors(grpcclient, "x", {"structured_outputs": {"grammar": "x"}}), headers=auth)
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT" and "key 'grammar'" in info.value.message()


# ---- --structured-outputs-backend guidance: vLLM's own backend, on purpose ----------------------


def test_guidance_backend_still_serves_through_vllm(tmp_path, serve_package, model_name, server_control):
    server = server_control.start(
        serve_package,
        tmp_path / "guidance.log",
        api_key=None,
        args=("--structured-outputs-backend", "guidance"),
        ready_timeout=900,
    )
    try:
        assert "served by vLLM's 'guidance' backend" in server.log_text()
        client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="none", timeout=300, max_retries=0)
        bounded = {
            "type": "object",
            "properties": {"name": {"type": "string", "maxLength": 8}, "ok": {"type": "boolean"}},
            "required": ["name", "ok"],
            "additionalProperties": False,
        }
        r = client.chat.completions.create(
            model=model_name,
            messages=MSG,
            max_tokens=64,
            response_format={"type": "json_schema", "json_schema": {"name": "b", "schema": bounded}},
        )
        jsonschema.validate(json.loads(r.choices[0].message.content), bounded)
        # a grammar, which llmserve's engine refuses, is vLLM's (guidance's) to serve here
        r = client.completions.create(
            model=model_name,
            prompt="Answer: ",
            max_tokens=8,
            extra_body={"structured_outputs": {"grammar": 'start: "yes" | "no"'}},
        )
        assert r.choices[0].text in ("yes", "no"), r.choices[0].text
        # the constraint keys are still llmserve's processor's
        r = client.completions.create(
            model=model_name,
            prompt="Pick: ",
            max_tokens=10,
            extra_body={"vllm_xargs": {"constraint_choice": ["up", "down"]}},
        )
        assert r.choices[0].text in ("up", "down")
    finally:
        assert server_control.stop(server) == 0


def test_the_backend_option_reaches_the_engine_arguments():
    from llmserve.serve.engine import STRUCTURED_BACKEND_ARG, merged_engine_args
    from llmserve.serve.errors import EngineArgsError
    from llmserve.serve.options import ServeOptions

    assert STRUCTURED_BACKEND_ARG not in ServeOptions(package=".").engine_overrides()  # llmserve: the default
    args = merged_engine_args({}, ServeOptions(package=".").engine_overrides())
    assert args[STRUCTURED_BACKEND_ARG] == "llmserve"
    overrides = ServeOptions(package=".", structured_outputs_backend="xgrammar").engine_overrides()
    args = merged_engine_args({"structured_outputs_config": {"backend": "guidance"}}, overrides)
    assert args[STRUCTURED_BACKEND_ARG] == "xgrammar" and args["structured_outputs_config"]["backend"] == "xgrammar"
    # vLLM takes disable_any_whitespace from xgrammar and guidance only
    args = merged_engine_args({}, {STRUCTURED_BACKEND_ARG: "outlines"})
    assert "disable_any_whitespace" not in args["structured_outputs_config"]
    with pytest.raises(EngineArgsError, match="structured-outputs-backend"):
        merged_engine_args({}, {STRUCTURED_BACKEND_ARG: "nope"})
