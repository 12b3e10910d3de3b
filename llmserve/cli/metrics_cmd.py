"""`llmserve metrics serve | tail`: a merged Prometheus endpoint in front of Triton, and a live view of one."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Group
from rich.markup import escape
from rich.table import Table

from llmserve.cli.render import OutputFormat, console, err_console, print_json
from llmserve.cli.status_figures import ms as _ms
from llmserve.cli.status_figures import num as _num

metrics_app = typer.Typer(
    name="metrics",
    help=(
        "Merged Triton + vLLM + llmserve metrics: serve them on one endpoint, or watch one live.\n\n"
        "Example:\n\n    llmserve metrics tail 127.0.0.1:8000"
    ),
    no_args_is_help=True,
)

OutputOpt = Annotated[OutputFormat, typer.Option("--output", "-o", help="text or json.")]


@metrics_app.command("serve")
def serve(
    triton_url: str = typer.Option(
        None, "--triton-url", help="Triton's metrics address: HOST:PORT (its --metrics-port, 8002 by default) or a URL."
    ),
    multiproc_dir: Path = typer.Option(
        None,
        "--multiproc-dir",
        help="A Prometheus multiprocess folder to merge (vLLM's PROMETHEUS_MULTIPROC_DIR); read, never wiped. "
        "Its writers must run on this host: dead ones are found by pid.",
    ),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to bind. Default: loopback only."),
    port: int = typer.Option(9400, "--port", help="Port of the merged /metrics (0: any free port)."),
    timeout: float = typer.Option(
        2.0, "--timeout", help="Seconds a scrape waits for Triton; past it Triton is reported down for that scrape."
    ),
) -> None:
    """Serve one merged /metrics: the multiprocess folder first, then Triton's endpoint (a family both have
    is served from the folder). `llmserve_metrics_source_up{source}` says which source answered each scrape.
    Prometheus text format, or OpenMetrics when the scraper's Accept header asks for it. Runs until Ctrl-C.

    Example:

        llmserve metrics serve --triton-url 127.0.0.1:8002 --multiproc-dir /tmp/vllm-metrics --port 9400
    """
    from llmserve.errors import InvalidInputError
    from llmserve.metrics import MergedMetrics, standard_sources
    from llmserve.metrics.standalone import MetricsEndpoint

    if triton_url is None and multiproc_dir is None:
        raise InvalidInputError(
            "nothing to merge: give --triton-url, --multiproc-dir or both",
            hint="llmserve metrics serve --triton-url 127.0.0.1:8002",
        )
    if timeout <= 0:
        raise InvalidInputError(f"--timeout must be positive, not {timeout:g}", hint="e.g. --timeout 2")
    merged = MergedMetrics(standard_sources(multiproc_dir, triton_url, timeout=timeout))
    try:
        endpoint = MetricsEndpoint(merged, host=host, port=port)
    except OSError as exc:
        raise InvalidInputError(f"cannot listen on {host}:{port}: {exc.strerror}", hint="Pick another --port.") from exc
    for source in merged.sources:
        err_console.print(f"merging {escape(repr(source))}", highlight=False)
    err_console.print(f"serving merged metrics on {endpoint.url}", highlight=False)
    try:
        endpoint.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        endpoint.stop()


@metrics_app.command("tail")
def tail(
    url: str = typer.Argument(..., help="A metrics endpoint: HOST:PORT or URL (llmserve serve, metrics serve)."),
    interval: float = typer.Option(2.0, "--interval", help="Seconds between scrapes; rates cover this window."),
    once: bool = typer.Option(False, "--once", help="Take two scrapes --interval apart, print one snapshot, exit."),
    timeout: float = typer.Option(5.0, "--timeout", help="Seconds one scrape may take."),
    api_key: str = typer.Option(
        None,
        "--api-key",
        envvar="LLMSERVE_API_KEY",
        show_envvar=True,
        help="Bearer key of a server started with --api-key (its /metrics needs it too).",
    ),
    output: OutputOpt = OutputFormat.text,
) -> None:
    """Watch a serving stack live: tokens/s in and out, requests running and waiting, KV-cache usage,
    prefix-cache hit rate, TTFT and TPOT p50/p99 (from histogram deltas over the window) and request and
    error rates by endpoint. Exit 8 when the endpoint cannot be scraped.

    Example:

        llmserve metrics tail 127.0.0.1:8000

        llmserve metrics tail 127.0.0.1:8000 --once --interval 5 -o json
    """
    from llmserve.errors import InvalidInputError
    from llmserve.metrics.headline import headline
    from llmserve.metrics.scrape import fetch
    from llmserve.metrics.snapshot import auth_headers

    if interval <= 0:
        raise InvalidInputError(f"--interval must be positive, not {interval:g}", hint="e.g. --interval 2")
    headers = auth_headers(api_key)
    before = fetch(url, timeout, headers)
    if once:
        time.sleep(interval)
        figures = {"url": url, **headline(before, fetch(url, timeout, headers))}
        if output is OutputFormat.json:
            print_json(figures)
        else:
            console.print(_view(figures))
        return
    from rich.live import Live

    try:
        with Live(console=console, auto_refresh=False) as live:
            while True:
                time.sleep(interval)
                after = fetch(url, timeout, headers)
                live.update(_view({"url": url, **headline(before, after)}), refresh=True)
                before = after
    except KeyboardInterrupt:
        pass


def _view(f: dict[str, Any]) -> Group:
    figures = Table(title=f"{f['url']} (last {f['interval_s']:g} s)", show_header=False, title_justify="left")
    figures.add_column("figure", style="bold")
    figures.add_column("value", justify="right")
    figures.add_row("tokens/s in", _num(f["tokens_in_per_s"], "{:.1f}"))
    figures.add_row("tokens/s out", _num(f["tokens_out_per_s"], "{:.1f}"))
    figures.add_row("requests running", _num(f["requests_running"], "{:.0f}"))
    figures.add_row("requests waiting", _num(f["requests_waiting"], "{:.0f}"))
    figures.add_row("KV-cache usage", _num(f["kv_cache_usage"], "{:.2%}"))
    figures.add_row("prefix-cache hit rate", _num(f["prefix_cache_hit_rate"], "{:.1%}"))
    for label, key in (("TTFT", "ttft_seconds"), ("TPOT", "tpot_seconds")):
        q = f[key] or {}
        figures.add_row(f"{label} p50 / p99", f"{_ms(q.get('p50'))} / {_ms(q.get('p99'))}")
    down = [name for name, up in f["sources_up"].items() if not up]
    if down:
        figures.add_row("sources down", f"[red]{escape(', '.join(down))}[/]")
    endpoints = Table(title="by endpoint", title_justify="left")
    for col in ("endpoint", "req/s", "errors/s", "error rate"):
        endpoints.add_column(col, justify="left" if col == "endpoint" else "right")
    for row in f["endpoints"]:
        endpoints.add_row(
            escape(row["endpoint"]),
            f"{row['requests_per_s']:.2f}",
            f"{row['errors_per_s']:.2f}",
            _num(row["error_rate"], "{:.1%}"),
        )
    return Group(figures, endpoints)


def register(app: typer.Typer) -> None:
    app.add_typer(metrics_app)
