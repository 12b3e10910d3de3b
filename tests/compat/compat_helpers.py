"""Helpers shared by the compat tests (imported by module name; conftest.py holds the fixtures).

The CLI runner is the suite's one runner, support.cli.run_cli (re-exported here for the compat tests)."""

from __future__ import annotations

import base64
import hashlib
import os
import textwrap
import zipfile
from pathlib import Path

from support.cli import run_cli

__all__ = [
    "DATA",
    "GOLDEN",
    "OLD_VLLM",
    "check_golden",
    "make_wheel",
    "run_cli",
    "sha256_of",
    "wheel_cache",
    "write_source",
]

HERE = Path(__file__).parent
GOLDEN = HERE / "golden"
DATA = HERE / "data"

# A vLLM release that still has vllm.engine.metrics: the one Triton 25.09's image ships.
OLD_VLLM = "0.10.1.1"


def wheel_cache() -> Path:
    return Path(os.environ.get("LLMSERVE_TEST_WHEELS") or Path.home() / ".cache" / "llmserve-test-wheels")


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("LLMSERVE_UPDATE_GOLDEN") == "1":
        path.write_text(text, encoding="utf-8")
    assert path.read_text(encoding="utf-8") == text, (
        f"{name} differs from the golden file (LLMSERVE_UPDATE_GOLDEN=1 to accept)"
    )


def write_source(
    root: Path,
    *,
    plugins: dict[str, dict[str, str]] | None = None,
    group: str = "vllm.logits_processors",
    entry: str = "proc_plugin.processor:Proc",
    extra: str = "",
    backend: str = "vllm",
) -> Path:
    """A package source folder (fake weights: check-compat never reads them) with plugin code."""
    (root / "model").mkdir(parents=True, exist_ok=True)
    (root / "model" / "config.json").write_text("{}")
    (root / "model" / "model.safetensors").write_bytes(b"\0" * 16)
    text = f"modelId: demo\nmodelVersion: 1\nbackend: {backend}\n"
    for name, files in (plugins or {}).items():
        for rel, body in files.items():
            p = root / "plugins" / name / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(textwrap.dedent(body))
    if plugins:
        text += "plugins:\n" + "".join(
            f"  - name: {name}\n    source: plugins/{name}\n    entryPoint: {entry}\n    group: {group}\n"
            for name in plugins
        )
    (root / "llmserve.yaml").write_text(text + extra)
    return root


def make_wheel(folder: Path, name: str, version: str, body: str = "") -> Path:
    """A tiny pure-Python wheel `name==version` (one module whose text is `body`), for pip to install offline."""
    folder.mkdir(parents=True, exist_ok=True)
    dist = name.replace("-", "_")
    info = f"{dist}-{version}.dist-info"
    files = {
        f"{dist}/__init__.py": f"VALUE = {body!r}\n",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: llmserve-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    files[f"{info}/RECORD"] = "\n".join([*record, f"{info}/RECORD,,"]) + "\n"
    wheel = folder / f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for path, text in files.items():
            zf.writestr(zipfile.ZipInfo(path, date_time=(2026, 1, 1, 0, 0, 0)), text)
    return wheel


def sha256_of(path: Path) -> str:
    return "sha256:" + hashlib.sha256(Path(path).read_bytes()).hexdigest()
