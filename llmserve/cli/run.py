"""Run the Typer app and turn LLMServeError into a two-line message and its exit code.

A command whose optional extra is not installed (a ModuleNotFoundError for a module in
llmserve.errors.MODULE_EXTRAS) ends as a MissingExtraError that names the extra to install."""

from __future__ import annotations

import sys
import traceback

import typer
from rich.markup import escape

from llmserve.cli.render import OutputFormat, debug_enabled, err_console, render_error
from llmserve.errors import ExitCode, LLMServeError, missing_extra


def _wants_json(argv: list[str]) -> bool:
    pairs = zip(argv, [*argv[1:], ""], strict=False)
    return any(a in ("--output=json", "-ojson") or (a in ("--output", "-o") and b == "json") for a, b in pairs)


def run_app(app: typer.Typer, argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = typer.main.get_command(app)
    try:
        # Standalone mode lets Click render usage errors (exit 2) and --help itself; our own
        # errors propagate out of it and are rendered here.
        command.main(args=argv, prog_name="llmserve", standalone_mode=True)
        return ExitCode.OK
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except LLMServeError as exc:
        return _render(missing_extra(exc) or exc, exc, argv)
    except KeyboardInterrupt:
        err_console.print("interrupted")
        return 130
    except Exception as exc:
        extra = missing_extra(exc)
        if extra is not None:
            return _render(extra, exc, argv)
        # a bug: say so plainly, keep the traceback for LLMSERVE_DEBUG
        if debug_enabled():
            traceback.print_exc()
        err_console.print(f"[bold red]internal error[/]: {escape(f'{type(exc).__name__}: {exc}')}", highlight=False)
        err_console.print("hint: rerun with LLMSERVE_DEBUG=1 and report the traceback.", highlight=False, markup=False)
        return ExitCode.INTERNAL


def _render(error: LLMServeError, raised: BaseException, argv: list[str]) -> int:
    if debug_enabled():
        traceback.print_exception(raised)
    render_error(error, OutputFormat.json if _wants_json(argv) else OutputFormat.text)
    return error.exit_code
