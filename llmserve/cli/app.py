"""The `llmserve` command: wiring only. Each command lives in its own module and imports heavy
libraries (vLLM, torch) only inside the command body, so `llmserve --help` stays fast."""

from __future__ import annotations

import sys

import typer

from llmserve import __version__
from llmserve.cli import (
    build_cmd,
    check_compat_cmd,
    deploy_cmd,
    inspect_cmd,
    lock_cmd,
    metrics_cmd,
    package_cmd,
    rollback_cmd,
    schema_cmd,
    serve_cmd,
    status_cmd,
    store_cmd,
)

app = typer.Typer(
    name="llmserve",
    help=(
        "Take an LLM from a folder of weights to a running, observable service on vLLM and Triton.\n\n"
        "Exit codes: 0 ok, 1 internal error, 2 usage, 3 invalid input, 4 integrity, 5 not found, "
        "6 incompatible or missing extra, 7 engine, 8 unavailable. Set LLMSERVE_DEBUG=1 for tracebacks."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="markdown",
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"llmserve {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    pass


package_cmd.register(app)
inspect_cmd.register(app)
schema_cmd.register(app)
lock_cmd.register(app)
check_compat_cmd.register(app)
build_cmd.register(app)
serve_cmd.register(app)
deploy_cmd.register(app)
status_cmd.register(app)
rollback_cmd.register(app)
metrics_cmd.register(app)
store_cmd.register(app)


def main() -> None:
    from llmserve.cli.run import run_app

    sys.exit(run_app(app))


if __name__ == "__main__":
    main()
