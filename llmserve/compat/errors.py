"""Errors of the compat layer: subclasses of the tool's one hierarchy (llmserve.errors)."""

from __future__ import annotations

from llmserve.errors import IncompatibleError, InvalidInputError, NotFoundError


class LockFileError(InvalidInputError):
    """llmserve.lock is missing a key, has a wrong value, or is not YAML."""

    code = "invalid-lock"
    default_hint = (
        "Regenerate it: `llmserve lock --target <target> --upgrade` (the lock is written by the tool, not by hand)."
    )


class UnknownTargetError(NotFoundError):
    code = "unknown-target"


class LockChangeError(IncompatibleError):
    """Resolving again would move a pinned version, and --upgrade was not given."""

    code = "lock-would-change"


class VllmSourceError(NotFoundError):
    """The vLLM distribution to read the import surface from is not there (wheel path, installed dist)."""

    code = "vllm-not-found"


class LockNotFoundError(NotFoundError):
    code = "lock-not-found"
    default_hint = "Create one: `llmserve lock --target local-cpu` (or a Triton line, e.g. --target triton-26.02)."
