"""Shared fixtures: the tiny model and packages built from it, once per test session.

Fixtures only: helpers live in the `support` package (tests/support), imported by name.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from support.models import tiny_maker, write_vllm_source

# Engine and cache settings for every test process (and the servers they start): CPU vLLM,
# in-process engine, caches inside the test session's temporary folder, no hub access.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


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
    tiny_maker().make_tiny_model(out, seed=0)
    return out


@pytest.fixture(scope="session")
def tiny_vllm_source(tmp_path_factory, tiny_model_dir) -> Path:
    return write_vllm_source(tmp_path_factory.mktemp("src") / "tiny-chat", tiny_model_dir)


@pytest.fixture(scope="session")
def tiny_vllm_package(tmp_path_factory, tiny_vllm_source) -> Path:
    from llmserve.packaging import build_package

    return build_package(tiny_vllm_source, tmp_path_factory.mktemp("dist")).path
