"""Stop working for an HTTP client that has gone.

A non-streaming answer is computed before anything is sent, so nothing notices a client that
disconnects meanwhile: the engine would generate the whole answer for nobody. `unless_disconnected`
races the work against the request's `http.disconnect` and cancels it, which aborts the request in
the engine (vLLM's generators abort on cancellation). Streaming answers need none of this: their
response stops reading the generator when the client goes.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import Any

from starlette.requests import Request

CLIENT_CLOSED = 499  # nginx's status for "client closed request": what the metrics record


class ClientDisconnected(Exception):
    pass


async def unless_disconnected(request: Request, work: Awaitable[Any]) -> Any:
    """Await ``work`` unless the client disconnects first; then cancel it and raise ClientDisconnected.

    Call it only after the request body has been read: the watcher consumes the request's remaining
    ASGI messages."""

    async def disconnect() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(disconnect())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone = watcher.done() and not watcher.cancelled() and watcher.exception() is None
        watcher.cancel()
        if not task.done():
            task.cancel()
            # the cancelled call may turn the cancellation into an error result; either way the
            # engine request is aborted and the answer is for nobody
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
    if gone:
        raise ClientDisconnected()
    return task.result()
