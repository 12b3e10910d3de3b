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
