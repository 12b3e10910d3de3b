"""`--contexts a,b,c` of `llmserve deploy` and `llmserve rollback` (llmserve.deploy.kubernetes.regions): the
options, one Kubernetes deployer per context, and the per-region rendering."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape
from rich.table import Table

from llmserve.cli.deploy_common import Target, kube_deployer
from llmserve.cli.render import OutputFormat, console, print_json

if TYPE_CHECKING:  # imported where rendered: --help stays free of the deploy package
    from llmserve.deploy.status import RegionalOutcome

ContextsOpt = Annotated[
    str | None,
    typer.Option(
        "--contexts",
        help="kubernetes: roll out region by region, one kubeconfig context after another (comma-separated, in "
        "order), with a gate between regions (--region-pause, --region-max-errors); a region that fails rolls "
        "back every region already moved. Journaled in ConfigMap NAME-llmserve-regions of the first context: after "
        "the CLI died, the same deploy continues it, `llmserve rollback NAME --contexts ...` undoes exactly the "
        "regions it moved (each to what it served before), and another package is refused meanwhile. "
        "Not with --context.",
    ),
]
RegionPauseOpt = Annotated[
    float,
    typer.Option(
        "--region-pause",
        min=0,
        help="--contexts: seconds each region is watched after its rollout (every Deployment ready, no restarts "
        "of the new pods, server errors within --region-max-errors) before the next region starts.",
    ),
]
RegionMaxErrorsOpt = Annotated[
    int,
    typer.Option(
        "--region-max-errors",
        min=0,
        help="--contexts: server errors (5xx) of the new version's pods allowed during a region's pause "
        "(counted where the pods' /metrics can be read).",
    ),
]


def check_contexts(contexts: str | None, context: str | None, target: Target) -> list[str] | None:
    """The parsed --contexts, or None; refused with --context or on the local target."""
    if contexts is None:
        return None
    from llmserve.deploy.errors import DeployInputError
    from llmserve.deploy.kubernetes.regions import parse_contexts

    if target is not Target.kubernetes:
        raise DeployInputError("--contexts is for --target kubernetes (one kubeconfig context per region)")
    if context is not None:
        raise DeployInputError("--context and --contexts exclude each other: give the regions with --contexts only")
    return parse_contexts(contexts)


def regional(
    contexts: list[str],
    report,
    namespace: str | None,
    kubeconfig: Path | None,
    pause_s: float,
    max_errors: int,
    pod_spec=None,
    replicas: int | None = None,
    setup=None,
):
    """The RegionalRollout over `contexts`, journaled in the clusters; `setup(deployer)` finishes each context's
    deployer (API key...)."""
    from llmserve.deploy.kubernetes.region_journal import ConfigMapJournal
    from llmserve.deploy.kubernetes.regions import GateOptions, RegionalRollout

    def connect(ctx: str):
        k = kube_deployer(report, namespace, ctx, kubeconfig, pod_spec, replicas)
        return setup(k) if setup else k

    return RegionalRollout(
        connect,
        contexts,
        report,
        GateOptions(pause_s=pause_s, max_errors=max_errors),
        journal=lambda k: ConfigMapJournal(k.c),
    )


def render_regions(result: RegionalOutcome, output: OutputFormat) -> None:
    if output is OutputFormat.json:
        print_json(result.to_json())
        return
    from llmserve.deploy.status import RegionDeploy

    console.print(f"[bold]{escape(str(result.deployment))}[/]  {result.action}", highlight=False)
    table = Table(show_lines=False)
    for col in ("context", "namespace", "result", "version", "gate"):
        table.add_column(col)
    for r in result.regions:
        gate = r.gate if isinstance(r, RegionDeploy) else None  # a rollback has no gate
        gate_text = "-"
        if gate is not None:
            errs = "-" if gate.errors is None else str(gate.errors)
            gate_text = f"{'failed' if gate.failed else 'ok'} (restarts {gate.restarts}, errors {errs})"
        table.add_row(
            escape(r.context),
            escape(r.namespace or "-"),
            r.result,
            f"v{r.version}" if r.version is not None else "-",
            gate_text,
        )
    console.print(table)


def note_open_regional(k, name: str) -> None:
    """`llmserve status` in one context: a line about an open regional rollout journaled there (the first
    context of its --contexts), with the two ways out."""
    from llmserve.deploy.kubernetes.cluster import KubernetesAPIError
    from llmserve.deploy.kubernetes.region_journal import ConfigMapJournal

    try:
        rec = next((r for r in ConfigMapJournal(k.c).load(name) if r.is_open), None)
    except KubernetesAPIError:  # status shows the deployment itself even where this extra read is refused
        return
    if rec is None:
        return
    ctx = ",".join(rec.contexts)
    console.print(
        f"[yellow]regional rollout #{rec.id} of {escape(rec.package)} is {rec.status}[/] ({escape(rec.summary())}; "
        f"last written by {escape(rec.cli or '?')}): continue it with `llmserve deploy {escape(rec.package)} --target "
        f"kubernetes --contexts {escape(ctx)}` or undo it with `llmserve rollback {escape(name)} --target kubernetes "
        f"--contexts {escape(ctx)}`",
        highlight=False,
    )
