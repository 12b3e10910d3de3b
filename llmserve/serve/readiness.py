"""The server's lifecycle state, shared by every frontend: starting -> ready -> draining -> stopped."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


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
