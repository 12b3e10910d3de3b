"""What `deploy`, `status` and `rollback` share: the target options (each declared once), the
Kubernetes connection, the progress reporter and the renderers of deployment status."""

from __future__ import annotations

import time
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape
from rich.table import Table

from llmserve.cli.render import OutputFormat, console, err_console, print_json

if TYPE_CHECKING:  # the records are imported where rendered: --help stays free of the deploy package
    from llmserve.deploy.status import (
        AutoscalerStatus,
        AutoscalerUnreadable,
        ClusterStatus,
        LocalStatus,
        Outcome,
        Status,
        Teardown,
    )


class Target(str, Enum):
    local = "local"
    kubernetes = "kubernetes"


TargetOpt = Annotated[
    Target,
    typer.Option(
        "--target",
        "-t",
        help="local: `llmserve serve` processes behind a gateway on this machine, state in SQLite. "
        "kubernetes: Deployments and Services in a cluster (kubeconfig, context and namespace from the usual "
        "places), state in a ConfigMap there.",
    ),
]
StateDirOpt = Annotated[
    Path | None,
    typer.Option(
        "--state-dir",
        help="State folder (SQLite, logs, pid files). Default: $LLMSERVE_STATE_DIR or ~/.local/share/llmserve/deploy.",
    ),
]
NamespaceOpt = Annotated[
    str | None,
    typer.Option("--namespace", "-n", help="kubernetes: namespace. Default: the kubeconfig context's, else 'default'."),
]
ContextOpt = Annotated[
    str | None, typer.Option("--context", help="kubernetes: kubeconfig context. Default: the current context.")
]
KubeconfigOpt = Annotated[
    Path | None,
    typer.Option(
        "--kubeconfig", help="kubernetes: kubeconfig file. Default: $KUBECONFIG, else ~/.kube/config, else in-cluster."
    ),
]
StoreCacheOpt = Annotated[
    Path | None,
    typer.Option(
        "--cache",
        help="Store references: the store cache the package is pulled into and the servers start from. "
        "Default: the deployment's, else $LLMSERVE_STORE_CACHE, else ~/.cache/llmserve/store.",
    ),
]
OutputOpt = Annotated[
    OutputFormat, typer.Option("--output", "-o", help="text or json (the result; progress goes to stderr).")
]


def package_argument(text: str) -> Path | str:
    """A deploy's PACKAGE: a model store reference stays a string (Path() would fold the '//' of s3://)."""
    return text if text.startswith("s3://") else Path(text)


def store_options(endpoint_url: str | None, profile: str | None, region: str | None):
    """Store references: where the store is (None when all comes from the AWS configuration)."""
    if not (endpoint_url or profile or region):
        return None
    from llmserve.store import StoreOptions

    return StoreOptions(endpoint_url=endpoint_url, profile=profile, region=region)


def kube_deployer(
    report,
    namespace: str | None,
    context: str | None,
    kubeconfig: Path | None,
    pod_spec=None,
    replicas: int | None = None,
):
    """The Kubernetes target's deployer, connected the usual way (the client is imported only here: it is slow)."""
    from llmserve.deploy.kubernetes import KubernetesDeployer, connect

    cluster = connect(namespace, context, str(kubeconfig) if kubeconfig else None)
    return KubernetesDeployer(cluster, report, pod_spec, replicas)


def reporter(output: OutputFormat):
    def report(msg: str, **kw) -> None:
        style = "yellow" if kw.get("warning") else "cyan"
        err_console.print(f"[{style}]deploy[/] {msg}", highlight=False, markup=True, soft_wrap=True)

    return report


def render_result(result: Outcome, output: OutputFormat) -> None:
    """What a deploy or rollback did: its JSON, or the deployment's status after it with the action."""
    if output is OutputFormat.json:
        print_json(result.to_json())
        return
    if result.status is None:  # only an interrupted rollout was undone: there is no rollout of this command
        console.print(
            f"rollback of '{escape(result.deployment)}': {result.action} (rollout #{result.rollout}: "
            f"{result.recovered})",
            highlight=False,
        )
        return
    render_status(result.status, result)


def render_teardown(result: Teardown, output: OutputFormat) -> None:
    """What `deploy down` removed: its JSON, or one line."""
    from llmserve.deploy.status import ClusterTeardown

    if output is OutputFormat.json:
        print_json(result.to_json())
        return
    if isinstance(result, ClusterTeardown):
        what = f"from namespace {escape(result.namespace)} ({len(result.removed)} object(s))"
    else:
        what = f"({len(result.stopped_instances)} server(s) stopped)"
    console.print(f"[green]removed[/] {escape(result.deployment)} {what}", highlight=False)


def render_status(status: Status, outcome: Outcome | None = None) -> None:
    """One deployment as `status` shows it; with `outcome`, as a deploy or rollback left it."""
    from llmserve.deploy.status import ClusterStatus

    if isinstance(status, ClusterStatus):
        _render_cluster(status, outcome)
    else:
        _render_local(status, outcome)


def _action(outcome: Outcome | None) -> str:
    return f"  [dim]{outcome.action}[/]" if outcome is not None else ""


def _render_cluster(r: ClusterStatus, outcome: Outcome | None) -> None:
    console.print(
        f"[bold]{escape(r.deployment)}[/] (model {escape(str(r.model_id))}, {r.strategy})  namespace "
        f"{escape(r.namespace)} on {escape(r.server)}" + _action(outcome),
        highlight=False,
    )
    table = Table(show_lines=False)
    for col in ("deployment", "version", "color", "ready", "digest", "package"):
        table.add_column(col)
    for d in r.deployments:
        table.add_row(
            d.object,
            f"v{d.version}",
            d.color or "-",
            f"{d.ready}/{d.replicas}",
            (d.digest or "")[:19],
            escape(d.package or ""),
        )
    console.print(table)
    for s in r.services:
        eps = ", ".join(f"v{v}: {n}" for v, n in sorted(s.ready_endpoints_by_version.items())) or "none"
        console.print(
            f"service {s.service} -> ready endpoints {eps}"
            + (f" ({s.not_ready_endpoints} not ready)" if s.not_ready_endpoints else ""),
            highlight=False,
        )
    _render_autoscaler(r.autoscaler)
    o = r.open_rollout
    _render_rollouts(r, outcome, (len(o.plan) or 1) if o else 0, " --target kubernetes")


def _render_autoscaler(a: AutoscalerStatus | AutoscalerUnreadable | None) -> None:
    """The HorizontalPodAutoscaler on the queue (llmserve.deploy.kubernetes.autoscale.describe), and what its
    controller last said when that is not a plain yes (e.g. the queue metric unavailable)."""
    from llmserve.deploy.status import AutoscalerUnreadable

    if a is None:
        return
    if isinstance(a, AutoscalerUnreadable):
        console.print(f"autoscaler: [yellow]{escape(a.error)}[/]", highlight=False)
        return
    console.print(
        f"autoscaler {a.object} -> {a.target}: {a.min_replicas}..{a.max_replicas} replicas, "
        f"{a.metric} target {a.queue_target} per pod"
        + (f", last read {a.current_value}" if a.current_value is not None else "")
        + f"; now {a.current_replicas}, wants {a.desired_replicas}",
        highlight=False,
    )
    for c in a.conditions:
        if c.status != "True":
            console.print(
                f"  [yellow]{escape(str(c.type))}: {escape(str(c.reason))}[/] {escape(str(c.message or ''))}",
                highlight=False,
            )


def _ago(ts: float | None) -> str:
    if not ts:
        return "-"
    s = time.time() - ts
    return f"{s:.0f}s ago" if s < 120 else f"{s / 60:.0f}m ago"


def _render_local(r: LocalStatus, outcome: Outcome | None) -> None:
    gw = r.gateway
    console.print(
        f"[bold]{escape(r.deployment)}[/] (model {escape(r.model_id)})  gateway {gw.url} "
        + (f"grpc {gw.grpc} " if gw.grpc else "")
        + f"{'[green]up[/]' if gw.alive else '[red]down[/]'}  routes generation {r.routes.generation}"
        + _action(outcome),
        highlight=False,
    )
    table = Table(show_lines=False)
    for col in (
        "instance",
        "version",
        "status",
        "pid",
        "health",
        "restarts",
        "memory",
        "weight",
        "by version",
        "in flight",
        "last request",
        "url",
    ):
        table.add_column(col)
    for i in r.instances:
        table.add_row(
            str(i.instance),
            f"v{i.version}",
            i.status,
            f"{i.pid}{'' if i.alive else ' (dead)'}",
            str(i.health or "-") + (" [yellow]restarting[/]" if i.down_since else ""),
            str(i.restarts),
            f"{i.memory_bytes / 2**30:.1f} GiB",
            f"{i.weight}%",
            "yes" if i.routable_by_version else "no",
            str(i.inflight),
            _ago(i.last_request),
            i.url,
        )
    console.print(table)
    for why in r.degraded:
        console.print(f"[red]degraded:[/] {escape(why)}", highlight=False)
    _render_rollouts(r, outcome, len(r.open_rollout.steps) if r.open_rollout else 0, "")


def _render_rollouts(r: Status, outcome: Outcome | None, steps: int, target_flag: str) -> None:
    """The rollout in progress (with the commands that resume or undo it), this command's, recent history."""
    from llmserve.deploy.status import ClusterRolloutRecord, RolloutRecord

    o = r.open_rollout
    if o:
        flag = "[red]interrupted[/] " if o.interrupted else ""
        console.print(f"{flag}rollout #{o.id} {o.strategy} phase {o.phase} step {o.step}/{steps}", highlight=False)
        if o.interrupted:
            console.print(
                f"hint: `llmserve deploy {o.package}{target_flag}` resumes it; `llmserve rollback "
                f"{r.deployment}{target_flag}` undoes it.",
                highlight=False,
                markup=False,
            )
    ro = outcome.rollout if outcome is not None else None
    if isinstance(ro, RolloutRecord | ClusterRolloutRecord):
        console.print(f"rollout #{ro.id} {ro.status} in {ro.seconds or 0:.1f} s", highlight=False)
    for e in r.history[-8:]:
        console.print(
            f"  [dim]{time.strftime('%H:%M:%S', time.localtime(e.ts))}[/] {escape(e.message)}", highlight=False
        )
