"""ASGI guards in front of every HTTP frontend: API key and request-body size.

The API key is compared with hmac.compare_digest (constant time) and never logged. It is required
on every route but /health. A body over the limit gets 413 before the route reads it: a declared
Content-Length is checked up front and chunked bodies are counted as they arrive.
"""

from __future__ import annotations

import hmac
import json
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from llmserve.serve.openai.errors import error_body

# Health probes stay open when an API key is set (load balancers and Kubernetes probe without one).
OPEN_PATHS = frozenset({"/health", "/v2/health/live", "/v2/health/ready"})


class BodyTooLarge(Exception):
    pass


async def _send_json(
    send: Send, status: int, body: dict[str, Any], headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    data = json.dumps(body).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(data)).encode()),
                *(headers or []),
            ],
        }
    )
    await send({"type": "http.response.body", "body": data})


def _guard_error(path: str, status: int, message: str, code: str) -> dict[str, Any]:
    # Each protocol's clients parse their own error shape: KServe v2 (tritonclient) expects
    # {"error": "<message>"}, OpenAI clients {"error": {"message": ..., "type": ..., "code": ...}}.
    if path == "/v2" or path.startswith("/v2/"):
        return {"error": message}
    return error_body(status, message, None, code)


def _presented_key(headers: dict[bytes, bytes]) -> bytes | None:
    auth = headers.get(b"authorization")
    if auth and auth[:7].lower() == b"bearer ":
        return auth[7:].strip()
    return headers.get(b"x-api-key")


class Guards:
    def __init__(self, app: ASGIApp, *, api_key: str | None, max_body_bytes: int):
        self.app = app
        self._key = api_key.encode() if api_key else None
        self.max_body_bytes = max_body_bytes

    def __repr__(self) -> str:  # never show the key
        return f"Guards(api_key={'set' if self._key else 'unset'}, max_body_bytes={self.max_body_bytes})"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        if self._key is not None and scope.get("path") not in OPEN_PATHS:
            presented = _presented_key(headers)
            if presented is None or not hmac.compare_digest(presented, self._key):
                await _send_json(
                    send,
                    401,
                    _guard_error(
                        scope.get("path", ""),
                        401,
                        "missing or invalid API key: send 'Authorization: Bearer <key>'",
                        "invalid_api_key",
                    ),
                    [(b"www-authenticate", b"Bearer")],
                )
                return
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body_bytes:
            await self._too_large(send, scope.get("path", ""))
            return
        seen = 0
        started = False

        async def counted_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_body_bytes:
                    raise BodyTooLarge()
            return message

        async def tracked_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, counted_receive, tracked_send)
        except BodyTooLarge:
            if not started:
                await self._too_large(send, scope.get("path", ""))

    async def _too_large(self, send: Send, path: str) -> None:
        await _send_json(
            send,
            413,
            _guard_error(
                path,
                413,
                f"the request body exceeds this server's limit of {self.max_body_bytes} bytes (--max-body-bytes)",
                "request_too_large",
            ),
        )
