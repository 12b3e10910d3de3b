"""The layers contract (pyproject.toml [tool.importlinter]) catches an upward import, lazy ones included.

lint-imports runs on a copy of llmserve/ renamed to `lsprobe` (so neither the installed package nor the
editable-install finder can stand in for the copy): the copy as it is keeps the contract, the copy with
two upward imports breaks it.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PROBE = "lsprobe"


def _rename(text: str) -> str:
    return re.sub(r"\bllmserve\b", PROBE, text)


def _lint_imports() -> str:
    found = Path(sys.executable).parent / "lint-imports"
    path = str(found) if found.exists() else shutil.which("lint-imports")
    if path is None:
        pytest.fail("lint-imports not found: install the lint tools (`make lint` installs requirements/lint.txt)")
    return path


def _toml_value(value) -> str:
    return json.dumps(_rename(value) if isinstance(value, str) else [_rename(v) for v in value])


@pytest.fixture
def probe(tmp_path) -> Path:
    """tmp_path/lsprobe: every .py file of llmserve/, renamed; tmp_path/pyproject.toml: the contract, renamed."""
    for src in (REPO / "llmserve").rglob("*.py"):
        dst = tmp_path / PROBE / src.relative_to(REPO / "llmserve")
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_text(_rename(src.read_text(encoding="utf-8")), encoding="utf-8")
    config = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["importlinter"]
    lines = ["[tool.importlinter]", f"root_package = {_toml_value(config['root_package'])}"]
    for contract in config["contracts"]:
        lines += ["", "[[tool.importlinter.contracts]]", *(f"{k} = {_toml_value(v)}" for k, v in contract.items())]
    (tmp_path / "pyproject.toml").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return tmp_path


def _run(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [_lint_imports(), "--config", str(root / "pyproject.toml"), "--no-cache"],
        cwd=root,
        env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_an_upward_import_breaks_the_layers_contract(probe):
    clean = _run(probe)
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert "1 kept, 0 broken" in clean.stdout

    # errors (the bottom layer) imports the CLI at module level; packaging imports serve inside a function.
    with (probe / PROBE / "errors.py").open("a", encoding="utf-8") as fh:
        fh.write(f"\nimport {PROBE}.cli.app  # noqa: E402\n")
    with (probe / PROBE / "packaging" / "__init__.py").open("a", encoding="utf-8") as fh:
        fh.write(f"\n\ndef _lazy():\n    from {PROBE}.serve import server\n\n    return server\n")
    broken = _run(probe)
    assert broken.returncode != 0, broken.stdout
    assert "0 kept, 1 broken" in broken.stdout
    assert f"{PROBE}.errors -> {PROBE}.cli.app" in broken.stdout
    assert f"{PROBE}.packaging -> {PROBE}.serve" in broken.stdout
