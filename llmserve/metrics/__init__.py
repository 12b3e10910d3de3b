"""Metrics: one Prometheus exposition merged from Triton, vLLM and llmserve, and a live view of it.

    from llmserve.metrics import MergedMetrics, Multiprocess, TritonScrape

    merged = MergedMetrics([Multiprocess(folder), TritonScrape("127.0.0.1:8002", timeout=2.0)])
    body, content_type = merged.render(request_accept_header)   # or: await merged.render_async(...)

Sources, in precedence order (the first source that has a family serves it): see llmserve.metrics.merge.
Importing this package imports no prometheus_client (it is imported when a scrape runs).
"""

from llmserve.metrics.merge import Merged, MergedMetrics, SourceResult, standard_sources
from llmserve.metrics.negotiate import OPENMETRICS_CONTENT_TYPE, TEXT_CONTENT_TYPE, wants_openmetrics
from llmserve.metrics.sources import DEFAULT_TIMEOUT_S, Multiprocess, Registry, Source, TritonScrape, metrics_url

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "OPENMETRICS_CONTENT_TYPE",
    "TEXT_CONTENT_TYPE",
    "Merged",
    "MergedMetrics",
    "Multiprocess",
    "Registry",
    "Source",
    "SourceResult",
    "TritonScrape",
    "metrics_url",
    "standard_sources",
    "wants_openmetrics",
]
