"""Errors of `llmserve deploy`, `status` and `rollback`: subclasses of the tool's one hierarchy."""

from __future__ import annotations

from llmserve.errors import (
    EngineError,
    ExitCode,
    IncompatibleError,
    IntegrityError,
    InvalidInputError,
    LLMServeError,
    NotFoundError,
    UnavailableError,
)


class InterfaceChangedError(IncompatibleError):
    code = "interface-changed"
    default_hint = (
        "Deploy it side by side with `llmserve deploy PKG --strategy versioned`; callers then choose "
        'the version (model "<id>:<version>" or the X-Model-Version header).'
    )


class DeploymentNotFoundError(NotFoundError):
    code = "deployment-not-found"
    default_hint = "List deployments with `llmserve status`."


class DeploymentBusyError(LLMServeError):
    code = "deployment-busy"
    exit_code = ExitCode.UNAVAILABLE
    default_hint = (
        "Another `llmserve deploy`/`rollback` holds this deployment; wait for it, or check `llmserve status`."
    )


class HealthCheckFailedError(EngineError):
    code = "health-check-failed"


class RolloutFailedError(EngineError):
    code = "rollout-failed"


class GatewayError(UnavailableError):
    code = "gateway-unavailable"


class DeployInputError(InvalidInputError):
    code = "invalid-deploy-input"


class StateUnreadableError(IntegrityError):
    """The state database is damaged: SQLite cannot read it."""

    code = "deploy-state-unreadable"
