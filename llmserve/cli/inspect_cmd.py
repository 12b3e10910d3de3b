"""`llmserve inspect PKG`: show and verify a package without unpacking it."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.syntax import Syntax
from rich.table import Table

from llmserve.cli.render import OutputFormat, console, print_json


def inspect(
    pkg: Path = typer.Argument(..., help="A .llmpkg file."),
    output: OutputFormat = typer.Option(OutputFormat.text, "--output", "-o", help="text or json."),
) -> None:
    """Print a package's manifest, files, sizes and sha256 digests, verifying every file against the
    digest index (exit 4 on any mismatch).

    Example:

        llmserve inspect dist/tiny-chat-1.llmpkg --output json
    """
    from llmserve.packaging.inspection import inspect_package

    report = inspect_package(pkg)
    if output is OutputFormat.json:
        print_json(report.to_dict())
        return
    console.print(f"[bold]{pkg}[/]  digest sha256:{report.digest}", highlight=False)
    console.print(Syntax(report.manifest_yaml, "yaml", theme="ansi_dark", background_color="default"))
    table = Table(show_header=True, header_style="bold")
    table.add_column("file", overflow="fold")
    table.add_column("bytes", justify="right")
    table.add_column("sha256", overflow="fold", min_width=64)
    for f in report.files:
        table.add_row(f.path, f"{f.size:,}", f.sha256)
    console.print(table)
    console.print(f"[green]verified[/]: {len(report.files)} files, {report.total_size:,} bytes match their digests")
    console.print(report.cache.describe(), highlight=False)


def register(app: typer.Typer) -> None:
    app.command("inspect")(inspect)
