"""The CPU KV cache size: vLLM's CPU platform lets VLLM_CPU_KVCACHE_SPACE (whole GiB, read with int()) replace
the engine argument kv_cache_memory_bytes, so llmserve decides which one holds instead of letting one drop."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from llmserve.serve import environment
from llmserve.serve.environment import KV_SPACE, KV_SPACE_DEFAULTED, settle_kv_cache_size
from llmserve.serve.errors import StartupError


@pytest.fixture
def env(monkeypatch):
    """A private copy of the process environment (prepare_engine_environment writes many variables)."""
    copy = {k: v for k, v in os.environ.items() if k not in (KV_SPACE, KV_SPACE_DEFAULTED)}
    monkeypatch.setattr(os, "environ", copy)
    return copy


def test_the_packages_size_replaces_llmserves_default(env):
    environment.prepare_engine_environment(None)
    assert env[KV_SPACE] == "1" and env[KV_SPACE_DEFAULTED] == "1"
    note = settle_kv_cache_size({"kv_cache_memory_bytes": 458752})
    assert KV_SPACE not in env and note is not None and "458752" in note


def test_without_an_engine_size_the_default_stays(env):
    environment.prepare_engine_environment(None)
    assert settle_kv_cache_size({"max_num_seqs": 4}) is None and env[KV_SPACE] == "1"


@pytest.mark.parametrize("given", ["flag", "environment"])
def test_a_size_the_operator_chose_and_the_packages_are_refused_naming_both(env, given):
    if given == "flag":
        environment.prepare_engine_environment(2)
    else:
        env[KV_SPACE] = "3"
        environment.prepare_engine_environment(None)
    assert KV_SPACE_DEFAULTED not in env
    with pytest.raises(StartupError) as err:
        settle_kv_cache_size({"kv_cache_memory_bytes": 1 << 20})
    assert "kv_cache_memory_bytes=1048576" in err.value.message and KV_SPACE in err.value.message
    assert "--kv-cache-gib" in (err.value.hint or "")
    assert env[KV_SPACE] == ("2" if given == "flag" else "3")


def test_kv_cache_gib_takes_whole_gib_only(tmp_path):
    p = subprocess.run(
        [sys.executable, "-m", "llmserve.cli.app", "serve", str(tmp_path / "x.llmpkg"), "--kv-cache-gib", "0.5"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 2 and "--kv-cache-gib" in p.stderr and "integer" in p.stderr
