"""The server's own Prometheus metrics, merged with vLLM's in one /metrics exposition.

prometheus_client runs in multiprocess mode (PROMETHEUS_MULTIPROC_DIR is set and wiped by the
startup sequence before anything imports it), so everything recorded in this process is read back
from that folder by a MultiProcessCollector: vLLM's `vllm:*` series and the `llmserve_*` ones below.
"""

from __future__ import annotations

from typing import Any


class ServerMetrics:
    def __init__(self) -> None:
        from prometheus_client import Counter, Gauge, Histogram

        self.requests = Counter(
            "llmserve_requests",
            "Requests answered, by endpoint and status (HTTP status, or gRPC status code name)",
            ["endpoint", "status"],
        )
        self.latency = Histogram(
            "llmserve_request_seconds",
            "Time to answer (to first byte for streams), by endpoint",
            ["endpoint"],
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
        )
        self.startup = Gauge(
            "llmserve_startup_step_seconds", "Duration of each startup step", ["step"], multiprocess_mode="mostrecent"
        )
        self.ready = Gauge(
            "llmserve_ready", "1 when the server accepts inference requests", multiprocess_mode="mostrecent"
        )

    def observe(self, endpoint: str, status: int | str, seconds: float) -> None:
        """One answered request: status is the HTTP status (200, 400, ...) or the gRPC code name (OK, ...)."""
        self.requests.labels(endpoint, str(status)).inc()
        self.latency.labels(endpoint).observe(seconds)

    @staticmethod
    def exposition() -> tuple[bytes, str]:
        from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest, multiprocess

        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        return generate_latest(registry), CONTENT_TYPE_LATEST


def record_steps(metrics: ServerMetrics, steps: list[tuple[str, float]]) -> Any:
    for name, seconds in steps:
        metrics.startup.labels(name).set(seconds)
