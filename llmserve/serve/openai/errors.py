"""OpenAI's error shape: {"error": {"message", "type", "param", "code"}}."""

from __future__ import annotations

from typing import Any

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    413: "invalid_request_error",
    503: "service_unavailable",
    500: "server_error",
}


class RequestRejected(Exception):
    """A request this server will not run; rendered as an OpenAI error response."""

    def __init__(
        self, message: str, *, param: str | None = None, code: str | None = "invalid_value", status: int = 400
    ):
        super().__init__(message)
        self.message, self.param, self.code, self.status = message, param, code, status

    def body(self) -> dict[str, Any]:
        return error_body(self.status, self.message, self.param, self.code)


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    return {
        "error": {
            "message": message,
            "type": _TYPES.get(status, "invalid_request_error" if status < 500 else "server_error"),
            "param": param,
            "code": code,
        }
    }
