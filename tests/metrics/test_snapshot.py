"""llmserve.metrics.snapshot (the figures `llmserve status` shows) against real HTTP servers on loopback: one whose
counters move, one that wants a key, one that never answers, an address where nothing listens; and the bound on
how long a merged /metrics waits for a Triton endpoint that never answers (--timeout 0.2)."""

from __future__ import annotations

import http.server
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator

import pytest
from real_sources import families
from support.cli import cli_argv, cli_env

from llmserve.metrics import MergedMetrics, Multiprocess, TritonScrape
from llmserve.metrics.snapshot import FIGURES, auth_headers, snapshot, snapshots

KEY = "snapshot-test-key"


class _Page(http.server.BaseHTTPRequestHandler):
    """A vLLM-like metrics page: every GET adds 10 prompt and 25 generation tokens and two TTFT observations."""

    hits = 0
    key: str | None = None

    def do_GET(self) -> None:
        if self.path != "/metrics":
            self.send_error(404)
            return
        if self.key and self.headers.get("Authorization") != f"Bearer {self.key}":
            self.send_response(401)
            self.end_headers()
            return
        type(self).hits += 1
        n = type(self).hits
        body = (
            "# TYPE vllm:prompt_tokens_total counter\n"
            f'vllm:prompt_tokens_total{{engine="0"}} {10 * n}\n'
            "# TYPE vllm:generation_tokens_total counter\n"
            f'vllm:generation_tokens_total{{engine="0"}} {25 * n}\n'
            "# TYPE vllm:num_requests_running gauge\n"
            'vllm:num_requests_running{engine="0"} 2\n'
            "# TYPE vllm:num_requests_waiting gauge\n"
            'vllm:num_requests_waiting{engine="0"} 1\n'
            "# TYPE vllm:kv_cache_usage_perc gauge\n"
            'vllm:kv_cache_usage_perc{engine="0"} 0.25\n'
            "# TYPE vllm:time_to_first_token_seconds histogram\n"
            f'vllm:time_to_first_token_seconds_bucket{{le="0.1"}} {2 * n}\n'
            f'vllm:time_to_first_token_seconds_bucket{{le="+Inf"}} {2 * n}\n'
            f"vllm:time_to_first_token_seconds_count {2 * n}\n"
            f"vllm:time_to_first_token_seconds_sum {0.1 * n}\n"
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def _serve(key: str | None) -> Iterator[str]:
    handler = type("Page", (_Page,), {"hits": 0, "key": key})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def page() -> Iterator[str]:
    yield from _serve(None)


@pytest.fixture
def keyed_page() -> Iterator[str]:
    yield from _serve(KEY)


def test_two_scrapes_give_rates_gauges_and_quantiles(page):
    m = snapshot(page, interval=0.3, timeout=5)
    assert m["error"] is None
    assert m["url"] == page + "/metrics"
    assert m["interval_s"] >= 0.3
    # one GET's worth of tokens in the window
    assert m["tokens_in_per_s"] == pytest.approx(10 / m["interval_s"], rel=0.01)
    assert m["tokens_out_per_s"] == pytest.approx(25 / m["interval_s"], rel=0.01)
    assert (m["requests_running"], m["requests_waiting"], m["kv_cache_usage"]) == (2, 1, 0.25)
    assert m["ttft_seconds"]["count"] == 2 and 0 < m["ttft_seconds"]["p50"] <= 0.1
    assert m["prefix_cache_hit_rate"] is None and m["tpot_seconds"] is None  # not on this page: unknown, not 0


def test_a_server_that_wants_a_key_is_reported_unauthorized_and_answers_with_it(keyed_page):
    m = snapshot(keyed_page, interval=0.1, timeout=5)
    assert m["error"].startswith("unauthorized: HTTP 401"), m["error"]
    assert "LLMSERVE_API_KEY" in m["error"]
    assert all(m[k] is None for k in FIGURES)
    wrong = snapshot(keyed_page, interval=0.1, timeout=5, headers=auth_headers("nope"))
    assert wrong["error"].startswith("unauthorized: HTTP 401") and "refused" in wrong["error"]
    assert snapshot(keyed_page, interval=0.1, timeout=5, headers=auth_headers(KEY))["error"] is None


def test_an_answer_that_is_not_a_metrics_page_is_a_failed_scrape_not_an_unreachable_server(page):
    m = snapshot(page + "/elsewhere", interval=0.1, timeout=5)
    assert m["error"] == f"scrape failed: HTTP 404 Not Found from {page}/elsewhere", m["error"]
    assert all(m[k] is None for k in FIGURES)


def test_servers_are_scraped_at_once_and_a_hung_or_dead_one_costs_its_timeout_only(page, silent_server, dead_address):
    t0 = time.monotonic()
    got = snapshots({"up": page, "hung": silent_server, "dead": dead_address}, interval=1.0, timeout=0.5)
    took = time.monotonic() - t0
    # in sequence it would be >= 1.0 (up) + 0.5 (hung); at once: the longest of them
    assert took < 1.0 + 0.45, took
    assert got["up"]["error"] is None and got["up"]["tokens_out_per_s"] > 0
    assert got["hung"]["error"] == "unreachable: timed out", got["hung"]
    assert got["dead"]["error"].startswith("unreachable: ") and "refused" in got["dead"]["error"], got["dead"]
    for key in ("hung", "dead"):
        assert set(got[key]) == {"url", "error", *FIGURES}
        assert all(got[key][k] is None for k in FIGURES)


def test_merged_metrics_with_a_triton_that_never_answers_serves_the_rest_within_its_timeout(writers, silent_server):
    """`llmserve serve --metrics-timeout 0.2` hands its timeout to this TritonScrape (serve/triton/host.py); a full
    `serve --engine triton` cannot be pointed at a silent metrics port (Triton's own port is scraped), so the bound
    is checked here, at the merger, and through the real `llmserve metrics serve --timeout 0.2` below."""
    writers.run("0")
    merged = MergedMetrics([Multiprocess(writers.folder), TritonScrape(silent_server, timeout=0.2)])
    try:
        for _ in range(3):  # a source still hanging from the last scrape does not make the next one wait longer
            t0 = time.monotonic()
            body, _ = merged.render(None)
            assert time.monotonic() - t0 < 0.2 + 0.3
            up = {s.labels["source"]: s.value for s in families(body)["llmserve_metrics_source_up"].samples}
            assert up["triton"] == 0 and up["multiprocess"] == 1
    finally:
        merged.close()


def test_metrics_serve_answers_within_its_timeout_when_triton_never_answers(writers, silent_server):
    writers.run("0")
    argv = cli_argv(
        "metrics",
        "serve",
        "--triton-url",
        silent_server,
        "--multiproc-dir",
        writers.folder,
        "--port",
        0,
        "--timeout",
        0.2,
    )
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True, env=cli_env())
    try:
        assert proc.stderr is not None
        url = None
        while url is None:
            line = proc.stderr.readline()
            assert line, f"metrics serve exited with {proc.poll()}"
            if "serving merged metrics on " in line:
                url = line.strip().rsplit(" ", 1)[-1]
        for _ in range(3):
            t0 = time.monotonic()
            with urllib.request.urlopen(url, timeout=10) as r:
                body = r.read()
            assert time.monotonic() - t0 < 0.2 + 0.5
            up = {s.labels["source"]: s.value for s in families(body)["llmserve_metrics_source_up"].samples}
            assert up == {"triton": 0.0, "multiprocess": 1.0}
    finally:
        proc.terminate()
        proc.wait(30)
