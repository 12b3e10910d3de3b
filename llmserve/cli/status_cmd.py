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
    state_dir: Path = typer.Option(None, "--state-dir", help="State folder. Default: $LLMSERVE_STATE_DIR or ~/.local/share/llmserve/deploy."),
    output: OutputFormat = typer.Option(OutputFormat.text, "--output", "-o", help="text or json."),
) -> None:
    """Show deployments: gateway, each server (version, pid alive, /health, traffic weight, in flight),
    the rollout in progress (flagged `interrupted` when its CLI is gone: the next `llmserve deploy` of the
    same package resumes it, `llmserve rollback` undoes it) and recent history. Read-only.

    Example:

        llmserve status tiny-chat -o json
    """
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


def _ago(ts: float | None) -> str:
    if not ts:
        return "-"
    s = time.time() - ts
    return f"{s:.0f}s ago" if s < 120 else f"{s / 60:.0f}m ago"


def render_status(r: dict) -> None:
    gw = r["gateway"]
    console.print(f"[bold]{escape(r['deployment'])}[/] (model {escape(r['model_id'])})  gateway {gw['url']} "
                  f"{'[green]up[/]' if gw['alive'] else '[red]down[/]'}  routes generation {r['routes']['generation']}"
                  + (f"  [dim]{r['action']}[/]" if r.get("action") else ""), highlight=False)
    table = Table(show_lines=False)
    for col in ("instance", "version", "status", "pid", "health", "weight", "by version", "in flight", "last request", "url"):
        table.add_column(col)
    for i in r["instances"]:
        table.add_row(str(i["instance"]), f"v{i['version']}", i["status"], f"{i['pid']}{'' if i['alive'] else ' (dead)'}",
                      str(i["health"] or "-"), f"{i['weight']}%", "yes" if i["routable_by_version"] else "no",
                      str(i["inflight"]), _ago(i["last_request"]), i["url"])
    console.print(table)
    o = r.get("open_rollout")
    if o:
        flag = "[red]interrupted[/] " if o.get("interrupted") else ""
        console.print(f"{flag}rollout #{o['id']} {o['strategy']} phase {o['phase']} step {o['step']}/{len(o['steps'])}",
                      highlight=False)
        if o.get("interrupted"):
            console.print(f"hint: `llmserve deploy {o['package']}` resumes it; `llmserve rollback {r['deployment']}` "
                          "undoes it.", highlight=False, markup=False)
    if r.get("rollout"):
        ro = r["rollout"]
        console.print(f"rollout #{ro['id']} {ro['status']} in {ro.get('seconds', 0):.1f} s", highlight=False)
    for e in r.get("history", [])[-8:]:
        console.print(f"  [dim]{time.strftime('%H:%M:%S', time.localtime(e['ts']))}[/] {escape(e['message'])}", highlight=False)


def register(app: typer.Typer) -> None:
    app.command("status")(status)
