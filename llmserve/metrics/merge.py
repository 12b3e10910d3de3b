"""One Prometheus exposition merged from several sources, with a documented precedence.

Precedence is the order of `sources`: when two sources carry a family with the same key (its `# TYPE` name in the
text format), the first source's family is served and the later ones' are dropped whole (never mixed: two paths
to one family carry different labels, e.g. Triton's bridge labels vLLM series by `model`/`version`, vLLM itself by
`model_name`/`engine`). The order `standard_sources` builds, and the one to keep:

  1. the multiprocess folder: vLLM's own series (all of them) and llmserve's frontend series;
  2. an in-process registry, if any;
  3. Triton's endpoint: its `nv_*` series, and its vLLM bridge's `vllm:*` subset only where (1) lacks a family.

The merger's own families come first and win over everything: `llmserve_metrics_source_up{source}` (1 when the
source answered this scrape, 0 when it failed or ran past its timeout), `llmserve_metrics_source_seconds{source}`
and `llmserve_metrics_shadowed_families{source}` (families dropped by precedence).

Remote sources (Triton) are fetched on worker threads while local ones are read on the calling thread, and the
merger waits for each remote source only until its timeout: a scrape never takes much longer than the slowest
timeout, whatever the source does. `render_async` runs the whole merge on a worker thread, for event loops.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from pathlib import Path

from llmserve.metrics.families import Family, family_key, render_openmetrics, render_text
from llmserve.metrics.negotiate import OPENMETRICS_CONTENT_TYPE, TEXT_CONTENT_TYPE, wants_openmetrics
from llmserve.metrics.sources import DEFAULT_TIMEOUT_S, Multiprocess, Source, TritonScrape

log = logging.getLogger("llmserve.metrics")

SOURCE_UP = "llmserve_metrics_source_up"
SOURCE_SECONDS = "llmserve_metrics_source_seconds"
SHADOWED = "llmserve_metrics_shadowed_families"


@dataclass
class SourceResult:
    name: str
    up: bool
    seconds: float
    families: list[Family] = field(default_factory=list)
    error: str | None = None
    shadowed: int = 0


@dataclass
class Merged:
    families: list[Family]  # the merger's own first, then each source's survivors in precedence order
    results: list[SourceResult]


def standard_sources(
    multiproc_dir: Path | str | None = None,
    triton_url: str | None = None,
    *,
    timeout: float = DEFAULT_TIMEOUT_S,
) -> list[Source]:
    """The documented precedence: multiprocess folder, then Triton."""
    sources: list[Source] = []
    if multiproc_dir is not None:
        sources.append(Multiprocess(multiproc_dir))
    if triton_url is not None:
        sources.append(TritonScrape(triton_url, timeout=timeout))
    return sources


class MergedMetrics:
    """`MergedMetrics([Multiprocess(dir), TritonScrape(url, timeout=2)]).render(accept) -> (body, content_type)`."""

    def __init__(self, sources: Iterable[Source] = (), *, max_workers: int = 4):
        self.sources: list[Source] = list(sources)
        # Threads of remote fetches that ran past their timeout finish on their own (their sockets time out too);
        # a bounded pool keeps a hanging source from piling up threads.
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="llmserve-metrics")
        self._was_up: dict[str, bool] = {}

    def add(self, source: Source, *, first: bool = False) -> None:
        """Add a source last (lowest precedence) or first (highest); before serving starts."""
        names = {s.name for s in self.sources}
        if source.name in names:
            raise ValueError(f"a metrics source named {source.name!r} is already merged")
        self.sources.insert(0 if first else len(self.sources), source)

    def collect(self) -> Merged:
        start = time.monotonic()
        pending: list[tuple[Source, Future[SourceResult]]] = [
            (s, self._pool.submit(_collect_one, s)) for s in self.sources if s.remote
        ]
        by_name = {s.name: _collect_one(s) for s in self.sources if not s.remote}
        for source, future in pending:
            left = max(0.0, source.timeout - (time.monotonic() - start))
            try:
                by_name[source.name] = future.result(timeout=left)
            except FutureTimeout:
                future.cancel()
                by_name[source.name] = SourceResult(
                    source.name, False, time.monotonic() - start, error=f"no answer within {source.timeout:g} s"
                )
        results = [by_name[s.name] for s in self.sources]
        self._log_changes(results)

        seen = {SOURCE_UP, SOURCE_SECONDS, SHADOWED}
        merged: list[Family] = []
        for result in results:
            for family in result.families:
                key = family_key(family)
                if key in seen:
                    result.shadowed += 1
                else:
                    seen.add(key)
                    merged.append(family)
        return Merged(_own_families(results) + merged, results)

    def render(self, accept: str | None = None) -> tuple[bytes, str]:
        """The merged page in the format the Accept header asks for: OpenMetrics 1.0.0 when it prefers
        `application/openmetrics-text`, else the Prometheus text format 0.0.4."""
        families = self.collect().families
        if wants_openmetrics(accept):
            return render_openmetrics(families), OPENMETRICS_CONTENT_TYPE
        return render_text(families), TEXT_CONTENT_TYPE

    async def render_async(self, accept: str | None = None) -> tuple[bytes, str]:
        """render() on a worker thread: file reads and the Triton fetch never hold the event loop."""
        return await asyncio.to_thread(self.render, accept)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _log_changes(self, results: Sequence[SourceResult]) -> None:
        # Once per change, not per scrape: a scraper polls every few seconds.
        for r in results:
            if self._was_up.get(r.name, True) != r.up:
                if r.up:
                    log.info("metrics source %s is back", r.name)
                else:
                    log.warning("metrics source %s failed: %s (the other sources are still served)", r.name, r.error)
            self._was_up[r.name] = r.up


def _collect_one(source: Source) -> SourceResult:
    t0 = time.monotonic()
    try:
        families = source.collect()
    except Exception as exc:  # any failure of one source must leave the others served
        return SourceResult(source.name, False, time.monotonic() - t0, error=f"{type(exc).__name__}: {exc}")
    return SourceResult(source.name, True, time.monotonic() - t0, families)


def _own_families(results: Sequence[SourceResult]) -> list[Family]:
    from prometheus_client.core import GaugeMetricFamily

    up = GaugeMetricFamily(SOURCE_UP, "1 when the metrics source answered this scrape, 0 if not", labels=["source"])
    seconds = GaugeMetricFamily(SOURCE_SECONDS, "Time this scrape spent on the metrics source", labels=["source"])
    shadowed = GaugeMetricFamily(
        SHADOWED, "Families of the source not served because a source before it has them", labels=["source"]
    )
    for r in results:
        up.add_metric([r.name], 1.0 if r.up else 0.0)
        seconds.add_metric([r.name], r.seconds)
        shadowed.add_metric([r.name], float(r.shadowed))
    return [up, seconds, shadowed]
