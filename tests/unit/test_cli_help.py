"""Every command's --help: exit 0, an example, and no module of an optional extra imported (help stays
fast and works on a plain `pip install llmserve`). One fresh interpreter renders them all."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from llmserve.errors import MODULE_EXTRAS

PROBE = """
import contextlib, io, json, sys
import typer
from llmserve.cli.app import app
from llmserve.cli.run import run_app
from llmserve.errors import extra_module

def paths(cmd, ctx, path):
    yield path
    if hasattr(cmd, "list_commands"):  # a group
        for name in cmd.list_commands(ctx):
            sub = cmd.get_command(ctx, name)
            if not sub.hidden:
                yield from paths(sub, typer.Context(sub, info_name=name, parent=ctx), [*path, name])

root = typer.main.get_command(app)
helps = {}
for path in paths(root, typer.Context(root, info_name="llmserve"), []):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = run_app(app, [*path, "--help"])
    helps[" ".join(path)] = [code, out.getvalue()]
print(json.dumps({"helps": helps, "extra_modules": sorted(m for m in sys.modules if extra_module(m))}))
"""


@pytest.fixture(scope="module")
def probe() -> dict:
    p = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120, env={"COLUMNS": "200"}
    )
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def test_help_imports_no_module_of_an_extra(probe):
    assert probe["extra_modules"] == [], f"--help imported {probe['extra_modules']} (extras: {set(MODULE_EXTRAS)})"


def test_every_command_is_listed(probe):
    names = {"package", "inspect", "schema", "lock", "check-compat", "serve", "deploy", "status", "rollback"}
    assert names <= set(probe["helps"])
    assert all(name in probe["helps"][""][1] for name in names)


def test_every_help_exits_0_and_shows_an_example(probe):
    for command, (code, text) in probe["helps"].items():
        assert code == 0, command
        if command and command != "deploy":  # a group: its subcommands carry the examples
            assert "Example" in text and "llmserve " in text, f"`llmserve {command} --help` has no example"
