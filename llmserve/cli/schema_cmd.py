"""`llmserve schema`: print the JSON Schema of llmserve.yaml."""

from __future__ import annotations

import typer

from llmserve.cli.render import print_json


def schema() -> None:
    """Print the JSON Schema of the package manifest (llmserve.yaml), for editors and CI validation.

    Example:

        llmserve schema > llmserve.schema.json
    """
    from llmserve.formats.manifest import manifest_json_schema

    print_json(manifest_json_schema())


def register(app: typer.Typer) -> None:
    app.command("schema")(schema)
