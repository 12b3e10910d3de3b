"""The headline figures of several servers at once, quickly: what `llmserve status` shows per deployed version.

    from llmserve.metrics.snapshot import snapshots

    figures = snapshots({"v1": "http://127.0.0.1:8101", "v2": "10.0.0.7:8000"}, interval=1.0, timeout=2.0)
    figures["v1"]["tokens_out_per_s"], figures["v2"]["error"]

Each server is scraped twice, `interval` seconds apart (rates and histogram quantiles need two samples; gauges are
read from the second), every server on its own thread, so the whole call takes about `interval` plus, at worst,
two `timeout`s, however many servers there are. A server that cannot be scraped gets the same keys, each None,
and an `error` string ("unreachable: ...", "unauthorized: HTTP 401 ...", "scrape failed: ..."); a scraped one has
`error` None. The figures are llmserve.metrics.headline's, computed by it.
"""

from __future__ import annotations

import time
import urllib.error
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from llmserve.errors import UnavailableError
from llmserve.metrics.headline import headline
from llmserve.metrics.scrape import fetch
from llmserve.metrics.sources import metrics_url

K = TypeVar("K")  # whatever names a server to the caller

DEFAULT_INTERVAL_S = 1.0
DEFAULT_TIMEOUT_S = 2.0

# The keys of headline(): a failed scrape has each of them, None (a script reads one shape either way).
FIGURES = (
    "interval_s",
    "tokens_in_per_s",
    "tokens_out_per_s",
    "requests_running",
    "requests_waiting",
    "kv_cache_usage",
    "prefix_cache_hit_rate",
    "prefix_cache_hit_rate_lifetime",
    "ttft_seconds",
    "tpot_seconds",
    "endpoints",
    "sources_up",
)


def auth_headers(api_key: str | None) -> dict[str, str]:
    """The header a server started with --api-key (or LLMSERVE_API_KEY) wants on /metrics too."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def unknown(url: str | None, error: str) -> dict[str, Any]:
    """The figures of a server that could not be scraped (or has no address yet): every figure None, and why."""
    return {"url": metrics_url(url) if url else None, **dict.fromkeys(FIGURES), "error": error}


def snapshot(
    url: str,
    interval: float = DEFAULT_INTERVAL_S,
    timeout: float = DEFAULT_TIMEOUT_S,
    headers: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """One server's headline figures over `interval` seconds, or its figures unknown and an `error`. Never raises
    for a server that is down, hung, refuses the key or answers something that is not a metrics page."""
    target = metrics_url(url)
    given = dict(headers or {})
    try:
        before = fetch(target, timeout, given)
        time.sleep(max(0.0, interval - (time.monotonic() - before.at)))
        after = fetch(target, timeout, given)
    except UnavailableError as exc:
        return unknown(target, describe(exc, bool(given)))
    except Exception as exc:  # a broken answer (http.client's IncompleteRead, BadStatusLine): this server's, not ours
        return unknown(target, f"scrape failed: {type(exc).__name__}: {exc}")
    return {"url": target, **headline(before, after), "error": None}


def snapshots(
    urls: Mapping[K, str],
    interval: float = DEFAULT_INTERVAL_S,
    timeout: float = DEFAULT_TIMEOUT_S,
    headers: Mapping[str, str] | None = None,
) -> dict[K, dict[str, Any]]:
    """snapshot() of every {key: url} at once (one thread per server): {key: figures}."""
    if not urls:
        return {}
    with ThreadPoolExecutor(max_workers=min(len(urls), 32), thread_name_prefix="llmserve-snapshot") as pool:
        futures = {key: pool.submit(snapshot, url, interval, timeout, headers) for key, url in urls.items()}
        return {key: future.result() for key, future in futures.items()}


def describe(exc: UnavailableError, sent_key: bool) -> str:
    """A failed scrape in one line: 'unauthorized: ...' for a 401/403, 'scrape failed: ...' when something answered
    but not with a metrics page (an HTTP error, another format), 'unreachable: <reason>' when nothing answered."""
    cause = exc.__cause__
    if isinstance(cause, urllib.error.HTTPError):
        if cause.code in (401, 403):
            hint = "the key sent was refused" if sent_key else "set LLMSERVE_API_KEY (or --api-key) to its key"
            return f"unauthorized: HTTP {cause.code} from {cause.url} ({hint})"
        return f"scrape failed: HTTP {cause.code} {cause.reason} from {cause.url}"
    if isinstance(cause, ValueError):
        return f"scrape failed: not a Prometheus text page: {cause}"
    if isinstance(cause, urllib.error.URLError):
        return f"unreachable: {cause.reason}"
    return f"unreachable: {cause if cause is not None else exc}"
