"""One scrape of a metrics page, parsed into samples a person's figures can be computed from."""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections import defaultdict
from dataclasses import dataclass, field

from llmserve.errors import UnavailableError
from llmserve.metrics.sources import DEFAULT_TIMEOUT_S, metrics_url

Labels = tuple[tuple[str, str], ...]


@dataclass
class Scrape:
    """Samples by sample name (`vllm:prompt_tokens_total`, `..._bucket`), each as (sorted labels, value)."""

    at: float  # time.monotonic() when the page arrived
    samples: dict[str, list[tuple[Labels, float]]] = field(default_factory=dict)

    def total(self, name: str, **match: str) -> float | None:
        """Sum over the samples of `name` whose labels include `match`; None when the page has no such sample."""
        rows = self.samples.get(name)
        if rows is None:
            return None
        return sum(v for labels, v in rows if _matches(labels, match))

    def maximum(self, name: str) -> float | None:
        rows = self.samples.get(name)
        return max(v for _, v in rows) if rows else None

    def by_label(self, name: str, *keys: str) -> dict[tuple[str, ...], float]:
        """`name`'s samples summed per value of the label(s) `keys`."""
        out: dict[tuple[str, ...], float] = defaultdict(float)
        for labels, value in self.samples.get(name, ()):
            d = dict(labels)
            out[tuple(d.get(k, "") for k in keys)] += value
        return dict(out)

    def buckets(self, name: str) -> list[tuple[float, float]]:
        """A histogram's cumulative buckets summed over every other label: [(upper bound, count)], ascending."""
        sums: dict[float, float] = defaultdict(float)
        for labels, value in self.samples.get(name + "_bucket", ()):
            le = dict(labels).get("le")
            if le is not None:
                sums[float(le)] += value
        return sorted(sums.items())


def _matches(labels: Labels, match: dict[str, str]) -> bool:
    if not match:
        return True
    d = dict(labels)
    return all(d.get(k) == v for k, v in match.items())


def parse(page: str, at: float | None = None) -> Scrape:
    from prometheus_client.parser import text_string_to_metric_families

    scrape = Scrape(time.monotonic() if at is None else at)
    for family in text_string_to_metric_families(page):
        for s in family.samples:
            scrape.samples.setdefault(s.name, []).append((tuple(sorted(s.labels.items())), float(s.value)))
    return scrape


def fetch(url: str, timeout: float = DEFAULT_TIMEOUT_S, headers: dict[str, str] | None = None) -> Scrape:
    """GET the page (Prometheus text format) and parse it; UnavailableError when nothing usable came back."""
    target = metrics_url(url)
    request = urllib.request.Request(target, headers={"Accept": "text/plain;version=0.0.4", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            page = response.read().decode(response.headers.get_content_charset() or "utf-8", errors="replace")
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise UnavailableError(
            f"could not scrape {target}: {reason}",
            hint="Check the address (HOST:PORT of `llmserve serve` or `llmserve metrics serve`) and that it runs.",
        ) from exc
    try:
        return parse(page)
    except ValueError as exc:
        raise UnavailableError(
            f"{target} did not return a Prometheus text page: {exc}",
            hint="Point at a /metrics endpoint (llmserve serve, llmserve metrics serve, Triton's :8002).",
        ) from exc
