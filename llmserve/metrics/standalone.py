"""A merged /metrics endpoint on its own port, in front of a Triton that runs without `llmserve serve`.

A threading HTTP server from the standard library: each scrape runs on its own thread, so a slow source delays
only that scrape (and no longer than the source's timeout). GET /metrics is the merged page, GET /health says the
endpoint is up; everything else is 404.
"""

from __future__ import annotations

import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from llmserve.metrics.merge import MergedMetrics

log = logging.getLogger("llmserve.metrics")


class MetricsEndpoint:
    """`with MetricsEndpoint(merged, port=9400) as ep: ...` serves in a background thread; `serve_forever()` in
    the calling one. Port 0 picks a free port (`ep.port` tells which)."""

    def __init__(self, merged: MergedMetrics, *, host: str = "127.0.0.1", port: int = 9400):
        self.merged = merged
        handler = _handler(merged)
        self._server = ThreadingHTTPServer((host, port), handler)
        self._server.daemon_threads = True
        self.host, self.port = host, int(self._server.server_address[1])
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/metrics"

    def serve_forever(self) -> None:
        self._server.serve_forever(poll_interval=0.2)

    def start(self) -> MetricsEndpoint:
        self._thread = threading.Thread(target=self.serve_forever, name="llmserve-metrics-endpoint", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self.merged.close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> MetricsEndpoint:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _handler(merged: MergedMetrics) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "llmserve-metrics"

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                body, content_type = merged.render(self.headers.get("Accept"))
                self._answer(200, body, content_type)
            elif path == "/health":
                self._answer(200, b'{"status": "ready"}', "application/json")
            else:
                self._answer(404, b"not found: GET /metrics or /health\n", "text/plain; charset=utf-8")

        def _answer(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            log.debug("%s %s", self.address_string(), format % args)

    return Handler
