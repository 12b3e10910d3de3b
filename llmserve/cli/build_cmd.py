"""`llmserve build PKG`: a service image from the lock (Dockerfile from templates/build/, docker SDK)."""

from __future__ import annotations

import re
import shutil
import tempfile
from pathlib import Path

import typer

from llmserve.cli.render import OutputFormat, console, err_console, print_json


def build(
    package: Path = typer.Argument(..., help="The .llmpkg to bake into the image.", show_default=False),
    lock_file: Path = typer.Option(Path("llmserve.lock"), "--lock", "-l", help="The lock the image is built from."),
    base: str = typer.Option(
        None,
        "--base",
        help="Base image reference. Default: the locked target's (a Python image for local-cpu, the Triton vLLM "
        "image of a Triton line).",
        show_default=False,
    ),
    wheelhouse: Path = typer.Option(
        None,
        "--wheelhouse",
        help="Install the locked packages from these wheels only (pip --no-index --find-links): for builds "
        "that cannot reach an index, or must not.",
        show_default=False,
    ),
    llmserve_wheel: Path = typer.Option(
        None,
        "--llmserve-wheel",
        help="The llmserve wheel to install. Default: built from the checkout this llmserve runs from.",
        show_default=False,
    ),
    vllm: str = typer.Option(
        None,
        "--vllm",
        help="The vLLM check-compat reads the import surface from: a wheel, a folder or 'installed'. Default: "
        "the wheel in --wheelhouse, else installed (local-cpu); a Triton line needs it.",
        show_default=False,
    ),
    context: Path = typer.Option(
        None,
        "--context",
        help="Write the build context here (kept). Default: a temporary folder, removed after the build.",
        show_default=False,
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="Render and check the context; build nothing."),
    push: str = typer.Option(
        None,
        "--push",
        help="After the build, push both tags to this registry (HOST[:PORT][/PATH]).",
        show_default=False,
    ),
    output: OutputFormat = typer.Option(OutputFormat.text, "--output", "-o", help="text or json."),
) -> None:
    """Build the service image of a package: the locked engine stack, llmserve, the package, a non-root
    user, a health check and an entrypoint that runs `llmserve serve` on the package.

    check-compat runs on the rendered context first; a misfit stops the build (exit 6). The image is
    tagged `<modelId>:<modelVersion>` and `<modelId>:<package digest, 12 hex>` and labelled with the lock
    digest, the package digest and the pinned versions. The engine is any Docker Engine API: DOCKER_HOST,
    else the default socket (`podman system service` serves one).

    Exit codes: 0 built (and pushed), 3 bad input, 5 unknown base, 6 check-compat failed,
    7 a build step failed, 8 no engine reachable or the push was refused.

    Examples:

        llmserve build dist/tiny-chat-1.llmpkg --dry-run --context build/tiny-chat

        DOCKER_HOST=unix:///run/podman/podman.sock llmserve build dist/tiny-chat-1.llmpkg --wheelhouse wheels/

        llmserve build dist/tiny-chat-1.llmpkg --push registry.example.com:5000/models --output json
    """
    from llmserve.build import check_context, render_context, write_report

    out = context or Path(tempfile.mkdtemp(prefix="llmserve-build-")) / "context"
    json_out = output is OutputFormat.json
    try:
        ctx = render_context(package, lock_file, out, base=base, wheelhouse=wheelhouse, llmserve_wheel=llmserve_wheel)
        try:
            check_context(ctx, vllm, wheelhouse)
        finally:
            write_report(ctx)
        if not json_out:
            err_console.print(
                f"[green]context[/] {out} (check-compat fits against {ctx.checked_against}); base {ctx.base}",
                highlight=False,
            )
        if dry_run:
            _report({**ctx.to_dict(), "built": False}, json_out)
            return
        from llmserve.build.engine import connect, run_build
        from llmserve.build.engine import push as push_image

        client = connect()
        progress = _progress(json_out)
        result = run_build(client, ctx, progress)
        if push:
            result.pushed = push_image(client, result.image_id, ctx, push, progress)
        _report({**ctx.to_dict(), "built": True, **result.to_dict()}, json_out)
    finally:
        if context is None:
            shutil.rmtree(out.parent, ignore_errors=True)


_ERROR_LINE = re.compile(r"^(error|fatal)\b|\berror:|^ERROR\b", re.I)


def _progress(json_out: bool):
    """Build output as it streams, on stderr (plain lines for scripts and JSON). On a terminal: each step
    bold on one line (a long RUN cut to the width: the whole step is in the Dockerfile and in any
    error), its output dim, error lines red so they stand out of pip's and the engine's chatter."""
    from rich.markup import escape
    from rich.text import Text

    def show(kind: str, text: str) -> None:
        if json_out or not err_console.is_terminal:
            err_console.print(text, markup=False, highlight=False, soft_wrap=True)
        elif kind in ("step", "push"):
            err_console.print(Text(text, style="bold"), overflow="ellipsis", no_wrap=True, highlight=False)
        elif _ERROR_LINE.search(text):
            err_console.print(f"[red]  {escape(text)}[/]", highlight=False, soft_wrap=True)
        else:
            err_console.print(f"[dim]  {escape(text)}[/]", highlight=False, soft_wrap=True)

    return show


def _report(data: dict, json_out: bool) -> None:
    if json_out:
        print_json(data)
        return
    if not data["built"]:
        console.print(f"dry run: context in {data['context']} (Dockerfile, build.json); nothing built", highlight=False)
        console.print(f"would tag: {', '.join(data['tags'])}", highlight=False)
        return
    console.print(f"[green]built[/] {data['image'][:19]} in {data['seconds']} s on {data['engine']}", highlight=False)
    console.print(f"tags: {', '.join(data['tags'])}", highlight=False)
    for ref in data["pushed"]:
        console.print(f"pushed {ref}", highlight=False)


def register(app: typer.Typer) -> None:
    app.command("build")(build)
