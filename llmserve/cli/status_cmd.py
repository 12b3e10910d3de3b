"""`llmserve status [NAME]`: deployments as they are now (processes checked, routes, journal, history)."""

from __future__ import annotations

import typer

from llmserve.cli.deploy_common import (
    ContextOpt,
    KubeconfigOpt,
    NamespaceOpt,
    OutputOpt,
    StateDirOpt,
    Target,
    TargetOpt,
    kube_deployer,
    render_k8s_status,
    render_status,
)
from llmserve.cli.render import OutputFormat, console, print_json


def status(
    name: str = typer.Argument(None, help="Deployment name. Default: every deployment."),
    history: int = typer.Option(15, "--history", help="History lines to show."),
    state_dir: StateDirOpt = None,
    target: TargetOpt = Target.local,
    namespace: NamespaceOpt = None,
    context: ContextOpt = None,
    kubeconfig: KubeconfigOpt = None,
    output: OutputOpt = OutputFormat.text,
) -> None:
    """Show deployments: gateway, each server (version, pid alive, /health, traffic weight, in flight),
    the rollout in progress (flagged `interrupted` when its CLI is gone: the next `llmserve deploy` of the
    same package resumes it, `llmserve rollback` undoes it) and recent history. Read-only.

    Example:

        llmserve status tiny-chat -o json

        llmserve status tiny-chat --target kubernetes -n models
    """
    if target is Target.kubernetes:
        _k8s_status(name, history, namespace, context, kubeconfig, output)
        return
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


def register(app: typer.Typer) -> None:
    app.command("status")(status)
