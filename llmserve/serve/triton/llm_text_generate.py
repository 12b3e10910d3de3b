"""Triton's generate extension (`POST /v2/models/{m}/generate`, `generate_stream`) for llm-text packages.

Triton maps a generate body's top-level fields to the model's inputs by name and passes everything else (the
`parameters` object, and top-level fields no input is named after) as request parameters. A model of the llm-text
contract (llmserve.serve.triton.text_protocols) reads its sampling settings from the `sampling_parameters` input
only, so `{"text_input": "hi", "max_tokens": 5}` used to reach it without its max_tokens: the setting was dropped
and the answer ran to the model's own default length.

Here such a body is rewritten before it is forwarded, the way Triton's vLLM backend reads request parameters when
no `sampling_parameters` input is sent: every top-level field that is not one of the model's inputs, and every
entry of `parameters` that is not Triton's own (priority, timeout, sequence_*, headers, triton_*), becomes a key of
`sampling_parameters`. The model then honours it or refuses it by name (the built-in template refuses keys it does
not take), so nothing is dropped. A key given twice (top level or parameters, and inside sampling_parameters) and a
sampling_parameters that is not a JSON object are 400s here.

A vLLM-backend model reads request parameters itself, but Triton takes only numbers, booleans and strings there: a
body like `{"text_input": "hi", "parameters": {"structured_outputs": {"json": {...}}}}`, which llmserve's embedded
engine serves, got Triton's "parameter ... has invalid type". Its object and list parameters are sent on as JSON
text (`encode_nested_parameters`), the form the backend's sampling table reads for lists and objects.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

from llmserve.serve.limits import JsonProblem, load_json
from llmserve.serve.triton.text_protocols import ADDITIONAL_OUTPUTS

# The KServe/Triton request parameters Triton itself acts on (its parameters extension): not sampling settings.
TRITON_PARAMETERS = frozenset({"sequence_id", "priority", "timeout", "sequence_start", "sequence_end", "headers"})
# The BOOL inputs of the llm-text contract and of the vLLM backend: Triton's JSON reader answers another type with a 500
BOOL_INPUTS = frozenset({"stream", "exclude_input_in_output", *ADDITIONAL_OUTPUTS})
GENERATE_PATH = re.compile(r"^models/([^/]+)(?:/versions/[^/]+)?/generate(?:_stream)?$")


class GenerateBodyError(ValueError):
    """A generate body that cannot be forwarded to an llm-text model as it means: answered with a 400."""


def generate_body_problem(raw: bytes, path: str) -> str | None:
    """What makes a generate body one Triton would answer with a 500 (its JSON reader's errors) or a 200 holding an
    error (a stream asked of generate), or would read silently one way (a setting given twice); None if none."""
    try:
        body = load_json(raw)
    except JsonProblem as exc:
        return f"the generate body is {exc}"
    if not isinstance(body, dict):
        return "the generate body must be a JSON object"
    parameters = body.get("parameters", {})
    if not isinstance(parameters, dict):
        return "'parameters' must be a JSON object"
    text = body.get("text_input", "")
    if not isinstance(text, str) and not (isinstance(text, list) and all(isinstance(t, str) for t in text)):
        return "'text_input' must be a string (the prompt)"
    for key in sorted(BOOL_INPUTS & set(body)):
        value = body[key]
        if not isinstance(value, bool) and not (isinstance(value, list) and all(isinstance(v, bool) for v in value)):
            return f"'{key}' must be true or false"
    if "id" in body and not isinstance(body["id"], str):
        return "'id' (the request's id) must be a string"
    if "sampling_parameters" in body and not isinstance(body["sampling_parameters"], (str, dict)):
        return "'sampling_parameters' must be a JSON object (or a string holding one)"
    if body.get("stream") is True and not path.endswith("_stream"):
        return "'stream' is true, but generate answers with one response: POST .../generate_stream for a stream"
    twice = sorted(set(body) & set(parameters))
    if twice:
        return f"{', '.join(twice)}: given both at the top level and in parameters; set each in one place"
    return None


def generated_model(path: str) -> str | None:
    """The model a generate/generate_stream path (below /v2/) names; None for any other route."""
    found = GENERATE_PATH.match(path)
    return found.group(1) if found else None


def _triton_own(key: str) -> bool:
    return key in TRITON_PARAMETERS or key.startswith("triton_")


def _json_object(raw: bytes) -> dict[str, Any] | None:
    """The body as a JSON object; None for anything else (Triton answers it with its own error), a body nested
    deeper than the bounded reader takes among them."""
    try:
        body = load_json(raw)
    except JsonProblem:
        return None
    return body if isinstance(body, dict) else None


def encode_nested_parameters(raw: bytes, inputs: Iterable[str]) -> bytes:
    """The generate body with every object or list value among its request parameters (top-level fields that are
    not one of `inputs`, and entries of `parameters`) written as JSON text (module doc). A body that is not a JSON
    object is returned unchanged (Triton answers it with its own error)."""
    body = _json_object(raw)
    if body is None:
        return raw
    names = set(inputs) | {"id", "parameters"}
    changed = False

    def encoded(entries: dict[str, Any], skipped: set[str]) -> None:
        nonlocal changed
        for key, value in entries.items():
            if key not in skipped and isinstance(value, (dict, list)):
                entries[key] = json.dumps(value)
                changed = True

    encoded(body, names)
    if isinstance(body.get("sampling_parameters"), dict):  # the embedded engine takes it as an object too
        body["sampling_parameters"] = json.dumps(body["sampling_parameters"])
        changed = True
    if isinstance(body.get("parameters"), dict):
        encoded(body["parameters"], set())
    return json.dumps(body).encode() if changed else raw


def rewrite_generate_body(raw: bytes, inputs: Iterable[str]) -> bytes:
    """The generate body with its sampling settings moved into `sampling_parameters` (module doc).

    `inputs`: the model's input tensor names. A body that is not a JSON object is returned unchanged (Triton
    answers it with its own error)."""
    body = _json_object(raw)
    if body is None:
        return raw
    names = set(inputs)
    sampling: dict[str, Any] = {}
    given = body.get("sampling_parameters")
    if given is not None:
        try:
            sampling = json.loads(given) if isinstance(given, str) else given
        except ValueError as exc:
            raise GenerateBodyError(f"sampling_parameters is not JSON: {exc}") from exc
        if not isinstance(sampling, dict):
            raise GenerateBodyError("sampling_parameters must be a JSON object (or a string holding one)")
        sampling = dict(sampling)
    moved: dict[str, Any] = {}
    rest: dict[str, Any] = {}
    for key, value in body.items():
        if key in names or key in ("id", "parameters"):
            rest[key] = value
        else:
            moved[key] = value
    parameters = body.get("parameters")
    if isinstance(parameters, dict):
        kept = {}
        for key, value in parameters.items():
            if _triton_own(key):
                kept[key] = value
            elif key in moved:
                raise GenerateBodyError(f"'{key}' is given twice: at the top level and in parameters")
            else:
                moved[key] = value
        if kept:
            rest["parameters"] = kept
        else:
            rest.pop("parameters", None)
    if not moved:
        return raw
    twice = sorted(set(moved) & set(sampling))
    if twice:
        raise GenerateBodyError(f"{', '.join(twice)}: given twice, in sampling_parameters and outside it")
    rest["sampling_parameters"] = json.dumps({**sampling, **moved})
    return json.dumps(rest).encode()
