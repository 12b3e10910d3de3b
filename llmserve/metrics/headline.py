"""The headline figures of a serving stack, from two scrapes of its merged /metrics (rates need a window).

Counters give rates over the window (delta / seconds); histograms give quantiles of the observations made in the
window (bucket deltas, interpolated inside a bucket as Prometheus' histogram_quantile does); gauges are read from
the later scrape. A figure whose series the page lacks is None (Triton alone has no KV-cache usage, for example).
"""

from __future__ import annotations

import math
from typing import Any

from llmserve.metrics.scrape import Scrape

PROMPT_TOKENS = "vllm:prompt_tokens_total"
GENERATION_TOKENS = "vllm:generation_tokens_total"
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_CACHE_USAGE = "vllm:kv_cache_usage_perc"  # a fraction (0..1) despite its name
PREFIX_QUERIES = "vllm:prefix_cache_queries_total"
PREFIX_HITS = "vllm:prefix_cache_hits_total"
TTFT = ("vllm:time_to_first_token_seconds",)
# vLLM 0.32's per-request TPOT; older vLLM (and Triton's bridge) used the second name for the per-token one
TPOT = ("vllm:request_time_per_output_token_seconds", "vllm:time_per_output_token_seconds")
REQUESTS = "llmserve_requests_total"
# prometheus_client's parser names a counter's samples `..._total` even where Triton's page has no suffix
TRITON_SUCCESS = "nv_inference_request_success_total"
TRITON_FAILURE = "nv_inference_request_failure_total"
SOURCE_UP = "llmserve_metrics_source_up"


def headline(before: Scrape, after: Scrape) -> dict[str, Any]:
    seconds = max(after.at - before.at, 1e-9)
    return {
        "interval_s": round(seconds, 3),
        "tokens_in_per_s": _rate(before, after, PROMPT_TOKENS, seconds),
        "tokens_out_per_s": _rate(before, after, GENERATION_TOKENS, seconds),
        "requests_running": after.total(RUNNING),
        "requests_waiting": after.total(WAITING),
        "kv_cache_usage": after.maximum(KV_CACHE_USAGE),
        "prefix_cache_hit_rate": _ratio(before, after, PREFIX_HITS, PREFIX_QUERIES),
        "prefix_cache_hit_rate_lifetime": _ratio(None, after, PREFIX_HITS, PREFIX_QUERIES),
        "ttft_seconds": _quantiles(before, after, TTFT),
        "tpot_seconds": _quantiles(before, after, TPOT),
        "endpoints": _endpoints(before, after, seconds),
        "sources_up": {labels[0]: value == 1.0 for labels, value in after.by_label(SOURCE_UP, "source").items()},
    }


def _delta(before: Scrape | None, after: Scrape, name: str, **match: str) -> float | None:
    now = after.total(name, **match)
    if now is None:
        return None
    then = before.total(name, **match) if before is not None else 0.0
    # a counter that went down was reset (a restarted server): count from zero, as Prometheus' rate() does
    return now - then if then is not None and now >= then else now


def _rate(before: Scrape, after: Scrape, name: str, seconds: float) -> float | None:
    d = _delta(before, after, name)
    return None if d is None else d / seconds


def _ratio(before: Scrape | None, after: Scrape, hits: str, queries: str) -> float | None:
    h, q = _delta(before, after, hits), _delta(before, after, queries)
    if h is None or not q:
        return None
    return h / q


def _quantiles(before: Scrape, after: Scrape, names: tuple[str, ...]) -> dict[str, float | None] | None:
    name = next((n for n in names if n + "_bucket" in after.samples), None)
    if name is None:
        return None
    old = dict(before.buckets(name))
    new = after.buckets(name)
    deltas = [(le, count - old.get(le, 0.0)) for le, count in new]
    if deltas and deltas[-1][1] < 0:  # reset
        deltas = new
    count = deltas[-1][1] if deltas else 0.0
    return {
        "count": count,
        "p50": quantile(0.5, deltas) if count > 0 else None,
        "p99": quantile(0.99, deltas) if count > 0 else None,
    }


def quantile(q: float, buckets: list[tuple[float, float]]) -> float | None:
    """Prometheus' histogram_quantile over cumulative (upper bound, count) buckets, ascending, +Inf last."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lower, below = 0.0, 0.0
    for upper, count in buckets:
        if count >= rank:
            if math.isinf(upper):
                return lower  # the +Inf bucket has no width: the highest finite bound is the answer
            if count == below:
                return upper
            return lower + (upper - lower) * (rank - below) / (count - below)
        lower, below = upper, count
    return lower


def _endpoints(before: Scrape, after: Scrape, seconds: float) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    then = before.by_label(REQUESTS, "endpoint", "status")
    totals: dict[str, list[float]] = {}
    for (endpoint, status), value in after.by_label(REQUESTS, "endpoint", "status").items():
        old = then.get((endpoint, status), 0.0)
        d = value - old if value >= old else value
        entry = totals.setdefault(endpoint, [0.0, 0.0])
        entry[0] += d
        if not _succeeded(status):
            entry[1] += d
    # Triton's own per-model counters: models it serves without llmserve's frontends in front
    ok_then, ok_now = before.by_label(TRITON_SUCCESS, "model"), after.by_label(TRITON_SUCCESS, "model")
    bad_then, bad_now = before.by_label(TRITON_FAILURE, "model"), after.by_label(TRITON_FAILURE, "model")
    for (model,), ok in ok_now.items():
        good = ok - ok_then.get((model,), 0.0)
        bad = bad_now.get((model,), 0.0) - bad_then.get((model,), 0.0)
        entry = totals.setdefault(f"triton/{model}", [0.0, 0.0])
        entry[0] += max(good, 0.0) + max(bad, 0.0)
        entry[1] += max(bad, 0.0)
    for endpoint, (requests, errors) in sorted(totals.items()):
        rows.append(
            {
                "endpoint": endpoint,
                "requests_per_s": requests / seconds,
                "errors_per_s": errors / seconds,
                "error_rate": errors / requests if requests else None,
            }
        )
    return rows


def _succeeded(status: str) -> bool:
    """HTTP 1xx-3xx, or the gRPC code OK."""
    if status.isdigit():
        return int(status) < 400
    return status == "OK"
