"""vLLM's metrics on the embedded engine reach the merged /metrics of a real `llmserve serve` (tiny model), in both
formats, and `llmserve metrics tail --once` reads the headline figures off it while it is under load."""

from __future__ import annotations

import threading

import httpx
import pytest
from real_sources import families
from support.cli import run_cli_json

from llmserve.metrics.families import family_key

pytestmark = pytest.mark.engine

# ~320 prompt tokens: two full 128-token KV blocks, so the second identical prompt hits the prefix cache
LONG = "The quick brown fox jumps over the lazy dog while metrics are merged. " * 10
# What a dashboard of vLLM needs, by family name as prometheus_client's parser reports it, and its type
HEADLINE_FAMILIES = {
    "vllm:prompt_tokens": "counter",
    "vllm:generation_tokens": "counter",
    "vllm:prefix_cache_queries": "counter",
    "vllm:prefix_cache_hits": "counter",
    "vllm:kv_cache_usage_perc": "gauge",
    "vllm:num_requests_running": "gauge",
    "vllm:num_requests_waiting": "gauge",
    "vllm:time_to_first_token_seconds": "histogram",
    "vllm:request_time_per_output_token_seconds": "histogram",
    "vllm:inter_token_latency_seconds": "histogram",
    "vllm:e2e_request_latency_seconds": "histogram",
}


def chat(base_url: str, content: str, max_tokens: int, model: str = "tiny-chat") -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens}
    return httpx.post(base_url + "/v1/chat/completions", json=body, timeout=120)


def total(fams: dict, family: str, sample: str) -> float:
    return sum(s.value for s in fams[family].samples if s.name == sample)


def test_all_of_vllms_series_reach_the_merged_page(engine_server):
    from prometheus_client import CollectorRegistry
    from prometheus_client.multiprocess import MultiProcessCollector

    for _ in range(2):
        r = chat(engine_server.base_url, LONG, 4)
        assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] >= 256
    page = httpx.get(engine_server.base_url + "/metrics", timeout=60)
    assert page.headers["content-type"].startswith("text/plain; version=0.0.4")
    fams = families(page.content)

    assert {name: fams[name].type for name in HEADLINE_FAMILIES if name in fams} == HEADLINE_FAMILIES
    assert total(fams, "vllm:prefix_cache_hits", "vllm:prefix_cache_hits_total") >= 128
    assert total(fams, "vllm:time_to_first_token_seconds", "vllm:time_to_first_token_seconds_count") >= 2
    assert (
        total(
            fams,
            "vllm:request_time_per_output_token_seconds",
            "vllm:request_time_per_output_token_seconds_count",
        )
        >= 2
    )
    assert total(fams, "llmserve_metrics_source_up", "llmserve_metrics_source_up") == 1
    # the folder was wiped at startup: nothing of the stale writer (engine="stale") is summed in
    assert "stale" not in page.text

    # nothing vLLM (or the frontends) wrote into the folder is missing from the merged page
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(engine_server.metrics_dir))
    in_folder = {family_key(m) for m in registry.collect()}
    served = {line.split()[2] for line in page.text.splitlines() if line.startswith("# TYPE ")}
    assert len([k for k in in_folder if k.startswith("vllm:")]) >= 30
    assert in_folder - served == set()


def test_openmetrics_from_the_real_server(engine_server):
    from prometheus_client.openmetrics.parser import text_string_to_metric_families as strict_openmetrics

    chat(engine_server.base_url, "hello", 2)
    page = httpx.get(
        engine_server.base_url + "/metrics",
        headers={"Accept": "application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.3"},
        timeout=60,
    )
    assert page.headers["content-type"] == "application/openmetrics-text; version=1.0.0; charset=utf-8"
    om = {f.name: f for f in strict_openmetrics(page.text)}
    assert {name: om[name].type for name in HEADLINE_FAMILIES if name in om} == HEADLINE_FAMILIES
    assert any(s.name == "vllm:generation_tokens_total" and s.value > 0 for s in om["vllm:generation_tokens"].samples)


def test_metrics_tail_once_under_load(engine_server):
    stop = threading.Event()
    errors: list[str] = []

    def load(content: str, max_tokens: int, model: str = "tiny-chat") -> None:
        while not stop.is_set():
            r = chat(engine_server.base_url, content, max_tokens, model)
            if r.status_code not in (200, 400, 404):  # the unknown model is refused
                errors.append(r.text)

    threads = [
        threading.Thread(target=load, args=(LONG, 24)),
        threading.Thread(target=load, args=(LONG, 24)),
        threading.Thread(target=load, args=("short one", 24)),
        threading.Thread(target=load, args=("no such model", 4, "nope")),  # refused: the chat endpoint's errors
    ]
    for t in threads:
        t.start()
    try:
        code, snap, out = run_cli_json(
            "metrics", "tail", engine_server.base_url, "--once", "--interval", "4", timeout=180
        )
    finally:
        stop.set()
        for t in threads:
            t.join(120)
    assert code == 0, out
    assert errors == []
    assert snap is not None
    assert snap["tokens_in_per_s"] > 0 and snap["tokens_out_per_s"] > 0
    assert snap["requests_running"] is not None and snap["requests_waiting"] is not None
    assert snap["kv_cache_usage"] is not None and 0 <= snap["kv_cache_usage"] <= 1
    assert snap["prefix_cache_hit_rate"] is not None and snap["prefix_cache_hit_rate"] > 0
    for key in ("ttft_seconds", "tpot_seconds"):
        q = snap[key]
        assert q["count"] > 0 and 0 < q["p50"] <= q["p99"], (key, q)
    chat_row = {row["endpoint"]: row for row in snap["endpoints"]}["chat"]
    assert chat_row["requests_per_s"] > 0 and 0 < chat_row["error_rate"] < 1
    assert snap["sources_up"] == {"multiprocess": True}
