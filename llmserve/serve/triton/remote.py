"""A Triton llmserve did not start (`llmserve serve PKG --openai --triton-url HOST:PORT`): llmserve's frontends attach
to it. It answers what the host loop asks of a TritonServer it started: where it listens, whether the models are
ready; it has no process of llmserve's to stop, and no log here."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from llmserve.serve.triton.errors import TritonStartError

_POLL_S = 0.5


class RemoteTriton:
    def __init__(self, grpc_url: str, http_url: str | None, models: Sequence[str], *, ready_timeout: float):
        self.grpc_url = grpc_url
        self.http_url = http_url
        self.metrics_url: str | None = None  # not known: Triton's metrics port is its own setting
        self.models = list(models)
        self.ready_timeout = ready_timeout
        self.log_path = f"the log of the Triton at {grpc_url}"

    def _client(self) -> Any:
        import tritonclient.grpc as grpcclient

        return grpcclient.InferenceServerClient(self.grpc_url)

    def start(self) -> RemoteTriton:
        """Wait until every model is READY there; TritonStartError naming those that are not, at the timeout."""
        deadline = time.monotonic() + self.ready_timeout
        while True:
            waiting = [m for m in self.models if not self.is_model_ready(m)]
            if not waiting:
                return self
            if time.monotonic() > deadline:
                raise TritonStartError(
                    f"the Triton at {self.grpc_url} did not have {', '.join(waiting)} READY within "
                    f"{self.ready_timeout:.0f} s",
                    hint="Check that Triton runs there (gRPC port) and has loaded these models "
                    "(the modelId of each package given), then serve again.",
                )
            time.sleep(_POLL_S)

    def is_model_ready(self, name: str) -> bool:
        from tritonclient.utils import InferenceServerException

        client = self._client()
        try:
            return bool(client.is_model_ready(name))
        except (InferenceServerException, OSError, ConnectionError):
            return False
        finally:
            client.close()

    def exit_code(self) -> int | None:
        return None  # not a process of llmserve's

    def stop(self, grace: float | None = None, unload_s: float | None = None) -> None:
        """Nothing to stop: the Triton is not llmserve's (the same call as TritonServer.stop)."""
