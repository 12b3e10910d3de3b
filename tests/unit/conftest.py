"""The fast tier: seconds, no engine, no Triton, no Kubernetes (`make test-unit`; the slow tier ignores this folder)."""

from __future__ import annotations

import sys

import pytest

# Importing any of these would make the tier slow or tie it to the engine stack.
HEAVY = ("vllm", "torch", "transformers", "tritonclient", "kubernetes", "grpc")


@pytest.fixture(scope="session", autouse=True)
def _no_engine_imported():
    yield
    imported = sorted(m for m in HEAVY if m in sys.modules)
    assert imported == [], f"the unit tier imported {imported}: move that test to the slow tier"
