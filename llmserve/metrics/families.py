"""Metric families as the merger handles them, and their rendering in both exposition formats.

A source hands over families of two kinds:
  - `prometheus_client` Metric objects (the multiprocess files, a registry);
  - `TextFamily`: one family's lines cut verbatim out of a scraped Prometheus text page (Triton). Kept as text so
    that the merged text page shows Triton's series byte for byte as Triton wrote them: re-rendering them through
    prometheus_client would rename counters (it appends `_total` to the TYPE line of a counter whose samples lack
    it), and dashboards must keep working unchanged.

Every family has a `key`: the name on its `# TYPE` line in the Prometheus text format (a counter `x` of
prometheus_client is `x_total` there, as Triton's bridge writes vLLM's counters). Two families with the same key are
the same family from two paths, and the merger keeps one.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Union

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

# Sample-name suffixes that still belong to the family named on the `# TYPE` line before them.
_SUFFIXES = ("_total", "_bucket", "_sum", "_count", "_created", "_info", "_gsum", "_gcount")


@dataclass
class TextFamily:
    """One family of a scraped Prometheus text page: its `# TYPE` name and its lines, verbatim."""

    key: str
    lines: list[str]

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


Family = Union["Metric", TextFamily]


def family_key(family: Family) -> str:
    if isinstance(family, TextFamily):
        return family.key
    if family.type == "counter":
        return family.name + "_total"
    if family.type == "info":
        return family.name + "_info"
    return str(family.name)


def split_text(page: str) -> list[TextFamily]:
    """A Prometheus text page cut into families, in page order (a line pass: no parsing of values).

    A sample belongs to the family of the `# HELP`/`# TYPE` lines before it when its name is that family's name or
    that name plus a histogram/summary/counter suffix; any other sample starts an untyped family of its own name.
    Blank lines and other comments are dropped.
    """
    families: dict[str, TextFamily] = {}
    current: str | None = None
    for line in page.splitlines():
        if not line or line.isspace():
            continue
        if line[0] == "#":
            parts = line.split(None, 3)
            if len(parts) >= 3 and parts[1] in ("HELP", "TYPE"):
                current = parts[2]
                _family(families, current).lines.append(line)
            continue
        name = _sample_name(line)
        if current is None or not (name == current or (name.startswith(current) and name[len(current) :] in _SUFFIXES)):
            current = name
        _family(families, current).lines.append(line)
    return list(families.values())


def _family(families: dict[str, TextFamily], key: str) -> TextFamily:
    family = families.get(key)
    if family is None:
        family = families[key] = TextFamily(key, [])
    return family


def _sample_name(line: str) -> str:
    end = len(line)
    for stop in ("{", " ", "\t"):
        at = line.find(stop)
        if at != -1 and at < end:
            end = at
    return line[:end]


class _Fixed:
    """A collector over a fixed list of families: what prometheus_client's writers take."""

    def __init__(self, metrics: Sequence[Metric]):
        self._metrics = metrics

    def collect(self) -> Iterable[Metric]:
        return self._metrics


def render_text(families: Sequence[Family]) -> bytes:
    """Prometheus text format 0.0.4: Metric runs through prometheus_client's writer, text families verbatim."""
    from prometheus_client import generate_latest

    chunks: list[bytes] = []
    run: list[Metric] = []
    for family in families:
        if isinstance(family, TextFamily):
            if run:
                chunks.append(generate_latest(_Fixed(run)))
                run = []
            chunks.append(family.text().encode("utf-8"))
        else:
            run.append(family)
    if run:
        chunks.append(generate_latest(_Fixed(run)))
    return b"".join(chunks)


def render_openmetrics(families: Sequence[Family]) -> bytes:
    """OpenMetrics 1.0.0: text families are parsed into Metric objects first (OpenMetrics has its own rules for
    counter sample names), everything goes through prometheus_client's writer once, with one `# EOF`."""
    from prometheus_client.openmetrics.exposition import ALLOWUTF8, generate_latest

    metrics: list[Metric] = []
    for family in families:
        if isinstance(family, TextFamily):
            metrics.extend(_openmetrics_ready(family))
        else:
            metrics.append(family)
    # Not the default escaping: prometheus_client 0.26 escapes sample names with the label-name rules, which turns
    # `vllm:prompt_tokens_total` into `vllm_prompt_tokens_total`. ALLOWUTF8 writes every legacy-valid name
    # (all of vLLM's, Triton's and ours) as it is.
    return generate_latest(_Fixed(metrics), escaping=ALLOWUTF8)


def _openmetrics_ready(family: TextFamily) -> list[Metric]:
    from prometheus_client.parser import text_string_to_metric_families

    parsed = list(text_string_to_metric_families(family.text()))
    for metric in parsed:
        if metric.type == "counter" and not family.key.endswith("_total"):
            # Triton's counters have no `_total` (nv_inference_request_success). The parser adds it to the samples
            # and OpenMetrics demands it, but a scraper would then store a series of another name than the text
            # format's, and dashboards would break on the format switch. So the family is declared `unknown` and
            # keeps its samples' names as Triton wrote them.
            metric.type = "unknown"
            metric.name = family.key
            metric.samples = [
                s._replace(name=family.key) if s.name == family.key + "_total" else s for s in metric.samples
            ]
    return parsed
