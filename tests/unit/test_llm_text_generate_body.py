"""The generate body rewrites (llmserve.serve.triton.llm_text_generate): for llm-text models, sampling settings sent
the generate way land in sampling_parameters, Triton's own parameters stay, conflicts are refused; for vLLM-backend
models, object and list parameters travel as JSON text (Triton refuses them as values)."""

from __future__ import annotations

import json

import pytest

from llmserve.serve.triton.llm_text_generate import (
    GenerateBodyError,
    encode_nested_parameters,
    generate_body_problem,
    generated_model,
    rewrite_generate_body,
)

INPUTS = ["text_input", "stream", "sampling_parameters", "exclude_input_in_output"]


def _rewrite(body: dict) -> dict:
    return json.loads(rewrite_generate_body(json.dumps(body).encode(), INPUTS))


def test_top_level_and_parameters_settings_become_sampling_parameters():
    out = _rewrite(
        {"id": "7", "text_input": "hi", "stream": False, "max_tokens": 3, "parameters": {"seed": 1, "priority": 2}}
    )
    assert json.loads(out.pop("sampling_parameters")) == {"max_tokens": 3, "seed": 1}
    assert out == {"id": "7", "text_input": "hi", "stream": False, "parameters": {"priority": 2}}


def test_settings_merge_with_a_given_sampling_parameters():
    out = _rewrite({"text_input": "hi", "sampling_parameters": json.dumps({"top_k": 2}), "temperature": 0})
    assert json.loads(out["sampling_parameters"]) == {"top_k": 2, "temperature": 0}


def test_a_body_with_nothing_to_move_is_forwarded_byte_for_byte():
    raw = b'{"text_input": "hi",  "parameters": {"triton_enable_empty_final_response": true}}'
    assert rewrite_generate_body(raw, INPUTS) is raw
    assert rewrite_generate_body(b"not json", INPUTS) == b"not json"


@pytest.mark.parametrize(
    "body",
    [
        {"text_input": "hi", "max_tokens": 2, "sampling_parameters": json.dumps({"max_tokens": 4})},
        {"text_input": "hi", "max_tokens": 2, "parameters": {"max_tokens": 4}},
        {"text_input": "hi", "sampling_parameters": "[1]", "max_tokens": 2},
        {"text_input": "hi", "sampling_parameters": "{", "max_tokens": 2},
    ],
)
def test_conflicts_and_bad_sampling_parameters_are_refused(body):
    with pytest.raises(GenerateBodyError):
        _rewrite(body)


def test_only_generate_routes_name_a_model():
    assert generated_model("models/m/generate") == "m"
    assert generated_model("models/m/versions/2/generate_stream") == "m"
    assert generated_model("models/m/infer") is None
    assert generated_model("models/m/generate/x") is None


def test_object_and_list_parameters_of_a_vllm_model_become_json_text():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    body = {
        "text_input": ["hi"],  # an input: Triton makes a tensor of it, so it stays as sent
        "stop": ["\n"],
        "max_tokens": 5,
        "parameters": {"structured_outputs": {"json": schema}, "seed": 1, "bad_words": []},
    }
    out = json.loads(encode_nested_parameters(json.dumps(body).encode(), INPUTS))
    assert out["text_input"] == ["hi"] and out["max_tokens"] == 5 and out["parameters"]["seed"] == 1
    assert json.loads(out["stop"]) == ["\n"]
    assert json.loads(out["parameters"]["structured_outputs"]) == {"json": schema}
    assert out["parameters"]["bad_words"] == "[]"


def test_a_vllm_body_with_only_scalar_parameters_is_forwarded_byte_for_byte():
    raw = b'{"text_input": "hi",  "parameters": {"max_tokens": 4, "structured_outputs": "{}"}}'
    assert encode_nested_parameters(raw, INPUTS) is raw
    assert encode_nested_parameters(b"[1, 2]", INPUTS) == b"[1, 2]"


def test_a_sampling_parameters_object_of_a_vllm_model_becomes_json_text_and_a_deep_body_is_left_to_triton():
    raw = json.dumps({"text_input": "hi", "sampling_parameters": {"max_tokens": 3}}).encode()
    assert json.loads(json.loads(encode_nested_parameters(raw, INPUTS))["sampling_parameters"]) == {"max_tokens": 3}
    deep = b'{"text_input": "x", "p": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    assert encode_nested_parameters(deep, INPUTS) is deep
    assert rewrite_generate_body(deep, INPUTS) is deep


@pytest.mark.parametrize(
    "body,needle",
    [
        ({"text_input": "x", "stream": "no"}, "'stream' must be true or false"),
        ({"text_input": "x", "exclude_input_in_output": 1}, "'exclude_input_in_output' must be"),
        ({"text_input": "x", "return_num_output_tokens": [True, 0]}, "'return_num_output_tokens' must be"),
        ({"text_input": "x", "id": 5}, "'id' (the request's id) must be a string"),
        ({"text_input": "x", "sampling_parameters": [1]}, "'sampling_parameters' must be a JSON object"),
    ],
)
def test_values_triton_would_answer_with_a_500_are_named(body, needle):
    assert needle in generate_body_problem(json.dumps(body).encode(), "models/m/generate")


def test_well_typed_inputs_pass():
    body = {"text_input": "x", "id": "r", "stream": [False], "exclude_input_in_output": True, "sampling_parameters": {}}
    assert generate_body_problem(json.dumps(body).encode(), "models/m/generate") is None
