"""The headline figures in `llmserve status` (the ones `llmserve metrics tail` shows), per server of each version.

The local target's servers are scraped at their URL in the deploy state; the Kubernetes target's pods at their pod
IP and `http` container port, which only answer where the cluster network reaches: elsewhere each pod says so.
The figures come from llmserve.metrics.snapshot; the pods and their URLs from llmserve.deploy.kubernetes.figures;
this module attaches and renders.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from llmserve.metrics.snapshot import auth_headers, snapshots, unknown

if TYPE_CHECKING:
    from llmserve.deploy.status import ClusterStatus, LocalStatus

POD_NETWORK_HINT = (
    "pod IPs answer only from inside the cluster network: run `llmserve status` there, "
    "or `kubectl port-forward` a pod and `llmserve metrics tail` it"
)


def attach_local(statuses: Sequence[LocalStatus], interval: float, timeout: float, api_key: str | None) -> None:
    """Set `metrics` (figures, or None figures and an `error`) on every instance of the local statuses."""
    urls = {(r.deployment, i.instance): i.url for r in statuses for i in r.instances if i.url}
    figures = snapshots(urls, interval, timeout, auth_headers(api_key))
    for r in statuses:
        for i in r.instances:
            i.metrics = figures.get((r.deployment, i.instance)) or unknown(None, "no server URL recorded")


def attach_kubernetes(
    statuses: Sequence[ClusterStatus],
    pods_by_deployment: dict[str, list],
    interval: float,
    timeout: float,
    api_key: str | None,
) -> None:
    """Set `pods` (each with its figures) on every Deployment object of the Kubernetes statuses
    (llmserve.deploy.kubernetes.figures; imported here, when a status targets Kubernetes)."""
    from llmserve.deploy.kubernetes.figures import attach_pod_figures

    attach_pod_figures(statuses, pods_by_deployment, interval, timeout, api_key, POD_NETWORK_HINT)


def render_local(r: LocalStatus, console: Console) -> None:
    """A table of each instance's figures, under render_status(r)'s view of the deployment."""
    rows = [(str(i.instance), f"v{i.version}", i.metrics) for i in r.instances if i.metrics is not None]
    _render(rows, "instance", console)


def render_kubernetes(r: ClusterStatus, console: Console) -> None:
    rows = [(p.pod, f"v{d.version}", p.metrics) for d in r.deployments for p in d.pods or []]
    _render(rows, "pod", console)


def _render(rows: list[tuple[str, str, dict[str, Any]]], what: str, console: Console) -> None:
    if not rows:
        return
    window = next((m["interval_s"] for _, _, m in rows if m.get("interval_s")), None)
    table = Table(title="metrics" + (f" (last {window:g} s)" if window else ""), title_justify="left")
    for col in (what, "version", "tok/s in", "tok/s out", "running", "waiting", "KV cache", "prefix hit"):
        table.add_column(col, justify="left" if col in (what, "version") else "right")
    table.add_column("TTFT p50/p99", justify="right")
    table.add_column("TPOT p50/p99", justify="right")
    table.add_column("error rate by endpoint")
    errors = []
    for name, version, m in rows:
        if m.get("error"):
            errors.append((name, version, m["error"]))
            table.add_row(escape(name), version, *(["-"] * 8), "[red]no figures[/]")
            continue
        table.add_row(
            escape(name),
            version,
            num(m["tokens_in_per_s"], "{:.1f}"),
            num(m["tokens_out_per_s"], "{:.1f}"),
            num(m["requests_running"], "{:.0f}"),
            num(m["requests_waiting"], "{:.0f}"),
            num(m["kv_cache_usage"], "{:.1%}"),
            num(m["prefix_cache_hit_rate"], "{:.1%}"),
            quantiles(m["ttft_seconds"]),
            quantiles(m["tpot_seconds"]),
            _endpoints(m["endpoints"]),
        )
    console.print(table)
    for name, version, error in errors:
        console.print(f"  [red]{escape(what)} {escape(name)} ({version})[/]: {escape(error)}", highlight=False)


def _endpoints(rows: list[dict] | None) -> str:
    parts = [f"{escape(e['endpoint'])} {num(e['error_rate'], '{:.1%}')}" for e in rows or [] if e["requests_per_s"]]
    return ", ".join(parts) or "-"


def quantiles(q: dict | None) -> str:
    q = q or {}
    return f"{ms(q.get('p50'))} / {ms(q.get('p99'))}"


def num(value: float | None, fmt: str) -> str:
    return "-" if value is None else fmt.format(value)


def ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.0f} ms"
