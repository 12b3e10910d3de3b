"""Errors of `llmserve build`: each names the step that failed and what to do next."""

from __future__ import annotations

from llmserve.errors import EngineError, IncompatibleError, InvalidInputError, NotFoundError, UnavailableError

DEFAULT_SOCKET = "unix:///var/run/docker.sock"


class BuildInputError(InvalidInputError):
    """The package, lock, wheelhouse or context folder cannot make a build context."""

    code = "build-input"


class CompatCheckFailedError(IncompatibleError):
    """check-compat, run on the rendered context, found a misfit: the image is not built."""

    code = "build-check-compat"
    default_hint = (
        "Fix what the table says, then build again (`llmserve build --vllm WHEEL` gives the vLLM to check "
        "against); `llmserve check-compat --package PKG` shows the same."
    )


class EngineUnreachableError(UnavailableError):
    """No Docker Engine API answers at DOCKER_HOST (or the default socket)."""

    code = "build-no-engine"
    default_hint = (
        "Start an engine that speaks the Docker API and point DOCKER_HOST at it, e.g. "
        "`podman system service --time=0 unix:///run/podman/podman.sock &` then "
        "`export DOCKER_HOST=unix:///run/podman/podman.sock` (or a running Docker daemon)."
    )


class UnknownBaseError(NotFoundError):
    """The base image is neither in the engine nor pullable."""

    code = "build-unknown-base"


class BuildStepError(EngineError):
    """A Dockerfile step (usually a RUN) failed; the message carries its last log lines."""

    code = "build-step-failed"


class PushRefusedError(UnavailableError):
    """The registry refused the push (or could not be reached)."""

    code = "build-push-refused"
