"""Tensor specs (KServe v2 datatypes) and the request contract the LLM frontends use.

The contract is defined once, here: the OpenAI and KServe v2 frontends build requests with exactly
these tensors, and a Python-backend package's frozen spec is checked against it at package time.
The names follow the Triton vLLM backend's generated spec, so one client serves both backends.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from llmserve.errors import Detail, SpecMismatchError

Datatype = Literal[
    "BOOL",
    "UINT8",
    "UINT16",
    "UINT32",
    "UINT64",
    "INT8",
    "INT16",
    "INT32",
    "INT64",
    "FP16",
    "FP32",
    "FP64",
    "BF16",
    "BYTES",
]

# KServe v2 datatype -> Triton model-config data_type.
TRITON_DATA_TYPE: dict[str, str] = {
    "BOOL": "TYPE_BOOL",
    "UINT8": "TYPE_UINT8",
    "UINT16": "TYPE_UINT16",
    "UINT32": "TYPE_UINT32",
    "UINT64": "TYPE_UINT64",
    "INT8": "TYPE_INT8",
    "INT16": "TYPE_INT16",
    "INT32": "TYPE_INT32",
    "INT64": "TYPE_INT64",
    "FP16": "TYPE_FP16",
    "FP32": "TYPE_FP32",
    "FP64": "TYPE_FP64",
    "BF16": "TYPE_BF16",
    "BYTES": "TYPE_STRING",
}


class TensorSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
    datatype: Datatype
    dims: list[int] = Field(min_length=1, max_length=8, description="-1 marks a variable dimension")
    optional: bool = False

    @field_validator("dims")
    @classmethod
    def _dims_valid(cls, dims: list[int]) -> list[int]:
        for d in dims:
            if d == 0 or d < -1:
                raise ValueError("each dimension is a positive size or -1 (variable)")
        return dims

    def describe(self) -> str:
        req = "optional" if self.optional else "required"
        return f"{self.datatype} [{', '.join(map(str, self.dims))}] {req}"


class IOSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    inputs: list[TensorSpec] = Field(min_length=1)
    outputs: list[TensorSpec] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique_names(self) -> IOSpec:
        for kind, tensors in (("inputs", self.inputs), ("outputs", self.outputs)):
            seen: set[str] = set()
            for t in tensors:
                if t.name in seen:
                    raise ValueError(f"{kind}: tensor name '{t.name}' appears twice")
                seen.add(t.name)
        if any(o.optional for o in self.outputs):
            raise ValueError("outputs cannot be optional")
        return self


# What the LLM frontends (OpenAI and KServe v2 text generation) send and expect.
LLM_TEXT_CONTRACT = IOSpec(
    inputs=[
        TensorSpec(name="text_input", datatype="BYTES", dims=[1]),
        TensorSpec(name="stream", datatype="BOOL", dims=[1], optional=True),
        TensorSpec(name="sampling_parameters", datatype="BYTES", dims=[1], optional=True),
        TensorSpec(name="exclude_input_in_output", datatype="BOOL", dims=[1], optional=True),
    ],
    outputs=[TensorSpec(name="text_output", datatype="BYTES", dims=[-1])],
)

FRONTEND_CONTRACTS: dict[str, IOSpec] = {"llm-text": LLM_TEXT_CONTRACT}


def _dims_accept(model_dims: list[int], sent_dims: list[int]) -> bool:
    """A model dim of -1 accepts any size; otherwise sizes must be equal. Ranks must match."""
    return len(model_dims) == len(sent_dims) and all(
        m == -1 or m == s for m, s in zip(model_dims, sent_dims, strict=True)
    )


def contract_problems(model: IOSpec, contract: IOSpec) -> list[tuple[str, str, str, str]]:
    """Compare a model's frozen spec with a frontend's contract.

    Returns rows (tensor, frontend side, model side, verdict) for every tensor either side names;
    the verdict is "ok" or the reason the pair cannot work.
    """
    rows: list[tuple[str, str, str, str]] = []
    model_in = {t.name: t for t in model.inputs}
    model_out = {t.name: t for t in model.outputs}
    for sent in contract.inputs:
        got = model_in.get(sent.name)
        if got is None:
            verdict = "model does not declare this input; the frontend sends it"
        elif got.datatype != sent.datatype:
            verdict = f"datatype differs: frontend sends {sent.datatype}"
        elif not _dims_accept(got.dims, sent.dims):
            verdict = f"dims differ: frontend sends {sent.dims}"
        elif sent.optional and not got.optional:
            verdict = "model requires it, but the frontend sends it only when the caller sets it"
        else:
            verdict = "ok"
        rows.append((f"input {sent.name}", sent.describe(), got.describe() if got else "-", verdict))
    for name, got in model_in.items():
        if any(s.name == name for s in contract.inputs):
            continue
        verdict = "ok" if got.optional else "model requires an input the frontend never sends"
        rows.append((f"input {name}", "-", got.describe(), verdict))
    for expected in contract.outputs:
        got = model_out.get(expected.name)
        if got is None:
            verdict = "model does not produce this output; the frontend reads it"
        elif got.datatype != expected.datatype:
            verdict = f"datatype differs: frontend reads {expected.datatype}"
        elif len(got.dims) != len(expected.dims):
            verdict = f"rank differs: frontend reads {len(expected.dims)} dimension(s)"
        else:
            verdict = "ok"
        rows.append((f"output {expected.name}", expected.describe(), got.describe() if got else "-", verdict))
    for name, got in model_out.items():
        if not any(e.name == name for e in contract.outputs):
            rows.append((f"output {name}", "-", got.describe(), "ok (ignored by the frontend)"))
    return rows


def check_against_contract(model: IOSpec, frontend: str, source: str) -> None:
    """Raise SpecMismatchError, with both specs side by side, unless the model fits the frontend."""
    contract = FRONTEND_CONTRACTS[frontend]
    rows = contract_problems(model, contract)
    bad = [r for r in rows if not r[3].startswith("ok")]
    if bad:
        raise SpecMismatchError(
            f"{source}: the Python model's tensor spec does not fit the '{frontend}' frontend contract "
            f"({len(bad)} problem{'s' if len(bad) > 1 else ''})",
            hint=(
                "Change python.tensors in llmserve.yaml (and model.py) to match the frontend column, "
                "or set python.frontend: none if only raw KServe v2 clients call this model."
            ),
            details=[
                Detail(
                    title=f"frontend '{frontend}' vs model",
                    columns=["tensor", "frontend", "model", "verdict"],
                    rows=[list(r) for r in rows],
                )
            ],
        )
