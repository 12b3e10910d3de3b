"""`llmserve status [NAME]`: deployments as they are now (processes checked, routes, journal, history)."""

from __future__ import annotations

import time
from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from llmserve.cli.render import OutputFormat, console, print_json


def status(
    name: str = typer.Argument(None, help="Deployment name. Default: every deployment."),
    history: int = typer.Option(15, "--history", help="History lines to show."),
    state_dir: Path = typer.Option(
        None, "--state-dir", help="State folder. Default: $LLMSERVE_STATE_DIR or ~/.local/share/llmserve/deploy."
    ),
    target: str = typer.Option("local", "--target", "-t", help="local or kubernetes."),
    namespace: str = typer.Option(None, "--namespace", "-n", help="kubernetes: namespace. Default: the context's."),
    context: str = typer.Option(None, "--context", help="kubernetes: kubeconfig context. Default: the current one."),
    kubeconfig: Path = typer.Option(
        None, "--kubeconfig", help="kubernetes: kubeconfig file. Default: $KUBECONFIG or ~/.kube/config."
    ),
    output: OutputFormat = typer.Option(OutputFormat.text, "--output", "-o", help="text or json."),
) -> None:
    """Show deployments: gateway, each server (version, pid alive, /health, traffic weight, in flight),
    the rollout in progress (flagged `interrupted` when its CLI is gone: the next `llmserve deploy` of the
    same package resumes it, `llmserve rollback` undoes it) and recent history. Read-only.

    Example:

        llmserve status tiny-chat -o json

        llmserve status tiny-chat --target kubernetes -n models
    """
    if target == "kubernetes":
        _k8s_status(name, history, namespace, context, kubeconfig, output)
        return
    if target != "local":
        from llmserve.deploy.errors import DeployInputError

        raise DeployInputError(f"--target '{target}': expected local or kubernetes")
    from llmserve.deploy import StateStore, status_of

    store = StateStore(state_dir)
    names = [name] if name else [d.name for d in store.deployments()]
    results = [status_of(store, n, events=history) for n in names]
    if output is OutputFormat.json:
        print_json(results[0] if name else {"deployments": results})
        return
    if not results:
        console.print(f"no deployments in {store.root}", highlight=False)
    for r in results:
        render_status(r)


def _k8s_status(name, history, namespace, context, kubeconfig, output) -> None:
    from llmserve.cli.deploy_cmd import kube_deployer
    from llmserve.deploy.kubernetes.cluster import L_DEPLOYMENT, api_call

    d = kube_deployer(None, namespace, context, kubeconfig)
    if name:
        names = [name]
    else:
        cms = api_call("list ConfigMaps", d.c.core.list_namespaced_config_map, d.ns, label_selector=L_DEPLOYMENT).items
        names = sorted(cm.metadata.labels[L_DEPLOYMENT] for cm in cms)
    results = [d.status(n, events=history) for n in names]
    if output is OutputFormat.json:
        print_json(results[0] if name else {"deployments": results})
        return
    if not results:
        console.print(f"no deployments in namespace {d.ns}", highlight=False)
    for r in results:
        render_k8s_status(r)


def render_k8s_status(r: dict) -> None:
    console.print(
        f"[bold]{escape(r['deployment'])}[/] (model {escape(str(r['model_id']))}, {r['strategy']})  namespace "
        f"{escape(r['namespace'])} on {escape(r['server'])}" + (f"  [dim]{r['action']}[/]" if r.get("action") else ""),
        highlight=False,
    )
    table = Table(show_lines=False)
    for col in ("deployment", "version", "color", "ready", "digest", "package"):
        table.add_column(col)
    for i in r["deployments"]:
        table.add_row(
            i["object"],
            f"v{i['version']}",
            i["color"] or "-",
            f"{i['ready']}/{i['replicas']}",
            (i["digest"] or "")[:19],
            escape(i["package"] or ""),
        )
    console.print(table)
    for s in r["services"]:
        eps = ", ".join(f"v{v}: {n}" for v, n in sorted(s["ready_endpoints_by_version"].items())) or "none"
        console.print(
            f"service {s['service']} -> ready endpoints {eps}"
            + (f" ({s['not_ready_endpoints']} not ready)" if s["not_ready_endpoints"] else ""),
            highlight=False,
        )
    o = r.get("open_rollout")
    if o:
        flag = "[red]interrupted[/] " if o.get("interrupted") else ""
        console.print(
            f"{flag}rollout #{o['id']} {o['strategy']} phase {o['phase']} step {o['step']}/{len(o['plan'] or [1])}",
            highlight=False,
        )
        if o.get("interrupted"):
            console.print(
                f"hint: `llmserve deploy {o['package']} --target kubernetes` resumes it; `llmserve rollback "
                f"{r['deployment']} --target kubernetes` undoes it.",
                highlight=False,
                markup=False,
            )
    if r.get("rollout"):
        ro = r["rollout"]
        console.print(f"rollout #{ro['id']} {ro['status']} in {ro.get('seconds', 0):.1f} s", highlight=False)
    for e in r.get("history", [])[-8:]:
        console.print(
            f"  [dim]{time.strftime('%H:%M:%S', time.localtime(e['ts']))}[/] {escape(e['message'])}", highlight=False
        )


def _ago(ts: float | None) -> str:
    if not ts:
        return "-"
    s = time.time() - ts
    return f"{s:.0f}s ago" if s < 120 else f"{s / 60:.0f}m ago"


def render_status(r: dict) -> None:
    gw = r["gateway"]
    console.print(
        f"[bold]{escape(r['deployment'])}[/] (model {escape(r['model_id'])})  gateway {gw['url']} "
        f"{'[green]up[/]' if gw['alive'] else '[red]down[/]'}  routes generation {r['routes']['generation']}"
        + (f"  [dim]{r['action']}[/]" if r.get("action") else ""),
        highlight=False,
    )
    table = Table(show_lines=False)
    for col in (
        "instance",
        "version",
        "status",
        "pid",
        "health",
        "weight",
        "by version",
        "in flight",
        "last request",
        "url",
    ):
        table.add_column(col)
    for i in r["instances"]:
        table.add_row(
            str(i["instance"]),
            f"v{i['version']}",
            i["status"],
            f"{i['pid']}{'' if i['alive'] else ' (dead)'}",
            str(i["health"] or "-"),
            f"{i['weight']}%",
            "yes" if i["routable_by_version"] else "no",
            str(i["inflight"]),
            _ago(i["last_request"]),
            i["url"],
        )
    console.print(table)
    o = r.get("open_rollout")
    if o:
        flag = "[red]interrupted[/] " if o.get("interrupted") else ""
        console.print(
            f"{flag}rollout #{o['id']} {o['strategy']} phase {o['phase']} step {o['step']}/{len(o['steps'])}",
            highlight=False,
        )
        if o.get("interrupted"):
            console.print(
                f"hint: `llmserve deploy {o['package']}` resumes it; `llmserve rollback {r['deployment']}` undoes it.",
                highlight=False,
                markup=False,
            )
    if r.get("rollout"):
        ro = r["rollout"]
        console.print(f"rollout #{ro['id']} {ro['status']} in {ro.get('seconds', 0):.1f} s", highlight=False)
    for e in r.get("history", [])[-8:]:
        console.print(
            f"  [dim]{time.strftime('%H:%M:%S', time.localtime(e['ts']))}[/] {escape(e['message'])}", highlight=False
        )


def register(app: typer.Typer) -> None:
    app.command("status")(status)
