"""An HTTP frontend served by uvicorn on a socket we bind ourselves.

Shared by the OpenAI and the standalone KServe v2 HTTP frontends: binding first gives a clear
error for a taken port (and the real port for --port 0); uvicorn's own signal handlers are
disabled because the server process owns SIGTERM/SIGINT; draining is uvicorn's graceful
shutdown bounded by the drain timeout.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import logging
import socket
from collections.abc import Iterator
from typing import Any

import uvicorn

from llmserve.serve.errors import StartupError

log = logging.getLogger("llmserve.serve")


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:  # the server process owns SIGTERM/SIGINT
        yield


class UvicornFrontend(abc.ABC):
    name = "http"
    port_flag = "--port"

    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
        self._server: _Server | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def address(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @abc.abstractmethod
    def build(self, readiness: Any) -> Any:
        """The ASGI app to serve (with its guards)."""

    async def start(self, readiness: Any) -> None:
        app = self.build(readiness)
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self.host, self.port))
        except OSError as exc:
            sock.close()
            raise StartupError(
                f"cannot listen on {self.host}:{self.port}: {exc.strerror}",
                hint=f"Choose another {self.port_flag}, or stop the process that holds this one.",
            ) from exc
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(
            app,
            log_level="warning",
            access_log=False,
            lifespan="off",
            timeout_keep_alive=5,
            timeout_graceful_shutdown=None,
        )
        server = _Server(config)
        self._server = server
        self._task = asyncio.create_task(server.serve(sockets=[sock]), name=f"{self.name}-frontend")
        while not server.started:
            if self._task.done():
                self._task.result()
                raise StartupError(f"the {self.name} frontend stopped while starting")
            await asyncio.sleep(0.01)

    async def drain(self, timeout_s: float) -> None:
        if self._server is None or self._task is None:
            return
        self._server.config.timeout_graceful_shutdown = timeout_s
        self._server.should_exit = True
        try:
            await asyncio.wait_for(asyncio.shield(self._task), timeout_s + 5)
        except TimeoutError:
            log.warning("%s frontend: in-flight requests still open after %.0f s; closing them", self.name, timeout_s)
            self._server.force_exit = True
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task
