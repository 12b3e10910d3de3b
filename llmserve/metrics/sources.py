"""Where merged metrics come from: a Triton metrics endpoint, a Prometheus multiprocess folder, a registry.

A source has a `name` (the `source` label of llmserve_metrics_source_up), says whether it is `remote` (collected on
a worker thread and waited for at most `timeout` seconds) and returns its families from `collect()`; any exception
there means the source is down for this scrape.
"""

from __future__ import annotations

import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from llmserve.metrics.families import Family, split_text
from llmserve.metrics.multiproc import mark_dead_writers

if TYPE_CHECKING:
    from prometheus_client.registry import Collector

DEFAULT_TIMEOUT_S = 2.0
# Asked for explicitly: a Triton build that learns OpenMetrics must keep sending the format split_text reads.
_TEXT_ACCEPT = "text/plain;version=0.0.4;q=1.0,*/*;q=0.1"


class Source(Protocol):
    name: str
    remote: bool
    timeout: float

    def collect(self) -> list[Family]: ...


def metrics_url(address: str) -> str:
    """`HOST:PORT`, `http://HOST:PORT` or a full URL -> the URL of the metrics page (path /metrics by default)."""
    url = address if "://" in address else f"http://{address}"
    scheme, _, rest = url.partition("://")
    if "/" not in rest:
        url = f"{scheme}://{rest}/metrics"
    return url


class TritonScrape:
    """Triton's metrics page (port 8002 by default), fetched over HTTP and cut into families verbatim.

    `timeout` bounds the whole scrape: the socket operations time out after it, and the merger stops waiting
    after it even if the server trickles bytes slowly.
    """

    remote = True

    def __init__(self, url: str, timeout: float = DEFAULT_TIMEOUT_S, name: str = "triton"):
        self.url = metrics_url(url)
        self.timeout = timeout
        self.name = name

    def fetch(self) -> str:
        request = urllib.request.Request(self.url, headers={"Accept": _TEXT_ACCEPT})
        with urllib.request.urlopen(request, timeout=self.timeout) as response:
            kind = response.headers.get_content_type()
            if kind != "text/plain":
                # a proxy's HTML error page passed through verbatim would make the whole merged page unreadable
                raise ValueError(f"{self.url} answered {kind}, not the Prometheus text format")
            charset = response.headers.get_content_charset() or "utf-8"
            return str(response.read().decode(charset, errors="replace"))

    def collect(self) -> list[Family]:
        return list(split_text(self.fetch()))

    def __repr__(self) -> str:
        return f"TritonScrape({self.url!r}, timeout={self.timeout})"


class Multiprocess:
    """A Prometheus multiprocess folder (PROMETHEUS_MULTIPROC_DIR): what vLLM and llmserve's frontends record
    in every process of a server, read with prometheus_client's MultiProcessCollector on a fresh registry (never
    the global one, which a multiprocess writer must not collect from). Writers that died are marked dead first."""

    remote = False
    timeout = 0.0

    def __init__(self, folder: Path | str, name: str = "multiprocess", mark_dead: bool = True):
        self.folder = Path(folder)
        self.name = name
        self.mark_dead = mark_dead

    def collect(self) -> list[Family]:
        from prometheus_client import CollectorRegistry
        from prometheus_client.multiprocess import MultiProcessCollector

        if not self.folder.is_dir():
            raise FileNotFoundError(f"no multiprocess folder at {self.folder}")
        if self.mark_dead:
            mark_dead_writers(self.folder)
        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=str(self.folder))
        return list(registry.collect())

    def __repr__(self) -> str:
        return f"Multiprocess({str(self.folder)!r})"


class Registry:
    """An in-process prometheus_client registry (or any collector): series this process keeps in memory."""

    remote = False
    timeout = 0.0

    def __init__(self, registry: Collector, name: str = "llmserve"):
        self.registry = registry
        self.name = name

    def collect(self) -> list[Family]:
        return list(self.registry.collect())

    def __repr__(self) -> str:
        return f"Registry(name={self.name!r})"
