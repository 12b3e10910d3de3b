import json

import pytest

from llmserve.errors import EngineVersionOverrideError, ExitCode, ManifestError
from llmserve.formats.manifest import dump_manifest, manifest_json_schema, parse_manifest

GOOD = """\
modelId: tiny-chat
modelVersion: 3
backend: vllm
engine:
  max_model_len: 512
  dtype: float32
"""

PYTHON = """\
modelId: scorer
modelVersion: 1
backend: python
python:
  tensors:
    inputs:
      - {name: text_input, datatype: BYTES, dims: [1]}
    outputs:
      - {name: text_output, datatype: BYTES, dims: [-1]}
"""


def test_valid_manifest_fills_defaults():
    m = parse_manifest(GOOD)
    assert (m.modelId, m.modelVersion, m.backend, m.executionMode) == ("tiny-chat", 3, "vllm", "embedded")
    assert m.engine == {"max_model_len": 512, "dtype": "float32"}
    assert m.weights == "model" and m.plugins == []


def test_python_manifest_round_trips_through_canonical_yaml():
    m = parse_manifest(PYTHON)
    again = parse_manifest(dump_manifest(m))
    assert again == m
    assert dump_manifest(again) == dump_manifest(m)


@pytest.mark.parametrize(
    "text, line, key, words",
    [
        (GOOD + "colour: blue\n", 7, "colour", "unknown key"),
        (GOOD.replace("modelVersion: 3", "modelVersion: three"), 2, "modelVersion", "integer"),
        (GOOD.replace("modelVersion: 3", "modelVersion: 0"), 2, "modelVersion", "greater than"),
        (GOOD.replace("backend: vllm", "backend: tensorrt"), 3, "backend", "'vllm' or 'python'"),
        (GOOD.replace("tiny-chat", "Tiny Chat"), 1, "modelId", "not a valid model id"),
        (GOOD + "  model: /elsewhere\n", 7, "engine.model", "set by the packager"),
        (GOOD + "  MaxLen: 3\n", 7, "engine.MaxLen", "not an engine argument name"),
        (
            PYTHON.replace("datatype: BYTES, dims: [1]", "datatype: STRING, dims: [1]"),
            7,
            "python.tensors.inputs.0.datatype",
            "BYTES",
        ),
        (PYTHON.replace("dims: [-1]", "dims: [0]"), 9, "python.tensors.outputs.0.dims", "positive"),
        (GOOD + "executionMode: sideways\n", 7, "executionMode", "embedded"),
    ],
)
def test_bad_manifest_names_key_and_line(text, line, key, words):
    with pytest.raises(ManifestError) as info:
        parse_manifest(text, "llmserve.yaml")
    msg = info.value.message
    assert f"llmserve.yaml:{line}: {key}" in msg, msg
    assert words in msg
    assert info.value.exit_code == ExitCode.INVALID_INPUT


def test_python_backend_needs_its_section():
    with pytest.raises(ManifestError, match="needs a `python:` section"):
        parse_manifest(GOOD.replace("backend: vllm", "backend: python"))


def test_vllm_backend_refuses_python_section():
    with pytest.raises(ManifestError, match="only for backend 'python'"):
        parse_manifest(PYTHON.replace("backend: python", "backend: vllm"))


@pytest.mark.parametrize("extra", ["vllmVersion: 0.10.1\n", "engineVersion: '25.09'\n", "engine_version: x\n"])
def test_engine_version_override_is_refused_with_explanation(extra):
    with pytest.raises(EngineVersionOverrideError) as info:
        parse_manifest(GOOD + extra, "llmserve.yaml")
    assert "llmserve.yaml:7" in info.value.message
    assert "lock" in info.value.message
    assert info.value.exit_code == ExitCode.INCOMPATIBLE


def test_engine_version_inside_engine_args_is_refused():
    with pytest.raises(EngineVersionOverrideError, match=r"engine\.version"):
        parse_manifest(GOOD + "  version: 0.9.2\n")


def test_duplicate_keys_are_errors_not_last_wins():
    with pytest.raises(ManifestError, match=r"llmserve.yaml:4: duplicate key 'modelId' \(first defined on line 1\)"):
        parse_manifest(GOOD.replace("backend: vllm", "backend: vllm\nmodelId: other"), "llmserve.yaml")


@pytest.mark.parametrize(
    "text, words", [("modelId: [unclosed\n", "not valid YAML"), ("- a\n- b\n", "YAML mapping"), ("", "YAML mapping")]
)
def test_malformed_yaml(text, words):
    with pytest.raises(ManifestError, match=words):
        parse_manifest(text)


def test_duplicate_tensor_names_refused():
    bad = PYTHON.replace("outputs:", "  - {name: text_input, datatype: BYTES, dims: [1]}\n    outputs:")
    with pytest.raises(ManifestError, match="appears twice"):
        parse_manifest(bad)


def test_published_schema_matches_the_model(tmp_path):
    from pathlib import Path

    published = Path(__file__).resolve().parents[2] / "schemas" / "llmserve.schema.json"
    assert json.loads(published.read_text()) == manifest_json_schema(), (
        "schemas/llmserve.schema.json is stale: regenerate with `llmserve schema > schemas/llmserve.schema.json`"
    )
    schema = manifest_json_schema()
    assert schema["additionalProperties"] is False
    assert set(schema["required"]) == {"modelId", "modelVersion", "backend"}


@pytest.mark.parametrize(
    "engine, host, args",
    [
        ("engine: triton\n", "triton", {}),
        ("engine: vllm\n", "vllm", {}),
        ("engine:\n  host: triton\n  max_model_len: 256\n", "triton", {"max_model_len": 256}),
        ("engine:\n  max_model_len: 256\n", None, {"max_model_len": 256}),
    ],
)
def test_engine_host_is_read_beside_the_engine_arguments(engine, host, args):
    m = parse_manifest(GOOD.split("engine:")[0] + engine)
    assert m.engine_host == host
    assert m.engine_args == args  # what model.json gets: never `host`
    assert parse_manifest(dump_manifest(m)) == m


@pytest.mark.parametrize("engine", ["engine: tensorrt\n", "engine:\n  host: sglang\n"])
def test_unknown_engine_host_is_refused_naming_the_choices(engine):
    with pytest.raises(ManifestError, match="vllm, triton"):
        parse_manifest(GOOD.split("engine:")[0] + engine)


def test_python_backend_cannot_ask_for_the_embedded_vllm_host():
    with pytest.raises(ManifestError, match="runs only in Triton"):
        parse_manifest(PYTHON + "engine: vllm\n")
    assert parse_manifest(PYTHON + "engine: triton\n").engine_host == "triton"


def test_published_schema_takes_both_engine_spellings():
    import jsonschema

    schema = manifest_json_schema()
    base = {"modelId": "m", "modelVersion": 1, "backend": "vllm"}
    for engine in ("triton", {"host": "vllm", "max_model_len": 8}, {"dtype": "float32"}):
        jsonschema.validate({**base, "engine": engine}, schema)
    for engine in ("tensorrt", {"host": "sglang"}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate({**base, "engine": engine}, schema)
