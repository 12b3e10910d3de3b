"""Errors of the Triton host: no server found, an unusable Triton Python environment, a server that would not
start, a model Triton could not load."""

from __future__ import annotations

from llmserve.errors import EngineError, IncompatibleError, NotFoundError

TRITON_ENV_HINT = "make triton-env (builds .venv-triton from requirements/triton-python-env.txt)"


class TritonNotFoundError(NotFoundError):
    """No `tritonserver` where llmserve looks; the details list each place and why it did not fit."""

    code = "triton-not-found"
    default_hint = (
        f"Run in an NVIDIA Triton image, put `tritonserver` on PATH, set LLMSERVE_TRITONSERVER, or {TRITON_ENV_HINT}."
    )


class TritonPythonEnvError(IncompatibleError):
    """The Python environment Triton's Python-backend models would run in cannot run them."""

    code = "triton-python-env"
    default_hint = f"Use the environment llmserve builds for Triton: {TRITON_ENV_HINT}."


class TritonStartError(EngineError):
    """`tritonserver` exited or did not become ready; the details hold the log lines that matter."""

    code = "triton-start"


class TritonModelLoadError(EngineError):
    """Triton could not load a model; the message names it, the details hold Triton's log lines about it."""

    code = "triton-model-load"
