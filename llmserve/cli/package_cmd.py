"""`llmserve package SRC`: build a versioned .llmpkg for the vLLM or Python backend."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from llmserve.cli.render import OutputFormat, byte_progress, console, print_json


def package(
    src: Path = typer.Argument(..., help="Folder holding llmserve.yaml and the weights it names."),
    out: Path = typer.Option(
        None, "--out", "-O", help="Output file (*.llmpkg) or folder. Default: dist/<modelId>-<modelVersion>.llmpkg"
    ),
    follow_links: bool = typer.Option(
        False, "--follow-links", help="Embed the files that links point to outside SRC (refused by default)."
    ),
    output: OutputFormat = typer.Option(OutputFormat.text, "--output", "-o", help="text or json."),
) -> None:
    """Build a package: validate llmserve.yaml, render the Triton model repository, write one archive
    with a sha256 digest of every file. The same inputs give a byte-identical archive.

    Example:

        llmserve package examples/json-chat --out dist/
    """
    from llmserve.packaging import build_package

    with byte_progress("packaging", enabled=output is OutputFormat.text) as (set_total, advance):
        result = build_package(src, out, progress=advance, on_total=set_total, follow_external_links=follow_links)
    data: dict[str, Any] = {
        "path": str(result.path),
        "modelId": result.manifest.modelId,
        "modelVersion": result.manifest.modelVersion,
        "backend": result.manifest.backend,
        "files": len(result.index.files),
        "bytes": result.path.stat().st_size,
        "digest": result.index.digest,
    }
    if output is OutputFormat.json:
        print_json(data)
    else:
        console.print(
            f"[green]packaged[/] {data['modelId']} v{data['modelVersion']} ({data['backend']} backend) -> "
            f"[bold]{data['path']}[/]  {data['files']} files, {data['bytes']:,} bytes, digest sha256:{data['digest'][:16]}…",
            highlight=False,
        )


def register(app: typer.Typer) -> None:
    app.command("package")(package)
