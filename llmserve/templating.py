"""Jinja2 environment over the shipped templates/ folder."""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from pathlib import Path

import jinja2


def templates_dir() -> Path:
    # In a wheel the templates ship as llmserve/templates; in a source checkout (editable install)
    # they live at the repository top, next to the package.
    packaged = Path(str(resources.files("llmserve"))) / "templates"
    if packaged.is_dir():
        return packaged
    source_tree = Path(__file__).resolve().parent.parent / "templates"
    if source_tree.is_dir():
        return source_tree
    raise FileNotFoundError("llmserve templates are missing from this installation; reinstall llmserve")


@lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir())),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )


def render(name: str, **context) -> str:
    return environment().get_template(name).render(**context)
