"""Conformance: every request field of the installed `openai` package's schemas has a fate.

Honoured fields take effect (checked where cheap); rejected fields give 400 naming the field.
"""

from __future__ import annotations

import pytest
from openai.types import completion_create_params, embedding_create_params
from openai.types.chat import completion_create_params as chat_params

from llmserve.serve.constraint_keys import ConstraintSupport
from llmserve.serve.openai.errors import RequestRejected
from llmserve.serve.openai.fields import TABLES
from llmserve.serve.openai.request_check import check_request

MSG = [{"role": "user", "content": "hi"}]
BASE = {
    "chat": {"model": "tiny-chat", "messages": MSG, "max_tokens": 2},
    "completion": {"model": "tiny-chat", "prompt": "hi", "max_tokens": 2},
    "embedding": {"model": "tiny-chat", "input": "hi"},
}
# no request here carries a constraint: what the engine supports is not looked at
NO_ENGINE = ConstraintSupport(False, "no engine in these tests")
ROUTES = {"chat": "/v1/chat/completions", "completion": "/v1/completions", "embedding": "/v1/embeddings"}


def openai_fields(kind: str) -> set[str]:
    if kind == "chat":
        td = [chat_params.CompletionCreateParamsNonStreaming, chat_params.CompletionCreateParamsStreaming]
    elif kind == "completion":
        td = [
            completion_create_params.CompletionCreateParamsNonStreaming,
            completion_create_params.CompletionCreateParamsStreaming,
        ]
    else:
        td = [embedding_create_params.EmbeddingCreateParams]
    names: set[str] = set()
    for t in td:
        for klass in t.__mro__:
            names |= set(getattr(klass, "__annotations__", {}))
    return names


@pytest.mark.parametrize("kind", ["chat", "completion", "embedding"])
def test_every_openai_field_has_a_fate(kind):
    fields = openai_fields(kind)
    assert len(fields) > 3
    missing = sorted(fields - set(TABLES[kind]))
    assert not missing, f"fields of the openai {kind} schema without a fate: {missing}"
    for name in fields:
        assert TABLES[kind][name].how, name


def _rejected(kind):
    return sorted(n for n in openai_fields(kind) if not TABLES[kind][n].honoured)


@pytest.mark.parametrize("kind", ["chat", "completion", "embedding"])
def test_rejected_fields_are_refused_by_the_checker(kind):
    for name in _rejected(kind):
        with pytest.raises(RequestRejected) as info:
            check_request(kind, {**BASE[kind], name: {"any": "value"}}, NO_ENGINE)
        assert info.value.param == name and info.value.status == 400


def test_null_means_not_set_and_unknown_is_refused():
    forwarded, _ = check_request("chat", {**BASE["chat"], "audio": None, "temperature": None}, NO_ENGINE)
    assert "audio" not in forwarded and "temperature" not in forwarded
    with pytest.raises(RequestRejected) as info:
        check_request("completion", {**BASE["completion"], "typo_field": 1}, NO_ENGINE)
    assert info.value.param == "typo_field" and info.value.code == "unknown_parameter"


def test_honoured_rewrites():
    forwarded, consumed = check_request(
        "chat",
        {
            **BASE["chat"],
            "prompt_cache_key": "tenant-a",
            "user": "u1",
            "stream": True,
            "stream_options": {"include_usage": True, "include_obfuscation": False},
        },
        NO_ENGINE,
    )
    assert forwarded["cache_salt"] == "tenant-a" and "prompt_cache_key" not in forwarded
    assert consumed == {"user": "u1"} and forwarded["stream_options"] == {"include_usage": True}


@pytest.mark.parametrize("kind", ["chat", "completion", "embedding"])
def test_rejected_fields_are_400_on_the_wire(http, kind):
    for name in [*_rejected(kind), "definitely_not_a_field"]:
        r = http.post(ROUTES[kind], json={**BASE[kind], name: {"any": "value"}})
        assert r.status_code == 400, (name, r.text)
        assert r.json()["error"]["param"] == name


def test_honoured_fields_take_effect(client, model_name):
    r = client.chat.completions.create(
        model=model_name,
        messages=MSG,
        n=2,
        max_completion_tokens=3,
        extra_body={"ignore_eos": True},
        prompt_cache_key="k",
        user="someone",
        store=False,
        service_tier="auto",
        metadata={},
        tool_choice="none",
        tools=[],
    )
    assert len(r.choices) == 2 and r.usage.completion_tokens == 6
    r = client.completions.create(
        model=model_name, prompt="hi", max_tokens=3, logprobs=2, echo=True, best_of=1, extra_body={"ignore_eos": True}
    )
    assert r.choices[0].text.startswith("hi") and len(r.choices[0].logprobs.top_logprobs[-1]) >= 2
    r = client.completions.create(
        model=model_name, prompt="hi", max_tokens=8, logit_bias={"65": 100}, extra_body={"ignore_eos": True}
    )
    assert r.choices[0].text  # a strong bias on one token id: the engine honours it (see next assert)
    toks = (
        client.completions.create(
            model=model_name,
            prompt="hi",
            max_tokens=4,
            logprobs=1,
            logit_bias={"65": 100},
            extra_body={"ignore_eos": True},
        )
        .choices[0]
        .logprobs.tokens
    )
    assert len(set(toks)) == 1
