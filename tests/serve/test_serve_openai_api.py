"""The OpenAI-compatible API through the real `openai` client against the real server."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import pytest

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 16},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
        "ok": {"type": "boolean"},
    },
    "required": ["name", "age", "tags", "ok"],
    "additionalProperties": False,
}


def test_models_lists_the_served_model(client, model_name):
    assert [m.id for m in client.models.list().data] == [model_name]


def test_chat_non_streaming(client, model_name):
    r = client.chat.completions.create(
        model=model_name, messages=[{"role": "user", "content": "hello"}], max_tokens=8, extra_body={"ignore_eos": True}
    )
    assert r.object == "chat.completion"
    assert r.choices[0].message.role == "assistant"
    assert r.usage.completion_tokens == 8
    assert r.choices[0].finish_reason == "length"


def test_chat_streaming_with_usage(client, model_name):
    chunks = list(
        client.chat.completions.create(
            model=model_name,
            messages=[{"role": "user", "content": "hello"}],
            max_tokens=6,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish == ["length"]
    assert chunks[-1].usage.completion_tokens == 6
    assert len(text) > 0


def test_completions_and_stream(client, model_name):
    r = client.completions.create(
        model=model_name, prompt="The quick brown", max_tokens=5, extra_body={"ignore_eos": True}
    )
    assert r.object == "text_completion" and r.usage.completion_tokens == 5
    parts = list(
        client.completions.create(
            model=model_name, prompt="The quick brown", max_tokens=5, stream=True, extra_body={"ignore_eos": True}
        )
    )
    assert sum(1 for p in parts if p.choices and p.choices[0].text) >= 1


def test_seed_is_honoured(client, model_name):
    def once():
        return (
            client.chat.completions.create(
                model=model_name, messages=[{"role": "user", "content": "x"}], max_tokens=8, temperature=1.0, seed=1234
            )
            .choices[0]
            .message.content
        )

    assert once() == once()


def test_stop_is_honoured(client, model_name):
    base = (
        client.completions.create(
            model=model_name, prompt="abc", max_tokens=12, temperature=0, extra_body={"ignore_eos": True}
        )
        .choices[0]
        .text
    )
    stop = base[3:5] if len(base) >= 5 else base[-1:]
    r = client.completions.create(model=model_name, prompt="abc", max_tokens=12, temperature=0, stop=[stop])
    assert stop not in r.choices[0].text and r.choices[0].finish_reason == "stop"


@pytest.mark.parametrize("seed", range(6))
def test_json_schema_response_is_valid_every_time(client, model_name, seed):
    r = client.chat.completions.create(
        model=model_name,
        messages=[{"role": "user", "content": f"describe person {seed}"}],
        temperature=1.0,
        seed=seed,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}},
    )
    choice = r.choices[0]
    assert choice.finish_reason == "stop", choice
    jsonschema.validate(json.loads(choice.message.content), PERSON)


def test_json_schema_streaming(client, model_name):
    chunks = client.chat.completions.create(
        model=model_name,
        messages=[{"role": "user", "content": "stream a person"}],
        stream=True,
        seed=7,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}},
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    jsonschema.validate(json.loads(text), PERSON)


def test_json_object_always_finishes_as_a_json_object(client, model_name):
    # A random-weight model never closes anything by itself: llmserve's engine steers it to finish within max_tokens.
    for seed in range(8):
        c = client.chat.completions.create(
            model=model_name,
            messages=[{"role": "user", "content": "give json"}],
            response_format={"type": "json_object"},
            max_tokens=64,
            seed=seed,
        ).choices[0]
        assert c.finish_reason == "stop", c.message.content
        assert isinstance(json.loads(c.message.content), dict)


def test_text_response_format(client, model_name):
    r = client.chat.completions.create(
        model=model_name, messages=[{"role": "user", "content": "hi"}], max_tokens=4, response_format={"type": "text"}
    )
    assert r.choices[0].message.content is not None


def test_logprobs_are_honoured(client, model_name):
    r = client.chat.completions.create(
        model=model_name,
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=3,
        logprobs=True,
        top_logprobs=2,
        extra_body={"ignore_eos": True},
    )
    content = r.choices[0].logprobs.content
    assert len(content) == 3 and all(len(t.top_logprobs) == 2 for t in content)


def test_prefill_only_scoring(client, model_name):
    """Ranking: prompt log-probabilities, no generated tokens (echo + logprobs + max_tokens 0)."""
    prompts = ["the cat sat on the mat", "mat the on sat cat the"]
    r = client.completions.create(model=model_name, prompt=prompts, echo=True, logprobs=0, max_tokens=0)
    assert len(r.choices) == 2
    for prompt, choice in zip(prompts, sorted(r.choices, key=lambda c: c.index), strict=True):
        assert choice.text == prompt  # the prompt only: nothing generated
        lp = choice.logprobs.token_logprobs
        assert lp[0] is None and all(isinstance(x, float) and x <= 0 for x in lp[1:])
        assert "".join(choice.logprobs.tokens) == prompt
    assert r.usage.completion_tokens == 0 or r.usage.completion_tokens is None or r.usage.completion_tokens <= 2


def test_many_concurrent_requests_all_succeed(client, model_name):
    def one(i):
        return client.chat.completions.create(
            model=model_name,
            messages=[{"role": "user", "content": f"req {i}"}],
            max_tokens=16,
            extra_body={"ignore_eos": True},
        )

    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(one, range(16)))
    assert all(r.usage.completion_tokens == 16 for r in results)
    assert len({r.id for r in results}) == 16


def test_embeddings_on_a_generative_model_is_a_clear_400(client, model_name):
    import openai

    with pytest.raises(openai.BadRequestError) as info:
        client.embeddings.create(model=model_name, input="hello")
    assert "not a pooling model" in info.value.message and info.value.body["param"] == "model"
