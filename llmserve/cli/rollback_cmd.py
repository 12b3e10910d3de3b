"""`llmserve rollback NAME`: undo an interrupted rollout, or go back to the previous version."""

from __future__ import annotations

from pathlib import Path

import typer

from llmserve.cli.render import OutputFormat, print_json


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
    """Roll NAME back. An interrupted rollout (its CLI was killed) is undone: one routing swap back to the
    last good table, then the new server is drained and stopped. Otherwise the last finished rollout is
    reversed: versioned -> its version is retired (the previous one becomes the default if needed);
    red-black -> the previous package is rolled out again, red-black.

    Example:

        llmserve rollback tiny-chat
    """
    from llmserve.cli.deploy_cmd import _render, _reporter
    from llmserve.deploy import Deployer, DeployOptions, StateStore, parse_steps

    opts = DeployOptions(
        package=Path("."),
        steps=parse_steps(steps),
        pause_s=pause,
        health_timeout_s=health_timeout,
        drain_timeout_s=drain_timeout,
    )
    if target == "kubernetes":
        from llmserve.cli.deploy_cmd import kube_deployer

        result = kube_deployer(_reporter(output), namespace, context, kubeconfig).rollback(name, to_version, opts)
    elif target == "local":
        result = Deployer(StateStore(state_dir), _reporter(output)).rollback(name, to_version, opts)
    else:
        from llmserve.deploy.errors import DeployInputError

        raise DeployInputError(f"--target '{target}': expected local or kubernetes")
    if output is OutputFormat.json:
        print_json(result)
    elif "instances" in result or "deployments" in result:
        _render(result, output)
    else:
        from llmserve.cli.render import console

        console.print(
            f"rollback of '{name}': {result.get('action')} (rollout #{result.get('rollout')}: "
            f"{result.get('recovered')})",
            highlight=False,
        )


def register(app: typer.Typer) -> None:
    app.command("rollback")(rollback)
