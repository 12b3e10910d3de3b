"""ASGI guards in front of every HTTP frontend: API key and request-body size.

The API key is compared with hmac.compare_digest (constant time) and never logged. It is required
on every route but /health. A body over the limit gets 413 before the route runs: a declared
Content-Length is checked up front, and a chunked body is counted as it arrives (and held, at most
the limit, until the route reads it). KServe v2 routes also bound a gzip/deflate body by its
decompressed size (llmserve/serve/limits.py: inflate).
"""

from __future__ import annotations

import hmac
import json
import re
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from llmserve.serve.openai.errors import error_body

# Health probes stay open when an API key is set (load balancers and Kubernetes probe without one), a model's
# readiness among them (gRPC's ModelReady is open too).
OPEN_PATHS = frozenset({"/health", "/v2/health/live", "/v2/health/ready"})
_MODEL_READY = re.compile(r"^/v2/models/[^/]+(?:/versions/[^/]+)?/ready$")


def _open(path: str, method: str) -> bool:
    return path in OPEN_PATHS or (method == "GET" and _MODEL_READY.match(path) is not None)


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
        if self._key is not None and not _open(scope.get("path", ""), scope.get("method", "")):
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
        messages = await self._read_body(receive)
        if messages is None:
            await self._too_large(send, scope.get("path", ""))
            return

        async def replay() -> Message:
            if messages:
                return messages.pop(0)
            return await receive()  # after the body: http.disconnect, which the routes watch for

        await self.app(scope, replay, send)

    async def _read_body(self, receive: Receive) -> list[Message] | None:
        """The request's body messages (merged into one), or None once it is over the limit.

        The whole body is read here, counted as it arrives, before the route runs: a chunked body
        (no Content-Length) over the limit then gets its 413 from here. Raising from inside the
        app's receive instead reached the app's own error handling first, which answered 500.
        Buffering costs nothing extra: every route reads the whole body anyway, and at most
        max_body_bytes of it are held."""
        chunks: list[bytes] = []
        tail: list[Message] = []
        seen = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                tail.append(message)  # http.disconnect: the route sees it in turn
                break
            chunks.append(message.get("body", b""))
            seen += len(chunks[-1])
            if seen > self.max_body_bytes:
                return None
            if not message.get("more_body", False):
                break
        return [{"type": "http.request", "body": b"".join(chunks), "more_body": False}, *tail]

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
