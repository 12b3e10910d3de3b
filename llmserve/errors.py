"""One error hierarchy for the whole tool.

Every error carries a one-line message (what went wrong) and a hint (what to do next, usually a
command). The CLI renders both and exits with the error's exit code; tracebacks are shown only
with LLMSERVE_DEBUG=1. Exit codes are part of the public interface (see README, "Exit codes").
"""

from __future__ import annotations

from dataclasses import dataclass, field


class ExitCode:
    OK = 0
    INTERNAL = 1  # a bug: please report it with LLMSERVE_DEBUG=1 output
    USAGE = 2  # bad command line (Typer/Click's own code)
    INVALID_INPUT = 3  # a file the user wrote is malformed or inconsistent
    INTEGRITY = 4  # an artifact is corrupted, tampered with or hostile
    NOT_FOUND = 5  # a path, model or version that does not exist
    INCOMPATIBLE = 6  # versions or interfaces that do not fit together
    ENGINE = 7  # the engine or a server failed to start or to answer
    UNAVAILABLE = 8  # a store or service could not be reached


@dataclass
class Detail:
    """Extra structured context rendered under the message (e.g. a side-by-side table)."""

    title: str
    columns: list[str]
    rows: list[list[str]] = field(default_factory=list)


class LLMServeError(Exception):
    """Base of every error the tool raises on purpose."""

    code = "llmserve-error"
    exit_code = ExitCode.INTERNAL
    default_hint: str | None = None

    def __init__(self, message: str, hint: str | None = None, *, details: list[Detail] | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint if hint is not None else self.default_hint
        self.details = details or []

    def to_dict(self) -> dict:
        return {
            "error": self.code,
            "message": self.message,
            "hint": self.hint,
            "exit_code": self.exit_code,
            "details": [d.__dict__ for d in self.details],
        }


class InvalidInputError(LLMServeError):
    code = "invalid-input"
    exit_code = ExitCode.INVALID_INPUT


class ManifestError(InvalidInputError):
    code = "invalid-manifest"
    default_hint = "Fix the file and run the command again; `llmserve schema` prints the manifest's JSON Schema."


class SpecMismatchError(InvalidInputError):
    code = "tensor-spec-mismatch"


class IntegrityError(LLMServeError):
    code = "integrity"
    exit_code = ExitCode.INTEGRITY
    default_hint = "Do not use this file; rebuild it with `llmserve package` or fetch it again."


class UnsafeArchiveError(IntegrityError):
    code = "unsafe-archive"


class CacheEntryError(IntegrityError):
    """An unpacked package in the local cache no longer matches the package and cannot be rebuilt."""

    code = "cache-entry"
    default_hint = (
        "Remove the named folder (or point LLMSERVE_CACHE at a folder only you can write) and run the command again."
    )


class UntrustedCodeError(IntegrityError):
    """A package asks the engine to run code it ships; serving it is the operator's decision."""

    code = "untrusted-code"
    default_hint = "Review the package's code, then serve it with `llmserve serve PKG --trust-remote-code`."


class NotFoundError(LLMServeError):
    code = "not-found"
    exit_code = ExitCode.NOT_FOUND


class IncompatibleError(LLMServeError):
    code = "incompatible"
    exit_code = ExitCode.INCOMPATIBLE


class EngineVersionOverrideError(IncompatibleError):
    code = "engine-version-override"
    default_hint = (
        "Remove the engine version from llmserve.yaml; the engine is pinned by the deployment's lock "
        "(requirements/cpu-stack.lock.txt for the local CPU stack)."
    )


class EngineError(LLMServeError):
    code = "engine"
    exit_code = ExitCode.ENGINE


class UnavailableError(LLMServeError):
    code = "unavailable"
    exit_code = ExitCode.UNAVAILABLE


# Third-party modules that come from an optional extra (pyproject.toml, [project.optional-dependencies]),
# by import name (a dotted key matches that module and its submodules). Everything else llmserve imports
# is a base dependency or the standard library.
MODULE_EXTRAS: dict[str, str] = {
    # `llmserve serve`: engine, frontends, metrics, constraint processor
    "vllm": "serve",
    "torch": "serve",
    "transformers": "serve",
    "numpy": "serve",
    "fastapi": "serve",
    "starlette": "serve",
    "uvicorn": "serve",
    "prometheus_client": "serve",
    "jsonschema": "serve",
    "grpc": "serve",
    "google.protobuf": "serve",
    "tritonclient": "serve",
    # `llmserve deploy | status | rollback`
    "httpx": "deploy",
    "aiohttp": "deploy",
    "yarl": "deploy",
    # `llmserve push | pull` and s3:// package references
    "boto3": "store",
    "botocore": "store",
    # `--target kubernetes`
    "kubernetes": "kubernetes",
    "urllib3": "kubernetes",
    # `llmserve build`: the Docker Engine API client
    "docker": "build",
}


class MissingExtraError(IncompatibleError):
    """A command needs a module from an optional extra that is not installed."""

    code = "missing-extra"

    def __init__(self, module: str, extra: str):
        super().__init__(
            f"this command needs the '{module}' module, which comes with llmserve's '{extra}' extra",
            f"Install the {extra} extra: pip install 'llmserve[{extra}]'",
        )
        self.module = module
        self.extra = extra


def extra_module(name: str) -> str | None:
    """The MODULE_EXTRAS key that module `name` belongs to (itself or a parent package), or None."""
    parts = name.split(".")
    return next((k for n in range(len(parts), 0, -1) if (k := ".".join(parts[:n])) in MODULE_EXTRAS), None)


def missing_extra(exc: BaseException) -> MissingExtraError | None:
    """MissingExtraError if exc, or an exception it was raised from, is a ModuleNotFoundError for a
    module of an extra and that module is absent; None otherwise (a submodule missing from an
    installed package is version drift, not a missing extra)."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, ModuleNotFoundError) and cur.name:
            module = extra_module(cur.name)
            if module is not None and not _installed(module):
                return MissingExtraError(module, MODULE_EXTRAS[module])
        cur = cur.__cause__ or cur.__context__
    return None


def _installed(module: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a missing parent package: find_spec("google.protobuf") without google
        return False
