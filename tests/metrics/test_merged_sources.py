"""The merger against real sources: a running tritonserver and multiprocess folders written by worker processes."""

from __future__ import annotations

import ast
import os
import threading
import time
import urllib.request
from pathlib import Path

from real_sources import IN_STUB_MODEL, TRITON_ENV, families, start_triton, write_model

from llmserve.metrics import MergedMetrics, Multiprocess, TritonScrape
from llmserve.serve.triton import TritonServer, locate_tritonserver

OPENMETRICS_ACCEPT = "application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.3,*/*;q=0.2"


def value(fams: dict, family: str, sample: str, **labels: str) -> float | None:
    """The value of the one sample of `family` named `sample` whose labels include `labels`, None if absent."""
    found = (
        [
            s.value
            for s in fams[family].samples
            if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items())
        ]
        if family in fams
        else []
    )
    assert len(found) <= 1, found
    return found[0] if found else None


def type_lines(body: bytes) -> list[str]:
    return [line.split()[2] for line in body.decode().splitlines() if line.startswith("# TYPE ")]


def test_every_source_merged_and_a_family_on_two_paths_served_once_from_the_folder(triton, writers):
    writers.run("0")
    writers.run("1")
    merged = MergedMetrics([Multiprocess(writers.folder), TritonScrape(triton.metrics_url, timeout=10)])
    body, content_type = merged.render(None)
    assert content_type.startswith("text/plain; version=0.0.4")
    fams = families(body)

    names = type_lines(body)
    assert len(names) == len(set(names)), "a family appears twice"
    # Triton's own series and the multiprocess writers' series are both there
    # (the parser reads Triton's suffix-less counters as `_total` samples; the page itself keeps Triton's names)
    assert value(fams, "nv_inference_request_success", "nv_inference_request_success_total", model="echo") == 0
    assert 'nv_inference_request_success{model="echo",version="1"} 0' in body.decode().splitlines()
    assert value(fams, "vllm:time_to_first_token_seconds", "vllm:time_to_first_token_seconds_count", engine="1") == 1
    # vllm:prompt_tokens_total is on both paths: the folder wins, whole (no bridge sample mixed in)
    prompt = fams["vllm:prompt_tokens"]
    assert {s.labels.get("engine") for s in prompt.samples} == {"0", "1"}
    assert all("model" not in s.labels for s in prompt.samples)
    # a vllm:* family only Triton's bridge has is kept
    assert value(fams, "vllm:num_requests_waiting", "vllm:num_requests_waiting", model="bridge") == 4
    # the merger says who answered and what precedence dropped
    assert value(fams, "llmserve_metrics_source_up", "llmserve_metrics_source_up", source="triton") == 1
    assert value(fams, "llmserve_metrics_source_up", "llmserve_metrics_source_up", source="multiprocess") == 1
    assert value(fams, "llmserve_metrics_shadowed_families", "llmserve_metrics_shadowed_families", source="triton") == 1


def test_triton_series_are_passed_through_as_triton_wrote_them(triton, writers):
    writers.run("0")
    with urllib.request.urlopen(triton.metrics_url, timeout=5) as r:
        own = r.read().decode()
    body, _ = MergedMetrics([Multiprocess(writers.folder), TritonScrape(triton.metrics_url)]).render(None)
    merged_lines = set(body.decode().splitlines())
    for line in own.splitlines():
        # counters and gauges of an idle server are stable between the two scrapes; utilisation gauges are not
        if line and "vllm:prompt_tokens_total" not in line and not line.startswith(("nv_cpu", "nv_gpu")):
            assert line in merged_lines, line


def test_openmetrics_when_the_scraper_prefers_it_with_the_same_series_names(triton, writers):
    from prometheus_client.openmetrics.parser import text_string_to_metric_families as strict_openmetrics

    writers.run("0")
    merged = MergedMetrics([Multiprocess(writers.folder), TritonScrape(triton.metrics_url, timeout=10)])
    om_body, om_type = merged.render(OPENMETRICS_ACCEPT)
    assert om_type == "application/openmetrics-text; version=1.0.0; charset=utf-8"
    assert om_body.endswith(b"# EOF\n")
    om = list(strict_openmetrics(om_body.decode()))  # raises on anything OpenMetrics forbids
    text = merged.render("text/plain;version=0.0.4")[0].decode()
    om_samples = {s.name for f in om for s in f.samples}
    text_samples = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if not line.startswith("#")}
    # every series keeps its name across formats (Triton's suffix-less counters included), colons too
    assert {n for n in text_samples if not n.endswith("_created")} <= om_samples
    assert "nv_inference_request_success" in om_samples and "vllm:prompt_tokens_total" in om_samples
    kinds = {f.name: f.type for f in om}
    assert kinds["nv_inference_request_success"] == "unknown" and kinds["vllm:prompt_tokens"] == "counter"
    # a plain scraper, and one that sends nothing, get the text format
    assert merged.render("*/*")[1].startswith("text/plain") and merged.render(None)[1].startswith("text/plain")


def test_a_dead_triton_leaves_the_folder_served_and_is_named(writers, dead_address):
    writers.run("0")
    body, _ = MergedMetrics([Multiprocess(writers.folder), TritonScrape(dead_address, timeout=2)]).render(None)
    fams = families(body)
    assert value(fams, "llmserve_metrics_source_up", "llmserve_metrics_source_up", source="triton") == 0
    assert value(fams, "llmserve_metrics_source_up", "llmserve_metrics_source_up", source="multiprocess") == 1
    assert value(fams, "vllm:prompt_tokens", "vllm:prompt_tokens_total", engine="0") == 5


def test_a_triton_that_stops_is_reported_down_on_the_next_scrape(tmp_path, writers):
    writers.run("0")
    server = start_triton(tmp_path)
    try:
        merged = MergedMetrics([Multiprocess(writers.folder), TritonScrape(server.metrics_url, timeout=10)])
        before = families(merged.render(None)[0])
        assert value(before, "llmserve_metrics_source_up", "llmserve_metrics_source_up", source="triton") == 1
    finally:
        server.stop()
    after = families(merged.render(None)[0])
    assert value(after, "llmserve_metrics_source_up", "llmserve_metrics_source_up", source="triton") == 0
    assert "nv_inference_request_success" not in after
    assert value(after, "vllm:prompt_tokens", "vllm:prompt_tokens_total", engine="0") == 5


def test_a_hung_source_costs_no_more_than_its_timeout(writers, silent_server):
    writers.run("0")
    merged = MergedMetrics([Multiprocess(writers.folder), TritonScrape(silent_server, timeout=0.5)])
    t0 = time.monotonic()
    body, _ = merged.render(None)
    took = time.monotonic() - t0
    assert took < 0.5 + 0.4, took
    fams = families(body)
    assert value(fams, "llmserve_metrics_source_up", "llmserve_metrics_source_up", source="triton") == 0
    assert value(fams, "vllm:prompt_tokens", "vllm:prompt_tokens_total", engine="0") == 5
    # and again: a source still hanging from the last scrape does not make the next one wait longer
    t0 = time.monotonic()
    merged.render(None)
    assert time.monotonic() - t0 < 0.9
    merged.close()


def test_dead_writers_lose_their_live_gauges_and_keep_their_counters(writers):
    alive = writers.run("alive", hold=True)
    gone = writers.run("gone")  # exited: its livesum gauge must stop counting
    fams = families(MergedMetrics([Multiprocess(writers.folder)]).render(None)[0])
    running = {s.labels["engine"]: s.value for s in fams["vllm:num_requests_running"].samples}
    assert running == {"alive": 2}
    prompt = {s.labels["engine"]: s.value for s in fams["vllm:prompt_tokens"].samples}
    assert prompt == {"alive": 5, "gone": 5}
    assert not list(writers.folder.glob(f"gauge_live*_{gone.pid}.db"))
    assert list(writers.folder.glob(f"gauge_live*_{alive.pid}.db"))
    writers.release(alive)
    fams = families(MergedMetrics([Multiprocess(writers.folder)]).render(None)[0])
    assert "vllm:num_requests_running" not in fams or not fams["vllm:num_requests_running"].samples


def test_a_missing_folder_is_a_source_down_not_a_failed_scrape(tmp_path, triton):
    body, _ = MergedMetrics([Multiprocess(tmp_path / "nowhere"), TritonScrape(triton.metrics_url)]).render(None)
    fams = families(body)
    assert value(fams, "llmserve_metrics_source_up", "llmserve_metrics_source_up", source="multiprocess") == 0
    assert "nv_inference_request_success" in fams


def test_every_gauge_llmserve_defines_declares_its_multiprocess_mode():
    package = Path(__file__).resolve().parents[2] / "llmserve"
    gauges = []
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "Gauge":
                gauges.append((path.relative_to(package), {k.arg for k in node.keywords}))
    assert gauges, "no Gauge found: the scan is broken"
    assert [g for g in gauges if "multiprocess_mode" not in g[1]] == []


def test_a_page_that_is_not_prometheus_text_is_a_source_down_not_a_broken_merge(writers):
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Html(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b"<html><body>502 Bad Gateway</body></html>"
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    writers.run("0")
    proxy = ThreadingHTTPServer(("127.0.0.1", 0), Html)
    thread = threading.Thread(target=proxy.serve_forever, daemon=True)
    thread.start()
    try:
        address = f"127.0.0.1:{proxy.server_address[1]}"
        body, _ = MergedMetrics([Multiprocess(writers.folder), TritonScrape(address, timeout=5)]).render(None)
    finally:
        proxy.shutdown()
        proxy.server_close()
    fams = families(body)  # still a valid page
    assert value(fams, "llmserve_metrics_source_up", "llmserve_metrics_source_up", source="triton") == 0
    assert b"<html>" not in body


def test_series_written_inside_triton_reach_the_folder_and_die_with_their_stub(tmp_path):
    """The Triton engine's path for vLLM's full metrics: tritonserver started with PROMETHEUS_MULTIPROC_DIR, its
    Python stub writes the folder; when the model is unloaded (its stub exits) the stub's live gauges go."""
    folder = tmp_path / "multiproc"
    folder.mkdir()
    repo = tmp_path / "repository"
    write_model(repo, "instub", IN_STUB_MODEL)
    environ = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(folder)}
    server = TritonServer(repo, ["instub"], install=locate_tritonserver(TRITON_ENV), environ=environ).start()
    try:
        merged = MergedMetrics([Multiprocess(folder), TritonScrape(server.metrics_url, timeout=10)])
        fams = families(merged.render(None)[0])
        assert value(fams, "vllm:prompt_tokens", "vllm:prompt_tokens_total", model_name="in-stub") == 11
        assert value(fams, "vllm:num_requests_running", "vllm:num_requests_running", model_name="in-stub") == 1
        assert "nv_inference_request_success" in fams
        server.unload_model("instub")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            fams = families(merged.render(None)[0])
            if value(fams, "vllm:num_requests_running", "vllm:num_requests_running", model_name="in-stub") is None:
                break
            time.sleep(0.2)
        assert value(fams, "vllm:num_requests_running", "vllm:num_requests_running", model_name="in-stub") is None
        assert value(fams, "vllm:prompt_tokens", "vllm:prompt_tokens_total", model_name="in-stub") == 11
    finally:
        server.stop()
