"""The one way tests run the CLI: the installed `llmserve` script (the real entry point) as a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

LLMSERVE = str(Path(sys.executable).parent / "llmserve")


def cli_argv(*args: object) -> list[str]:
    return [LLMSERVE, *map(str, args)]


def cli_env(env: dict[str, str] | None = None) -> dict[str, str]:
    # A wide terminal: rich wraps tables and messages at COLUMNS, tests read them whole.
    return {**os.environ, "COLUMNS": "250", **(env or {})}


def run_cli(
    *args: object, env: dict[str, str] | None = None, cwd=None, timeout: float = 300
) -> subprocess.CompletedProcess:
    """`llmserve ARGS...`: returncode, stdout and stderr as text."""
    return subprocess.run(cli_argv(*args), capture_output=True, text=True, env=cli_env(env), cwd=cwd, timeout=timeout)


def run_cli_json(
    *args: object, env: dict[str, str] | None = None, timeout: float = 600
) -> tuple[int, dict | None, str]:
    """`llmserve ARGS... -o json`: (returncode, the parsed JSON on stdout or None, stderr + stdout)."""
    p = run_cli(*args, "-o", "json", env=env, timeout=timeout)
    try:
        data = json.loads(p.stdout) if p.stdout.strip() else None
    except ValueError:
        data = None
    return p.returncode, data, p.stderr + p.stdout


def popen_cli(*args: object, log: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    """`llmserve ARGS... -o json` in the background, stdout and stderr into log."""
    return subprocess.Popen(
        cli_argv(*args, "-o", "json"), stdout=log.open("wb"), stderr=subprocess.STDOUT, env=cli_env(env)
    )
