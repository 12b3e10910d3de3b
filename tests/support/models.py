"""The tiny model (examples/tiny-model, the example under test) and package sources around it."""

from __future__ import annotations

import importlib.util
import shutil
import textwrap
from functools import cache
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]
TINY_MAKER = REPO / "examples" / "tiny-model" / "make_tiny_model.py"


@cache
def tiny_maker() -> ModuleType:
    """examples/tiny-model/make_tiny_model.py as a module (examples/ is not a package: loaded by path)."""
    spec = importlib.util.spec_from_file_location("make_tiny_model", TINY_MAKER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_vllm_source(
    root: Path, model_dir: Path, *, model_id: str = "tiny-chat", version: int = 1, extra: str = ""
) -> Path:
    """A package source folder for the vLLM backend around a copy of the tiny model."""
    root.mkdir(parents=True, exist_ok=True)
    shutil.copytree(model_dir, root / "model", dirs_exist_ok=True)
    (root / "llmserve.yaml").write_text(
        textwrap.dedent(f"""\
        modelId: {model_id}
        modelVersion: {version}
        backend: vllm
        engine:
          max_model_len: 512
          dtype: float32
          enforce_eager: true
        """)
        + extra
    )
    return root


def llm_text_manifest(model_id: str, version: int = 1) -> str:
    """llmserve.yaml of a Python-backend LLM package of the llm-text contract (`llmserve serve` hosts it in
    Triton and serves the OpenAI API over it)."""
    return f"""\
modelId: {model_id}
modelVersion: {version}
backend: python
python:
  frontend: llm-text
  tensors:
    inputs:
      - {{name: text_input, datatype: BYTES, dims: [1]}}
      - {{name: stream, datatype: BOOL, dims: [1], optional: true}}
      - {{name: sampling_parameters, datatype: BYTES, dims: [1], optional: true}}
      - {{name: exclude_input_in_output, datatype: BOOL, dims: [1], optional: true}}
    outputs:
      - {{name: text_output, datatype: BYTES, dims: [-1]}}
"""
