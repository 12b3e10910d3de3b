"""The server's lifecycle state, shared by every frontend: starting -> ready -> draining -> stopped.

It is also the one gate on inference: every protocol asks `engine_for_inference()` and turns
`NotReady` into its own error shape (OpenAI 503 not_ready, KServe UNAVAILABLE / 503).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class NotReady(Exception):
    """Inference refused: the engine is starting or has failed, or the server is draining."""


@dataclass
class Readiness:
    phase: str = "starting"
    handle: Any = None  # EngineHandle once the engine is up

    def set_ready(self, handle: Any) -> None:
        self.handle = handle
        self.phase = "ready"

    def set_draining(self) -> None:
        if self.phase != "stopped":
            self.phase = "draining"

    @property
    def accepting(self) -> bool:
        """Whether new inference requests are taken (only once the engine is up, never while draining)."""
        return self.phase == "ready" and self.handle is not None

    def status(self) -> tuple[str, bool]:
        if self.phase == "ready" and self.handle is not None and not self.handle.healthy:
            return "engine-error", False
        return self.phase, self.accepting

    def engine_for_inference(self) -> Any:
        """The EngineHandle an inference request runs on; NotReady unless `accepting`."""
        if not self.accepting:
            raise NotReady()
        return self.handle
