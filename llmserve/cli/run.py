"""Run the Typer app and turn LLMServeError into a two-line message and its exit code."""

from __future__ import annotations

import sys
import traceback

import click
import typer

from llmserve.cli.render import OutputFormat, debug_enabled, err_console, render_error
from llmserve.errors import ExitCode, LLMServeError


def _wants_json(argv: list[str]) -> bool:
    for i, arg in enumerate(argv):
        if arg == "--output" and i + 1 < len(argv) and argv[i + 1] == "json":
            return True
        if arg in ("--output=json", "-ojson"):
            return True
        if arg == "-o" and i + 1 < len(argv) and argv[i + 1] == "json":
            return True
    return False


def run_app(app: typer.Typer, argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = typer.main.get_command(app)
    try:
        command.main(args=argv, prog_name="llmserve", standalone_mode=False)
        return ExitCode.OK
    except LLMServeError as exc:
        if debug_enabled():
            traceback.print_exc()
        render_error(exc, OutputFormat.json if _wants_json(argv) else OutputFormat.text)
        return exc.exit_code
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except click.exceptions.Abort:
        err_console.print("aborted")
        return 130
    except KeyboardInterrupt:
        err_console.print("interrupted")
        return 130
    except Exception as exc:  # a bug: say so plainly, keep the traceback for LLMSERVE_DEBUG
        if debug_enabled():
            traceback.print_exc()
        err_console.print(f"[bold red]internal error[/]: {type(exc).__name__}: {exc}", highlight=False)
        err_console.print("[bold cyan]hint[/]: rerun with LLMSERVE_DEBUG=1 and report the traceback.", highlight=False)
        return ExitCode.INTERNAL
