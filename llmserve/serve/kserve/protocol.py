"""Transport-independent KServe v2 logic: which model is asked for, what its tensors are, and how
a set of decoded input tensors becomes one generation request.

The tensors are LLM_TEXT_CONTRACT (llmserve.formats.tensors), the single definition shared with the
package builders; nothing here re-declares names or types.

Inputs (Triton vLLM backend convention):
    text_input               BYTES [1]   the prompt (UTF-8)
    stream                   BOOL  [1]   optional, default false: one response per text delta
                                         (gRPC ModelStreamInfer, HTTP generate_stream only)
    sampling_parameters      BYTES [1]   optional JSON object, see sampling.py
    exclude_input_in_output  BOOL  [1]   optional; default: the prompt is prepended to text_output in
                                         non-streaming responses and not sent in streaming ones;
                                         true never sends it, false always does (first delta)
Output:
    text_output              BYTES [1]   the generated text (or, streaming, one delta)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from llmserve import __version__
from llmserve.formats.tensors import LLM_TEXT_CONTRACT, TRITON_DATA_TYPE, TensorSpec
from llmserve.serve.constraint_keys import ConstraintSupport
from llmserve.serve.kserve.errors import invalid, not_found, not_ready
from llmserve.serve.kserve.sampling import Settings, build_settings, parse_sampling_tensor

SERVER_NAME = "llmserve"
# Protocol extensions this server implements (reported by ServerMetadata / GET /v2).
EXTENSIONS = ("model_configuration", "binary_tensor_data", "parameters", "generate")
PLATFORM = "vllm"

INPUTS: dict[str, TensorSpec] = {t.name: t for t in LLM_TEXT_CONTRACT.inputs}
OUTPUTS: dict[str, TensorSpec] = {t.name: t for t in LLM_TEXT_CONTRACT.outputs}
OUTPUT_NAME = LLM_TEXT_CONTRACT.outputs[0].name
# This frontend returns one text per request; the contract's variable dim is 1 here.
OUTPUT_SHAPE = [1]


def server_version() -> str:
    return __version__


def describe_inputs() -> str:
    return "; ".join(f"{t.name} ({t.describe()})" for t in LLM_TEXT_CONTRACT.inputs)


@dataclass
class Served:
    """The model this server answers for, once the engine is up."""

    handle: Any
    name: str
    version: str


class ModelResolver:
    """Turns (model name, version) from a request into the served model, or a precise error."""

    def __init__(self, readiness: Any, model_version: str | int | None = None):
        self.readiness = readiness
        self._version = None if model_version is None else str(model_version)

    def version_of(self, handle: Any) -> str:
        if self._version is not None:
            return self._version
        v = getattr(handle, "model_version", None)
        return str(v) if v is not None else "1"

    def current(self) -> Served | None:
        handle = self.readiness.handle
        if handle is None:
            return None
        return Served(handle, handle.model_name, self.version_of(handle))

    def server_ready(self) -> bool:
        return bool(self.readiness.status()[1])

    def model_ready(self, name: str, version: str = "") -> bool:
        served = self.current()
        if served is None or not self.server_ready():
            return False
        return name == served.name and version in ("", served.version)

    def resolve(self, name: str, version: str = "", *, for_inference: bool) -> Served:
        served = self.current()
        if served is None:
            raise not_ready()
        if name != served.name:
            raise not_found(f"unknown model '{name}': this server serves '{served.name}' (version {served.version})")
        if version not in ("", served.version):
            raise not_found(f"model '{name}' has no version '{version}'; available version: {served.version}")
        if for_inference and not self.server_ready():
            raise not_ready()
        return served


def model_metadata(served: Served) -> dict:
    return {
        "name": served.name,
        "versions": [served.version],
        "platform": PLATFORM,
        "inputs": [{"name": t.name, "datatype": t.datatype, "shape": list(t.dims)} for t in LLM_TEXT_CONTRACT.inputs],
        "outputs": [{"name": t.name, "datatype": t.datatype, "shape": list(t.dims)} for t in LLM_TEXT_CONTRACT.outputs],
    }


def model_config(served: Served) -> dict:
    """The Triton model configuration (JSON form of model_config.proto), decoupled for token streams."""

    def io(t: TensorSpec, is_input: bool) -> dict:
        d: dict[str, Any] = {
            "name": t.name,
            "data_type": TRITON_DATA_TYPE[t.datatype],
            "dims": [int(x) for x in t.dims],  # numbers, as Triton's own JSON has them
        }
        if is_input and t.optional:
            d["optional"] = True
        return d

    return {
        "name": served.name,
        "platform": PLATFORM,
        "backend": PLATFORM,
        "max_batch_size": 0,
        "input": [io(t, True) for t in LLM_TEXT_CONTRACT.inputs],
        "output": [io(t, False) for t in LLM_TEXT_CONTRACT.outputs],
        "model_transaction_policy": {"decoupled": True},
        "version_policy": {"specific": {"versions": [str(served.version)]}},
    }


def server_metadata() -> dict:
    return {"name": SERVER_NAME, "version": server_version(), "extensions": list(EXTENSIONS)}


@dataclass
class DecodedTensor:
    name: str
    datatype: str
    shape: list[int]
    values: list[Any]  # flattened: bytes for BYTES, bool for BOOL


@dataclass
class GenerationRequest:
    prompt: str
    stream: bool
    exclude_input: bool | None
    settings: Settings


def check_tensor_header(name: str, datatype: str, shape: list[int]) -> TensorSpec:
    spec = INPUTS.get(name)
    if spec is None:
        raise invalid(f"unknown input '{name}'; this model takes: {describe_inputs()}")
    if datatype != spec.datatype:
        raise invalid(f"input '{name}': datatype {datatype} is not accepted; expected {spec.datatype}")
    if any((not isinstance(d, int)) or d < 0 for d in shape):
        raise invalid(f"input '{name}': shape {shape} has a negative or non-integer dimension")
    if len(shape) != len(spec.dims) or any(m != -1 and m != s for m, s in zip(spec.dims, shape, strict=True)):
        raise invalid(f"input '{name}': shape {shape} does not match the model's {spec.dims}")
    return spec


def element_count(shape: list[int]) -> int:
    return math.prod(shape) if shape else 1


def build_generation(
    tensors: list[DecodedTensor],
    request_params: dict[str, Any],
    *,
    transport: str,
    streaming_transport: bool,
    constraints: ConstraintSupport,
    max_prompt_chars: int,
) -> GenerationRequest:
    """One generation request from decoded tensors and request parameters; `constraints`: what the
    engine it will run on supports (its EngineHandle's); `max_prompt_chars`: --max-prompt-chars, the
    limit the OpenAI routes apply too (tokenizing a huge prompt is work before any context check)."""
    seen: dict[str, DecodedTensor] = {}
    for t in tensors:
        check_tensor_header(t.name, t.datatype, t.shape)
        if t.name in seen:
            raise invalid(f"input '{t.name}' appears twice")
        if len(t.values) != element_count(t.shape):
            raise invalid(
                f"input '{t.name}': shape {t.shape} needs {element_count(t.shape)} element(s), got {len(t.values)}"
            )
        seen[t.name] = t
    missing = [t.name for t in LLM_TEXT_CONTRACT.inputs if not t.optional and t.name not in seen]
    if missing:
        raise invalid(f"missing required input(s): {', '.join(missing)}; this model takes: {describe_inputs()}")

    prompt = _text(seen["text_input"])
    if not prompt:
        raise invalid("input 'text_input' is empty; send the prompt text")
    if len(prompt) > max_prompt_chars:
        raise invalid(
            f"input 'text_input' is {len(prompt)} characters; this server's limit is {max_prompt_chars} "
            "(--max-prompt-chars)"
        )
    stream = bool(seen["stream"].values[0]) if "stream" in seen else False
    if stream and not streaming_transport:
        raise invalid(
            "input 'stream' is true, but this call returns one response; use gRPC ModelStreamInfer or "
            "HTTP POST /v2/models/{model}/generate_stream for token streams"
        )
    exclude = bool(seen["exclude_input_in_output"].values[0]) if "exclude_input_in_output" in seen else None
    tensor_settings = (
        parse_sampling_tensor(_text(seen["sampling_parameters"])) if "sampling_parameters" in seen else None
    )
    settings = build_settings(tensor_settings, request_params, transport=transport, constraints=constraints)
    return GenerationRequest(prompt=prompt, stream=stream, exclude_input=exclude, settings=settings)


def _text(t: DecodedTensor) -> str:
    value = t.values[0]
    if isinstance(value, str):
        return value
    try:
        return bytes(value).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise invalid(f"input '{t.name}' is not valid UTF-8 text: {exc}") from None


# --- BYTES / BOOL wire formats (gRPC raw_input_contents and the HTTP binary tensor extension) -----


def decode_raw(name: str, datatype: str, raw: bytes, count: int) -> list[Any]:
    """The elements of a raw tensor, refused past `count` (its shape's element count): without the
    bound, a shape-[1] BYTES tensor of 8 MB of empty elements is two million loop turns."""
    if datatype == "BYTES":
        out: list[Any] = []
        i = 0
        while i < len(raw):
            if len(out) == count:
                raise invalid(f"input '{name}': its data has more elements than its shape's {count}")
            if i + 4 > len(raw):
                raise invalid(f"input '{name}': truncated BYTES element (a 4-byte length prefix is incomplete)")
            n = int.from_bytes(raw[i : i + 4], "little")
            i += 4
            if i + n > len(raw):
                raise invalid(f"input '{name}': BYTES element claims {n} bytes, only {len(raw) - i} remain")
            out.append(raw[i : i + n])
            i += n
        return out
    if datatype == "BOOL":
        if len(raw) > count:
            raise invalid(f"input '{name}': its data has more elements than its shape's {count}")
        return [b != 0 for b in raw]
    raise invalid(f"input '{name}': datatype {datatype} is not accepted")


def encode_bytes(values: list[str | bytes]) -> bytes:
    parts = []
    for v in values:
        b = v.encode("utf-8") if isinstance(v, str) else v
        parts.append(len(b).to_bytes(4, "little"))
        parts.append(b)
    return b"".join(parts)


__all__ = [
    "OUTPUT_NAME",
    "DecodedTensor",
    "GenerationRequest",
    "ModelResolver",
    "build_generation",
    "decode_raw",
    "element_count",
    "encode_bytes",
    "model_config",
    "model_metadata",
    "server_metadata",
]
