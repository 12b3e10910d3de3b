"""Rendering shared by every command: errors, JSON output, progress bars."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from enum import Enum
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from llmserve.errors import LLMServeError


def _console(stderr: bool = False) -> Console:
    # Piped output (CI logs, `| less`) gets a wide fixed width instead of rich's 80 columns,
    # so tables keep one row per line.
    probe = Console(stderr=stderr)
    return probe if probe.is_terminal else Console(stderr=stderr, width=max(probe.width, 160))


console = _console()
err_console = _console(stderr=True)


class OutputFormat(str, Enum):
    text = "text"
    json = "json"


def debug_enabled() -> bool:
    return os.environ.get("LLMSERVE_DEBUG", "") not in ("", "0", "false")


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False) + "\n")
    sys.stdout.flush()


def render_error(exc: LLMServeError, fmt: OutputFormat = OutputFormat.text) -> None:
    if fmt is OutputFormat.json:
        print_json(exc.to_dict())
        return
    lines = exc.message.splitlines() or [""]
    err_console.print(f"[bold red]error[/] [dim]({exc.code})[/]: {escape(lines[0])}", highlight=False, soft_wrap=True)
    for line in lines[1:]:
        err_console.print(f"  {escape(line)}", highlight=False, soft_wrap=True)
    for detail in exc.details:
        table = Table(title=detail.title, show_lines=False)
        for col in detail.columns:
            table.add_column(col)
        for row in detail.rows:
            style = None if str(row[-1]).startswith("ok") else "red"
            table.add_row(*[escape(str(c)) for c in row], style=style)
        err_console.print(table)
    if exc.hint:
        err_console.print(f"[bold cyan]hint[/]: {escape(exc.hint)}", highlight=False, soft_wrap=True)


@contextmanager
def byte_progress(description: str, enabled: bool = True) -> Iterator[tuple]:
    """Yield (set_total, advance) callbacks driving a rich progress bar on stderr."""
    if not enabled or not err_console.is_terminal:
        yield (lambda total: None), (lambda n: None)
        return
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TimeRemainingColumn(),
        console=err_console,
        transient=True,
    ) as progress:
        task = progress.add_task(description, total=None)
        yield (lambda total: progress.update(task, total=total)), (lambda n: progress.advance(task, n))
