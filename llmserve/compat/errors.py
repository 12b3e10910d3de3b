"""Errors of the compat layer: subclasses of the tool's one hierarchy (llmserve.errors)."""

from __future__ import annotations

from llmserve.errors import IncompatibleError, NotFoundError

# The lock's own errors live with the lock format; re-exported here for the compat layer's callers.
from llmserve.formats.lock import LockFileError, LockNotFoundError


class UnknownTargetError(NotFoundError):
    code = "unknown-target"


class LockChangeError(IncompatibleError):
    """Resolving again would move a pinned version, and --upgrade was not given."""

    code = "lock-would-change"


class VllmSourceError(NotFoundError):
    """The vLLM distribution to read the import surface from is not there (wheel path, installed dist)."""

    code = "vllm-not-found"


__all__ = ["LockChangeError", "LockFileError", "LockNotFoundError", "UnknownTargetError", "VllmSourceError"]
