"""`llmserve status [NAME]`: deployments as they are now (processes checked, routes, journal, history) and each
server's headline figures from its /metrics (what `llmserve metrics tail` shows)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

import typer

from llmserve.cli import status_figures
from llmserve.cli.deploy_common import (
    ContextOpt,
    KubeconfigOpt,
    NamespaceOpt,
    OutputOpt,
    StateDirOpt,
    Target,
    TargetOpt,
    kube_deployer,
    render_status,
)
from llmserve.cli.deploy_regions import note_open_regional
from llmserve.cli.render import OutputFormat, console, print_json
from llmserve.errors import ExitCode


@dataclass(frozen=True)
class Figures:
    """How status scrapes the servers' /metrics (no Figures: it does not)."""

    interval: float
    timeout: float
    api_key: str | None = field(default=None, repr=False)


NoMetricsOpt = Annotated[
    bool,
    typer.Option(
        "--no-metrics",
        help="Skip the servers' figures (no /metrics scrapes): only the deployment state, at once.",
    ),
]
IntervalOpt = Annotated[
    float,
    typer.Option(
        "--interval",
        min=0.05,
        help="Seconds between the two scrapes of each server's /metrics (rates cover this window). "
        "All servers are scraped at the same time.",
    ),
]
MetricsTimeoutOpt = Annotated[
    float,
    typer.Option(
        "--metrics-timeout",
        min=0.05,
        help="Seconds one scrape of a server may take; past it the server's figures are unknown and say why.",
    ),
]
ApiKeyOpt = Annotated[
    str | None,
    typer.Option(
        "--api-key",
        envvar="LLMSERVE_API_KEY",
        show_envvar=True,
        help="Bearer key sent to the servers' /metrics: Kubernetes pods, and local servers whose key the state "
        "folder does not hold (local deployments made by this llmserve record their servers' key and use it).",
    ),
]


def status(
    name: str = typer.Argument(None, help="Deployment name. Default: every deployment."),
    history: int = typer.Option(15, "--history", help="History lines to show."),
    state_dir: StateDirOpt = None,
    target: TargetOpt = Target.local,
    namespace: NamespaceOpt = None,
    context: ContextOpt = None,
    kubeconfig: KubeconfigOpt = None,
    no_metrics: NoMetricsOpt = False,
    interval: IntervalOpt = 1.0,
    metrics_timeout: MetricsTimeoutOpt = 2.0,
    api_key: ApiKeyOpt = None,
    output: OutputOpt = OutputFormat.text,
) -> None:
    """Show deployments: gateway, each server (version, pid alive, /health, traffic weight, in flight),
    the rollout in progress (flagged `interrupted` when its CLI is gone: the next `llmserve deploy` of the
    same package resumes it, `llmserve rollback` undoes it) and recent history. Read-only.

    Exits 7 when a deployment is degraded: a routed server down or restarting (the gateway restarts
    servers that die, with backoff), failed, or the gateway not running; `degraded` lists why.

    Each server's headline figures come with it (two scrapes of its /metrics --interval apart): tokens/s in
    and out, requests running and waiting, KV-cache usage, prefix-cache hit rate, TTFT and TPOT p50/p99,
    error rate by endpoint. In JSON, each server has a `metrics` object (null where a figure is unknown; an
    `error` string when the scrape failed: "unreachable: ...", "unauthorized: ..."). A server that cannot be
    scraped does not change the exit code. --no-metrics skips them.

    Example:

        llmserve status tiny-chat -o json

        llmserve status --no-metrics

        llmserve status tiny-chat --target kubernetes -n models
    """
    figures = None if no_metrics else Figures(interval, metrics_timeout, api_key)
    if target is Target.kubernetes:
        _k8s_status(name, history, namespace, context, kubeconfig, output, figures)
        return
    from llmserve.deploy import StateStore, status_of

    store = StateStore(state_dir)
    names = [name] if name else [d.name for d in store.deployments()]
    results = [status_of(store, n, events=history) for n in names]
    if figures is not None:
        from llmserve.deploy.local_keys import key_files

        # The servers want the deployment's server key (the gateway's is for callers): the state has it.
        for r in results:
            key = key_files(store.root, r.deployment).backend_key() or figures.api_key
            status_figures.attach_local([r], figures.interval, figures.timeout, key)
    if output is OutputFormat.json:
        print_json(results[0].to_json() if name else {"deployments": [r.to_json() for r in results]})
    else:
        if not results:
            console.print(f"no deployments in {store.root}", highlight=False)
        for r in results:
            render_status(r)
            status_figures.render_local(r, console)
    if any(r.degraded for r in results):
        raise typer.Exit(ExitCode.ENGINE)


def _k8s_status(name, history, namespace, context, kubeconfig, output, figures: Figures | None) -> None:
    from llmserve.deploy.kubernetes.cluster import L_DEPLOYMENT, api_call

    d = kube_deployer(None, namespace, context, kubeconfig)
    if name:
        names = [name]
    else:
        cms = api_call("list ConfigMaps", d.c.core.list_namespaced_config_map, d.ns, label_selector=L_DEPLOYMENT).items
        names = sorted(cm.metadata.labels[L_DEPLOYMENT] for cm in cms)
    results = [d.status(n, events=history) for n in names]
    if figures is not None:
        pods = {
            r.deployment: api_call(
                "list Pods", d.c.core.list_namespaced_pod, d.ns, label_selector=f"{L_DEPLOYMENT}={r.deployment}"
            ).items
            for r in results
        }
        status_figures.attach_kubernetes(results, pods, figures.interval, figures.timeout, figures.api_key)
    if output is OutputFormat.json:
        print_json(results[0].to_json() if name else {"deployments": [r.to_json() for r in results]})
        return
    if not results:
        console.print(f"no deployments in namespace {d.ns}", highlight=False)
    for r in results:
        render_status(r)
        note_open_regional(d, r.deployment)  # deploy --contexts' journal (llmserve.cli.deploy_regions)
        status_figures.render_kubernetes(r, console)


def register(app: typer.Typer) -> None:
    app.command("status")(status)
