"""Shared fixtures: the tiny model and packages built from it, once per test session."""

from __future__ import annotations

import importlib.util
import os
import shutil
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
TINY_MAKER = REPO / "examples" / "tiny-model" / "make_tiny_model.py"

# Engine and cache settings for every test process (and the servers they start): CPU vLLM,
# in-process engine, caches inside the test session's temporary folder, no hub access.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def load_tiny_maker():
    spec = importlib.util.spec_from_file_location("make_tiny_model", TINY_MAKER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session", autouse=True)
def _isolated_caches(tmp_path_factory):
    root = tmp_path_factory.mktemp("caches")
    for var, sub in (
        ("LLMSERVE_CACHE", "llmserve"),
        ("VLLM_CACHE_ROOT", "vllm"),
        ("TORCHINDUCTOR_CACHE_DIR", "inductor"),
        ("HF_HOME", "hf"),
        ("VLLM_RPC_BASE_PATH", "rpc"),
    ):
        os.environ[var] = str(root / sub)
    yield root


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A deterministic tiny Llama folder (config, safetensors, tokenizer, chat template)."""
    out = tmp_path_factory.mktemp("tiny") / "model"
    load_tiny_maker().make_tiny_model(out, seed=0)
    return out


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


@pytest.fixture(scope="session")
def tiny_vllm_source(tmp_path_factory, tiny_model_dir) -> Path:
    return write_vllm_source(tmp_path_factory.mktemp("src") / "tiny-chat", tiny_model_dir)


@pytest.fixture(scope="session")
def tiny_vllm_package(tmp_path_factory, tiny_vllm_source) -> Path:
    from llmserve.packaging import build_package

    return build_package(tiny_vllm_source, tmp_path_factory.mktemp("dist")).path
