"""The OpenAI API over Triton for a Python-backend LLM package (`python.frontend: llm-text`, the built-in transformers
template on the tiny model): the official `openai` client against `llmserve serve --engine triton --openai`.

The llm-text contract has no token counts or finish reason: llmserve counts tokens with the package's tokenizer and
derives finish_reason (llmserve.serve.triton.text_protocols). The template's model is not decoupled: a streamed
request gets its whole answer as one delta.
"""

from __future__ import annotations

import shutil
import textwrap

import openai
import pytest
from support.models import llm_text_manifest
from transformers import AutoTokenizer
from triton_serving import start_serve, stop, wait_ready

from llmserve.packaging import build_package

MODEL = "tiny-py-llm"
MANIFEST = llm_text_manifest(MODEL)


@pytest.fixture(scope="module")
def served(tmp_path_factory, tiny_model_dir, triton_env):
    tmp = tmp_path_factory.mktemp("python-llm")
    src = tmp / "src"
    shutil.copytree(tiny_model_dir, src / "model")
    (src / "llmserve.yaml").write_text(textwrap.dedent(MANIFEST))
    package = build_package(src, tmp / "dist").path
    server = start_serve([package], tmp / "serve.log", triton_env, "--openai")
    try:
        wait_ready(server)
        yield server
    finally:
        assert stop(server) == 0


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(str(tiny_model_dir))


def _client(served) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://127.0.0.1:{served.http}/v1", api_key="unused", max_retries=0)


def test_the_python_llm_is_listed_and_completes_with_counted_usage(served, tokenizer):
    client = _client(served)
    assert [m.id for m in client.models.list().data] == [MODEL]
    prompt = "The parcel is"
    answer = client.completions.create(model=MODEL, prompt=prompt, max_tokens=5, temperature=0)
    choice = answer.choices[0]
    assert choice.text
    assert answer.usage.prompt_tokens == len(tokenizer(prompt, add_special_tokens=False)["input_ids"])
    assert answer.usage.completion_tokens == len(tokenizer(choice.text, add_special_tokens=False)["input_ids"])
    # a random-weight model never stops by itself: 5 tokens asked, 5 made (re-tokenized text may differ by one)
    assert choice.finish_reason == "length" or answer.usage.completion_tokens < 5


def test_chat_streams_the_whole_answer_of_a_model_that_is_not_decoupled(served):
    client = _client(served)
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Say hi"}],
            max_tokens=6,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert text and len(reasons) == 1 and reasons[0] in ("length", "stop")
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    whole = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Say hi"}], max_tokens=6, temperature=0
    )
    assert whole.choices[0].message.content == text  # greedy: the same answer either way


def test_a_sampling_setting_the_model_does_not_take_is_a_400_naming_it(served):
    with pytest.raises(openai.BadRequestError) as caught:
        _client(served).completions.create(model=MODEL, prompt="hi", max_tokens=4, presence_penalty=0.5)
    assert "presence_penalty" in str(caught.value)


@pytest.mark.parametrize(
    "extra",
    [
        {"response_format": {"type": "json_object"}},
        {"extra_body": {"vllm_xargs": {"constraint_regex": "[0-9]+"}}},
    ],
)
def test_structured_output_is_refused_for_a_python_model_not_ignored(served, extra):
    with pytest.raises(openai.BadRequestError) as caught:
        _client(served).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4, **extra
        )
    assert "Python-backend" in str(caught.value)
