"""The server's own Prometheus metrics, and the one /metrics exposition merged from every source.

prometheus_client runs in multiprocess mode (PROMETHEUS_MULTIPROC_DIR is set and wiped by the
startup sequence before anything imports it), so everything recorded in this process is read back
from that folder by a MultiProcessCollector: vLLM's `vllm:*` series and the `llmserve_*` ones below.
That folder is the first source of `merged` (llmserve.metrics.MergedMetrics); an engine that runs
elsewhere adds its own source after it, e.g. `metrics.merged.add(TritonScrape(url, timeout=2.0))`,
before the frontends serve. Every gauge declares its multiprocess mode.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from llmserve.metrics import MergedMetrics, Multiprocess


class ServerMetrics:
    def __init__(self, folder: Path | None = None) -> None:
        from prometheus_client import Counter, Gauge, Histogram

        folder = folder or Path(os.environ["PROMETHEUS_MULTIPROC_DIR"])
        self.merged = MergedMetrics([Multiprocess(folder, name="multiprocess")])

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
        # livemostrecent: a server process that died stops claiming readiness once it is marked dead
        self.ready = Gauge(
            "llmserve_ready", "1 when the server accepts inference requests", multiprocess_mode="livemostrecent"
        )

    def observe(self, endpoint: str, status: int | str, seconds: float) -> None:
        """One answered request: status is the HTTP status (200, 400, ...) or the gRPC code name (OK, ...)."""
        self.requests.labels(endpoint, str(status)).inc()
        self.latency.labels(endpoint).observe(seconds)

    def exposition(self, accept: str | None = None) -> tuple[bytes, str]:
        """The merged page, in the format the scraper's Accept header asks for (blocking: call off the loop)."""
        return self.merged.render(accept)


def record_steps(metrics: ServerMetrics, steps: list[tuple[str, float]]) -> Any:
    for name, seconds in steps:
        metrics.startup.labels(name).set(seconds)
