"""One error type for both KServe v2 transports: a kind that maps to a gRPC status and an HTTP status.

The message is what the client reads; it names the offending tensor, parameter or key and what is
accepted instead. It never carries an exception's own text (that is logged): a message built from
one could show files, paths or internals of the server. The HTTP body is the KServe v2 error object: {"error": "<message>"}.
"""

from __future__ import annotations

from typing import Any

INVALID = "invalid"
NOT_FOUND = "not-found"
UNAVAILABLE = "unavailable"
UNIMPLEMENTED = "unimplemented"
UNAUTHENTICATED = "unauthenticated"
INTERNAL = "internal"
TOO_LARGE = "too-large"

HTTP_STATUS = {
    INVALID: 400,
    NOT_FOUND: 404,
    UNAVAILABLE: 503,
    UNIMPLEMENTED: 501,
    UNAUTHENTICATED: 401,
    INTERNAL: 500,
    TOO_LARGE: 413,
}
GRPC_STATUS_NAME = {
    INVALID: "INVALID_ARGUMENT",
    NOT_FOUND: "NOT_FOUND",
    UNAVAILABLE: "UNAVAILABLE",
    UNIMPLEMENTED: "UNIMPLEMENTED",
    UNAUTHENTICATED: "UNAUTHENTICATED",
    INTERNAL: "INTERNAL",
    TOO_LARGE: "RESOURCE_EXHAUSTED",
}


class KServeError(Exception):
    """A request the KServe v2 frontends refuse or could not serve."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind
        self.message = message

    @property
    def http_status(self) -> int:
        return HTTP_STATUS[self.kind]

    @property
    def grpc_status(self) -> Any:
        import grpc  # deferred: the HTTP routes use this module too, and only the gRPC transport needs grpc

        return getattr(grpc.StatusCode, GRPC_STATUS_NAME[self.kind])

    def body(self) -> dict:
        return {"error": self.message}


def invalid(message: str) -> KServeError:
    return KServeError(INVALID, message)


def too_large(limit: int) -> KServeError:
    return KServeError(
        TOO_LARGE,
        f"the request body exceeds this server's limit of {limit} bytes once decompressed (--max-body-bytes)",
    )


def internal(what: str) -> KServeError:
    """A failure of the server's own: the message says what failed, never the exception's text
    (it can name files and internals); the caller logs the exception."""
    return KServeError(INTERNAL, f"{what} failed on the server; its log has the details")


def not_found(message: str) -> KServeError:
    return KServeError(NOT_FOUND, message)


NOT_READY_MESSAGE = "the server is not ready: the engine is starting or the server is draining; retry later"


def not_ready() -> KServeError:
    return KServeError(UNAVAILABLE, NOT_READY_MESSAGE)
