"""The OpenAI-compatible HTTP frontend: FastAPI app behind the guards, served by uvicorn."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket

from llmserve.serve.errors import StartupError
from llmserve.serve.http_guards import Guards
from llmserve.serve.metrics import ServerMetrics
from llmserve.serve.readiness import Readiness

log = logging.getLogger("llmserve.serve")


class OpenAIFrontend:
    name = "openai"

    def __init__(self, host: str, port: int, *, api_key: str | None, max_body_bytes: int, max_prompt_chars: int,
                 metrics: ServerMetrics):
        self.host, self.port = host, port
        self._api_key = api_key
        self.max_body_bytes, self.max_prompt_chars = max_body_bytes, max_prompt_chars
        self.metrics = metrics
        self._server = None
        self._task: asyncio.Task | None = None

    @property
    def address(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def start(self, readiness: Readiness) -> None:
        import uvicorn

        from llmserve.serve.openai.app import build_app

        app = build_app(readiness, max_prompt_chars=self.max_prompt_chars, metrics=self.metrics.exposition,
                        on_request=self.metrics.observe)
        guarded = Guards(app, api_key=self._api_key, max_body_bytes=self.max_body_bytes)
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self.host, self.port))
        except OSError as exc:
            sock.close()
            raise StartupError(f"cannot listen on {self.host}:{self.port}: {exc.strerror}",
                               hint="Choose another --port, or stop the process that holds this one.") from exc
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(guarded, log_level="warning", access_log=False, lifespan="off",
                                timeout_keep_alive=5, timeout_graceful_shutdown=None)
        server = _NoSignalServer(config)
        self._server = server
        self._task = asyncio.create_task(server.serve(sockets=[sock]), name="openai-frontend")
        while not server.started:
            if self._task.done():
                self._task.result()
                raise StartupError("the OpenAI HTTP frontend stopped while starting")
            await asyncio.sleep(0.01)

    async def drain(self, timeout_s: float) -> None:
        if self._server is None or self._task is None:
            return
        self._server.config.timeout_graceful_shutdown = timeout_s
        self._server.should_exit = True
        try:
            await asyncio.wait_for(asyncio.shield(self._task), timeout_s + 5)
        except asyncio.TimeoutError:
            log.warning("openai frontend: in-flight requests still open after %.0f s; closing them", timeout_s)
            self._server.force_exit = True
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task


class _NoSignalServer:
    """uvicorn.Server without its own signal handlers: the server process owns SIGTERM/SIGINT."""

    def __new__(cls, config):
        import uvicorn

        class Server(uvicorn.Server):
            @contextlib.contextmanager
            def capture_signals(self):
                yield

        return Server(config)
