"""Triton's generate extension on a Python-backend LLM package (`python.frontend: llm-text`, the built-in transformers
template on the tiny model) through `llmserve serve --engine triton`: sampling settings sent the generate way (top
level, or in `parameters`) reach the model (llmserve.serve.triton.llm_text_generate); a setting it does not take is a
400 naming it, never dropped.
"""

from __future__ import annotations

import json
import shutil

import httpx
import pytest
from support.models import llm_text_manifest
from triton_serving import start_serve, stop, wait_ready

from llmserve.packaging import build_package

MODEL = "tiny-py-gen"
PROMPT = "The parcel is"


@pytest.fixture(scope="module")
def served(tmp_path_factory, tiny_model_dir, triton_env):
    tmp = tmp_path_factory.mktemp("llm-text-generate")
    src = tmp / "src"
    shutil.copytree(tiny_model_dir, src / "model")
    (src / "llmserve.yaml").write_text(llm_text_manifest(MODEL))
    package = build_package(src, tmp / "dist").path
    server = start_serve([package], tmp / "serve.log", triton_env)
    try:
        wait_ready(server)
        yield server
    finally:
        assert stop(server) == 0


def _generate(served, body: dict, path: str = "generate") -> httpx.Response:
    return httpx.post(f"http://127.0.0.1:{served.http}/v2/models/{MODEL}/{path}", json=body, timeout=120)


def _text(answer: httpx.Response) -> str:
    assert answer.status_code == 200, answer.text
    return answer.json()["text_output"]


def test_max_tokens_sent_the_generate_way_is_honoured(served):
    as_input = _text(
        _generate(
            served,
            {
                "text_input": PROMPT,
                "exclude_input_in_output": True,
                "sampling_parameters": json.dumps({"max_tokens": 3, "temperature": 0}),
            },
        )
    )
    default = _text(_generate(served, {"text_input": PROMPT, "exclude_input_in_output": True, "temperature": 0}))
    top_level = _generate(
        served, {"text_input": PROMPT, "exclude_input_in_output": True, "max_tokens": 3, "temperature": 0}
    )
    in_parameters = _generate(
        served,
        {"text_input": PROMPT, "exclude_input_in_output": True, "parameters": {"max_tokens": 3, "temperature": 0}},
    )
    # greedy: the same 3 tokens whichever way max_tokens came; the template's default (16) makes a longer answer
    assert _text(top_level) == as_input
    assert _text(in_parameters) == as_input
    assert len(default) > len(as_input) and default.startswith(as_input)


def test_max_tokens_reaches_the_model_on_generate_stream_and_a_versioned_path(served):
    body = {"text_input": PROMPT, "exclude_input_in_output": True, "max_tokens": 3, "temperature": 0}
    reference = _text(_generate(served, body))
    versioned = httpx.post(
        f"http://127.0.0.1:{served.http}/v2/models/{MODEL}/versions/1/generate", json=body, timeout=120
    )
    assert _text(versioned) == reference
    streamed = _generate(served, body, "generate_stream")
    assert streamed.status_code == 200, streamed.text
    events = [json.loads(line[5:]) for line in streamed.text.splitlines() if line.startswith("data:")]
    assert "".join(e["text_output"] for e in events) == reference


@pytest.mark.parametrize("where", ["top", "parameters"])
def test_a_setting_the_model_does_not_take_is_a_400_naming_it(served, where):
    body = {"text_input": PROMPT, "max_tokens": 2}
    if where == "top":
        body["presence_penalty"] = 0.5
    else:
        body["parameters"] = {"presence_penalty": 0.5}
    answer = _generate(served, body)
    assert answer.status_code == 400, answer.text
    assert "presence_penalty" in answer.text


def test_a_setting_given_twice_is_a_400(served):
    answer = _generate(
        served, {"text_input": PROMPT, "max_tokens": 2, "sampling_parameters": json.dumps({"max_tokens": 4})}
    )
    assert answer.status_code == 400, answer.text
    assert "max_tokens" in answer.text
