"""Triton Inference Server as the model host: find a `tritonserver` (`locate_tritonserver`), run it on a model
repository (`TritonServer`), and the errors of both (`llmserve.serve.triton.errors`).

Importing this package imports neither tritonclient nor anything from the Triton environment.
"""

from llmserve.serve.triton.errors import (
    TritonModelLoadError,
    TritonNotFoundError,
    TritonPythonEnvError,
    TritonStartError,
)
from llmserve.serve.triton.locate import (
    BINARY_ENV,
    PYTHON_ENV_ENV,
    PythonEnv,
    TritonInstall,
    locate_tritonserver,
)
from llmserve.serve.triton.server import TritonPorts, TritonServer

__all__ = [
    "BINARY_ENV",
    "PYTHON_ENV_ENV",
    "PythonEnv",
    "TritonInstall",
    "TritonModelLoadError",
    "TritonNotFoundError",
    "TritonPorts",
    "TritonPythonEnvError",
    "TritonServer",
    "TritonStartError",
    "locate_tritonserver",
]
