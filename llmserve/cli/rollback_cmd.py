"""`llmserve rollback NAME`: undo an interrupted rollout, or go back to the previous version."""

from __future__ import annotations

from pathlib import Path

import typer

from llmserve.cli.deploy_common import (
    ContextOpt,
    KubeconfigOpt,
    NamespaceOpt,
    OutputOpt,
    StateDirOpt,
    StoreCacheOpt,
    Target,
    TargetOpt,
    kube_deployer,
    render_result,
    reporter,
    store_options,
)
from llmserve.cli.deploy_regions import ContextsOpt, check_contexts, regional, render_regions
from llmserve.cli.render import OutputFormat
from llmserve.cli.store_cmd import EndpointOpt, ProfileOpt, RegionOpt


def rollback(
    name: str = typer.Argument(..., help="Deployment name."),
    to_version: int = typer.Option(
        None, "--to-version", help="Red-black back to the newest package deployed with this modelVersion."
    ),
    steps: str = typer.Option("10,25,50,100", "--steps", help="Steps of the red-black shift back."),
    pause: float = typer.Option(5.0, "--pause", help="Seconds at each step."),
    health_timeout: float = typer.Option(
        300.0, "--health-timeout", help="Seconds the restarted version gets to be healthy."
    ),
    drain_timeout: float = typer.Option(30.0, "--drain-timeout", help="Seconds in-flight requests get."),
    cache: StoreCacheOpt = None,
    endpoint_url: EndpointOpt = None,
    profile: ProfileOpt = None,
    region: RegionOpt = None,
    state_dir: StateDirOpt = None,
    target: TargetOpt = Target.local,
    namespace: NamespaceOpt = None,
    context: ContextOpt = None,
    contexts: ContextsOpt = None,
    kubeconfig: KubeconfigOpt = None,
    output: OutputOpt = OutputFormat.text,
) -> None:
    """Roll NAME back. An interrupted rollout (its CLI was killed) is undone: one routing swap back to the
    last good table, then the new server is drained and stopped. Otherwise the last finished rollout is
    reversed: versioned -> its version is retired (the previous one becomes the default if needed);
    red-black -> the previous package is rolled out again, red-black. A previous package deployed from a
    model store (s3://...) is found in the store cache, or pulled again from the store: --endpoint-url,
    --profile and --region say where, as for `llmserve deploy`.

    Examples:

        llmserve rollback tiny-chat

        llmserve rollback tiny-chat --to-version 2 --endpoint-url http://127.0.0.1:9000

        llmserve rollback tiny-chat --target kubernetes --contexts eu-1,us-1,ap-1
    """
    from llmserve.deploy import Deployer, DeployOptions, StateStore, parse_steps

    opts = DeployOptions(
        package=Path("."),
        cache_dir=cache,
        store=store_options(endpoint_url, profile, region),
        steps=parse_steps(steps),
        pause_s=pause,
        health_timeout_s=health_timeout,
        drain_timeout_s=drain_timeout,
    )
    regions = check_contexts(contexts, context, target)
    if regions:
        rollout = regional(regions, reporter(output), namespace, kubeconfig, 0.0, 0)
        render_regions(rollout.rollback(name, to_version, opts), output)
        return
    if target is Target.kubernetes:
        result = kube_deployer(reporter(output), namespace, context, kubeconfig).rollback(name, to_version, opts)
    else:
        result = Deployer(StateStore(state_dir), reporter(output)).rollback(name, to_version, opts)
    render_result(result, output)


def register(app: typer.Typer) -> None:
    app.command("rollback")(rollback)
