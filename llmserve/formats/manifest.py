"""`llmserve.yaml`: the package manifest a model developer writes.

Validation errors name the key and the line of the file. The engine version is deliberately not a
field: it is pinned by the lock of the stack that serves the package, never by the model developer.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from llmserve.errors import EngineVersionOverrideError, ManifestError
from llmserve.formats.safe_yaml import dump_yaml
from llmserve.formats.tensors import IOSpec
from llmserve.formats.yaml_lines import load_yaml_located

MANIFEST_NAME = "llmserve.yaml"
SCHEMA_VERSION: Final = "llmserve/v1"

# Keys a model developer might use to choose the engine version. Each is refused with an explanation
# rather than reported as merely "unknown".
_VERSION_OVERRIDE_KEYS = {
    "engineVersion",
    "engine_version",
    "vllmVersion",
    "vllm_version",
    "vllm",
    "tritonVersion",
    "triton_version",
    "torchVersion",
    "torch_version",
    "image",
    "baseImage",
}
# Engine arguments the packager owns: they point at the packaged weights.
_PACKAGER_OWNED_ENGINE_ARGS = {
    "model",
    "tokenizer",
    "served_model_name",
    "download_dir",
    "revision",
    "tokenizer_revision",
    "code_revision",
}
# `engine.host`: which engine hosts the package when `llmserve serve` is not told (--engine wins). It is the
# one key of `engine` that is not a vLLM engine argument, so it never reaches model.json.
ENGINE_HOST_KEY = "host"
ENGINE_HOSTS = ("vllm", "triton")


_MODEL_ID_PATTERN = r"^[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?$"


class Plugin(BaseModel):
    """A vLLM plugin shipped inside the package and registered through a Python entry point at startup."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
    source: str = Field(description="Folder, relative to llmserve.yaml, holding the plugin's importable code")
    entryPoint: str = Field(
        pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$",
        description="'module.path:callable' registered under `group`",
    )
    group: Literal["vllm.general_plugins", "vllm.logits_processors"] = "vllm.general_plugins"


class PythonBackend(BaseModel):
    """Settings of a Python-backend package: the frozen I/O tensor spec and the model code."""

    model_config = ConfigDict(extra="forbid")

    tensors: IOSpec
    modelPy: str | None = Field(
        default=None,
        description="Path, relative to llmserve.yaml, of a model.py defining TritonPythonModel; "
        "omit it to use the built-in text-generation template",
    )
    frontend: Literal["llm-text", "none"] = Field(
        default="llm-text",
        description="Which frontend calls the model: its request contract is checked at package time. "
        "'none' when only raw KServe v2 clients call it.",
    )
    decoupled: bool = Field(default=False, description="Triton decoupled transaction policy (streaming responses)")


class Manifest(BaseModel):
    model_config = ConfigDict(extra="forbid", title="llmserve package manifest (llmserve.yaml)")

    schemaVersion: Literal["llmserve/v1"] = SCHEMA_VERSION
    modelId: str = Field(
        description="Lower-case name (letters, digits, '.', '_', '-'; at most 63): the Triton model "
        "name, the served model id and part of Kubernetes object names",
        json_schema_extra={"pattern": _MODEL_ID_PATTERN},
    )
    modelVersion: int = Field(ge=1, le=2**31 - 1, description="Triton version directory (a positive integer)")
    backend: Literal["vllm", "python"]
    executionMode: Literal["embedded", "standalone"] = Field(
        default="embedded",
        description="embedded: the engine runs inside the llmserve process; standalone: in its own server",
    )
    weights: str = Field(
        default="model",
        description="Folder, relative to llmserve.yaml, with config.json, safetensors weights and tokenizer",
    )
    engine: dict[str, Any] = Field(
        default_factory=dict,
        description="vLLM engine arguments (AsyncEngineArgs names), e.g. max_model_len, dtype; and `host`: the "
        "engine host `llmserve serve` picks by default, `vllm` (embedded engine) or `triton`. "
        "`engine: triton` is short for `engine: {host: triton}`",
        json_schema_extra=lambda schema: _engine_schema(schema),
    )
    plugins: list[Plugin] = Field(default_factory=list)
    python: PythonBackend | None = None
    description: str | None = None

    @field_validator("modelId")
    @classmethod
    def _model_id(cls, value: str) -> str:
        if not re.fullmatch(_MODEL_ID_PATTERN, value):
            raise ValueError(
                f"'{value}' is not a valid model id: use lower-case letters, digits, '.', '_' or '-', "
                "start and end with a letter or digit, at most 63 characters"
            )
        return value

    @field_validator("engine", mode="before")
    @classmethod
    def _engine_host_shorthand(cls, engine: Any) -> Any:
        if isinstance(engine, str):
            if engine not in ENGINE_HOSTS:
                raise ValueError(f"'{engine}' is not an engine host; choose one of {', '.join(ENGINE_HOSTS)}")
            return {ENGINE_HOST_KEY: engine}
        return engine

    @field_validator("engine")
    @classmethod
    def _engine_args(cls, engine: dict[str, Any]) -> dict[str, Any]:
        host = engine.get(ENGINE_HOST_KEY)
        if ENGINE_HOST_KEY in engine and host not in ENGINE_HOSTS:
            raise ValueError(f"engine.host: {host!r} is not an engine host; choose one of {', '.join(ENGINE_HOSTS)}")
        for key in engine:
            if problem := engine_key_problem(key):
                raise ValueError(problem)
        try:
            json.dumps(engine)
        except TypeError as exc:
            raise ValueError(f"engine arguments must be plain JSON values ({exc})") from exc
        return engine

    @model_validator(mode="after")
    def _backend_sections(self) -> Manifest:
        if self.backend == "python" and self.python is None:
            raise ValueError("backend 'python' needs a `python:` section with the tensor spec")
        if self.backend == "vllm" and self.python is not None:
            raise ValueError("the `python:` section is only for backend 'python' (the vLLM backend generates its spec)")
        if self.backend == "python" and self.engine_host == "vllm":
            raise ValueError(
                "engine.host 'vllm': a backend 'python' package (custom execute()) runs only in Triton's Python "
                "backend; remove `host` or set it to triton"
            )
        names = [p.name for p in self.plugins]
        if len(names) != len(set(names)):
            raise ValueError("plugin names must be unique")
        return self

    @property
    def engine_args(self) -> dict[str, Any]:
        """The vLLM engine arguments alone (what model.json carries): `engine` without `host`."""
        return {k: v for k, v in self.engine.items() if k != ENGINE_HOST_KEY}

    @property
    def engine_host(self) -> str | None:
        """The engine host the package asks for (`vllm` or `triton`), or None: llmserve serve decides."""
        return self.engine.get(ENGINE_HOST_KEY)

    @property
    def package_name(self) -> str:
        return f"{self.modelId}-{self.modelVersion}"


def _engine_schema(schema: dict[str, Any]) -> None:
    # The published schema takes both spellings, as the parser does: a mapping, or the host's name alone.
    mapping: dict[str, Any] = {k: schema.pop(k) for k in ("type", "additionalProperties") if k in schema}
    mapping["properties"] = {ENGINE_HOST_KEY: {"enum": list(ENGINE_HOSTS)}}
    schema["anyOf"] = [mapping, {"type": "string", "enum": list(ENGINE_HOSTS)}]


def engine_key_problem(key: str) -> str | None:
    if not re.fullmatch(r"[a-z_][a-z0-9_]*", key):
        return f"'{key}' is not an engine argument name (snake_case, as in vLLM's AsyncEngineArgs)"
    if key in _PACKAGER_OWNED_ENGINE_ARGS:
        return f"'{key}' is set by the packager from `weights`; remove it"
    return None


def _check_engine_keys(data: dict, line_of, source: str) -> None:
    # Checked before pydantic so the error can point at the offending key's own line.
    engine = data.get("engine")
    if not isinstance(engine, dict):
        return
    problems = [f"{source}:{line_of(('engine', k))}: engine.{k}: {p}" for k in engine if (p := engine_key_problem(k))]
    if problems:
        raise ManifestError("\n".join(problems))


def _refuse_version_overrides(data: dict, line_of, source: str) -> None:
    found = [k for k in data if k in _VERSION_OVERRIDE_KEYS]
    engine = data.get("engine")
    if isinstance(engine, dict):
        found += [f"engine.{k}" for k in engine if k in _VERSION_OVERRIDE_KEYS or k == "version"]
    if found:
        key = found[0]
        line = line_of(tuple(key.split(".")))
        raise EngineVersionOverrideError(
            f"{source}:{line}: '{key}' tries to choose the engine version; model packages do not pick "
            "their engine: the lock of the serving stack pins vLLM, Triton and torch together"
        )


def parse_manifest(text: str, source: str = MANIFEST_NAME) -> Manifest:
    data, located = load_yaml_located(text, source)
    if not isinstance(data, dict):
        raise ManifestError(
            f"{source}: the manifest must be a YAML mapping of keys (modelId, modelVersion, backend, ...)"
        )
    _refuse_version_overrides(data, located.line_of, source)
    _check_engine_keys(data, located.line_of, source)
    try:
        return Manifest.model_validate(data)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            loc = tuple(err["loc"])
            key = ".".join(str(p) for p in loc) or "(top level)"
            line = located.line_of(loc)
            where = f"{source}:{line}" if line else source
            msg = err["msg"].removeprefix("Value error, ")
            if err["type"] == "extra_forbidden":
                msg = "unknown key"
            problems.append(f"{where}: {key}: {msg}")
        first, rest = problems[0], problems[1:]
        message = first if not rest else first + "\n" + "\n".join(rest)
        raise ManifestError(message) from exc


def load_manifest(path: Path) -> Manifest:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise ManifestError(
            f"{path}: no manifest here",
            hint=f"Write {MANIFEST_NAME} next to the weights (see examples/ and `llmserve schema`).",
        ) from exc
    except UnicodeDecodeError as exc:
        raise ManifestError(f"{path}: not UTF-8 text") from exc
    return parse_manifest(text, str(path))


def dump_manifest(manifest: Manifest) -> str:
    """Canonical YAML of a manifest: fixed key order, defaults spelled out, stable across runs."""
    data = manifest.model_dump(mode="json", exclude_none=True)
    return dump_yaml(data, sort_keys=False, allow_unicode=True, default_flow_style=False)


def manifest_json_schema() -> dict:
    schema = Manifest.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = "https://llmserve.dev/schemas/llmserve.schema.json"
    return schema
