"""A frontend: one protocol surface (OpenAI HTTP, KServe v2 HTTP/gRPC) over the shared engine.

Frontends are started before the engine so their health endpoints answer truthfully (not ready)
while it loads; they refuse inference traffic until `Readiness` says ready. On shutdown each one
stops accepting connections and drains its in-flight requests within the given timeout.
"""

from __future__ import annotations

from typing import Protocol

from llmserve.serve.readiness import Readiness


class Frontend(Protocol):
    name: str

    async def start(self, readiness: Readiness) -> None:
        """Bind the listening sockets and serve (inference refused until readiness says ready)."""

    async def drain(self, timeout_s: float) -> None:
        """Stop accepting; wait for in-flight requests to finish, at most timeout_s; then close."""

    @property
    def address(self) -> str:
        """Where clients connect, e.g. http://127.0.0.1:8000."""
