"""The real Triton (nvidia-pytriton's `tritonserver` 2.51, in the Triton environment `make triton-env` builds) and
small Python-backend model repositories for it.

The Triton environment is $LLMSERVE_TRITON_ENV, else .venv-triton at the repository root. A missing one fails
these tests (it is not a skip): CI builds it from requirements/triton-python-env.txt.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from triton_models import write_model

from llmserve.errors import LLMServeError
from llmserve.serve.triton import PYTHON_ENV_ENV, TritonInstall, locate_tritonserver

REPO = Path(__file__).resolve().parents[2]
TRITON_ENV = Path(os.environ.get(PYTHON_ENV_ENV) or REPO / ".venv-triton")


@pytest.fixture(scope="session")
def triton_env() -> Path:
    return TRITON_ENV


@pytest.fixture(scope="session")
def triton_install() -> TritonInstall:
    try:
        return locate_tritonserver(TRITON_ENV)
    except LLMServeError as exc:
        pytest.fail(f"{exc.message}\n{exc.hint}\nlooked at: {[d.rows for d in exc.details]}")


@pytest.fixture
def model_repo(tmp_path) -> Callable[..., Path]:
    """model_repo(name=code, ...) -> a repository folder holding those Python-backend models."""

    def make(**models: str) -> Path:
        repo = tmp_path / "repository"
        repo.mkdir(exist_ok=True)
        for name, code in models.items():
            write_model(repo, name, code)
        return repo

    return make
