"""`llmserve.lock`: the pinned engine stack a deployment runs on, written by `llmserve lock`.

The lock is YAML with a fixed key order. It is self-contained: the import surface the backend needs
and the exact package set (local-cpu) travel inside it, so `check-compat` judges against what was
locked, not against whatever knowledge base the installed llmserve happens to ship.

    lockVersion: 1
    target:      {name, kind: local-cpu|triton, release, image}
    stack:       {python, vllm: {distribution, version, source}, torch, tritonclient}
    interfaces:  {structuredOutputs: {key, params}, logitsProcessor: {name, module, base},
                  importSurface: {id, files: {file: {module: [symbols]}}}}
    env:         {VLLM_USE_V2_MODEL_RUNNER: "0", ...}   environment the stack needs at run time
    packages:    {digest, excluded: {name: why}, requirements: [name==version],
                  hashes: {name: [sha256:hex, ...]}}
                 (local-cpu only; `llmserve lock --export requirements` writes them as a pip file,
                 one `name==version --hash=sha256:...` line per package)

`packages.hashes` holds, per pinned package, the sha256 of every distribution file pip may install
for it on the machines the stack targets (x86-64 Linux, CPython 3.11); with it the export installs
under `pip install --require-hashes`. It is all or nothing (pip refuses a file where one pin lacks a
hash), and absent in locks written before hashes existed: those still load and export without hashes.
`packages.digest` is the sha256 of the pip lines exactly as exported (hashes included), so it names
the bytes that get installed and catches a hand-edited hash; for a lock without hashes the lines are
plain `name==version` and the digest is the one such locks always had.
    resolved:    {by: llmserve X, at: ISO-8601 UTC, knowledgeBase: sha256, inputs: [...]}
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from llmserve.errors import InvalidInputError, NotFoundError
from llmserve.formats.safe_yaml import dump_yaml, load_yaml


class LockFileError(InvalidInputError):
    """llmserve.lock is missing a key, has a wrong value, or is not YAML."""

    code = "invalid-lock"
    default_hint = (
        "Regenerate it: `llmserve lock --stack <target> --upgrade` (the lock is written by the tool, not by hand)."
    )


class LockNotFoundError(NotFoundError):
    code = "lock-not-found"
    default_hint = "Create one: `llmserve lock --stack local-cpu` (or a Triton line, e.g. --stack triton-26.02)."


LOCK_NAME = "llmserve.lock"
_SHA256 = re.compile(r"^sha256:[0-9a-f]{64}$")
LOCK_VERSION: Final = 1
HEADER = (
    "# llmserve.lock: the pinned engine stack. Written by `llmserve lock`; do not edit by hand.\n"
    "# Move it with `llmserve lock --upgrade`; prove fit with `llmserve check-compat`.\n"
)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LockTarget(_Strict):
    name: str
    kind: Literal["local-cpu", "triton"]
    release: str | None = None
    image: str | None = None


class VllmPin(_Strict):
    distribution: str
    version: str = Field(pattern=r"^\d+(\.\d+)*([a-z0-9.+-]*)$")
    source: Literal["knowledge-base", "from-image"] = "knowledge-base"


class Stack(_Strict):
    python: str
    vllm: VllmPin
    torch: str | None = None
    tritonclient: str | None = None


class StructuredOutputsPin(_Strict):
    key: str
    params: str


class ProcessorPin(_Strict):
    name: str
    module: str | None = None
    base: str | None = None


class ImportSurface(_Strict):
    id: str
    files: dict[str, dict[str, list[str]]]


class Interfaces(_Strict):
    structuredOutputs: StructuredOutputsPin
    logitsProcessor: ProcessorPin
    importSurface: ImportSurface


class Packages(_Strict):
    digest: str
    excluded: dict[str, str] = Field(default_factory=dict)
    requirements: list[str]
    hashes: dict[str, list[str]] | None = None

    @model_validator(mode="after")
    def _consistent(self) -> Packages:
        names = []
        for line in self.requirements:
            if "==" not in line:
                raise ValueError(f"packages.requirements: '{line}' is not an exact pin (name==version)")
            names.append(line.split("==", 1)[0])
        if self.hashes is not None:
            missing = sorted(set(names) - set(self.hashes), key=normalize)
            if missing:
                raise ValueError(
                    f"packages.hashes: no hash for {', '.join(missing[:5])}"
                    + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
                    + " (pip --require-hashes needs one for every pin)"
                )
            unknown = sorted(set(self.hashes) - set(names), key=normalize)
            if unknown:
                raise ValueError(f"packages.hashes: {', '.join(unknown[:5])} is not in packages.requirements")
            for name, values in self.hashes.items():
                bad = [v for v in values if not _SHA256.match(v)]
                if bad or not values:
                    raise ValueError(f"packages.hashes.{name}: expected sha256:<64 hex digits>, got {bad or 'none'}")
        if self.digest != packages_digest(self.requirements, self.hashes):
            raise ValueError("packages.digest does not match packages.requirements (the file was edited by hand)")
        return self

    def pip_lines(self) -> list[str]:
        """The requirement lines as pip reads them: `name==version [--hash=sha256:...]...`."""
        return pip_lines(self.requirements, self.hashes)


class Resolution(_Strict):
    by: str
    at: str
    knowledgeBase: str
    inputs: list[str] = Field(default_factory=list)


class Lock(_Strict):
    lockVersion: Literal[1] = LOCK_VERSION
    target: LockTarget
    stack: Stack
    interfaces: Interfaces
    env: dict[str, str] = Field(default_factory=dict)
    packages: Packages | None = None
    resolved: Resolution

    def pinned(self) -> dict[str, str]:
        """Distribution name (normalized) -> exact version, from packages or the stack."""
        if self.packages:
            return {normalize(n): v for n, v in (line.split("==", 1) for line in self.packages.requirements)}
        out = {normalize(self.stack.vllm.distribution): self.stack.vllm.version}
        if self.stack.torch:
            out["torch"] = self.stack.torch
        if self.stack.tritonclient:
            out["tritonclient"] = self.stack.tritonclient
        return out

    def content_key(self) -> dict:
        """Everything but `resolved`: two locks with equal keys pin the same stack."""
        return self.model_dump(mode="json", exclude={"resolved"})


def normalize(name: str) -> str:
    """PEP 503 name normalization."""
    return re.sub(r"[-_.]+", "-", name).lower()


def pip_lines(requirements: list[str], hashes: dict[str, list[str]] | None = None) -> list[str]:
    if not hashes:
        return list(requirements)
    out = []
    for line in requirements:
        values = hashes.get(line.split("==", 1)[0], [])
        out.append(" ".join([line, *(f"--hash={v}" for v in values)]))
    return out


def packages_digest(requirements: list[str], hashes: dict[str, list[str]] | None = None) -> str:
    """sha256 of the exported pip lines; without hashes, of the plain pins (the digest older locks carry)."""
    lines = pip_lines(requirements, hashes)
    return "sha256:" + hashlib.sha256(("\n".join(lines) + "\n").encode()).hexdigest()


def dump_lock(lock: Lock) -> str:
    data = lock.model_dump(mode="json", exclude_none=True)
    return HEADER + dump_yaml(data, sort_keys=False, allow_unicode=True, default_flow_style=False, width=4096)


def parse_lock(text: str, source: str = LOCK_NAME) -> Lock:
    data = load_yaml(text, source, error=LockFileError)
    if not isinstance(data, dict):
        raise LockFileError(f"{source}: a lock is a YAML mapping (lockVersion, target, stack, ...)")
    if data.get("lockVersion") not in (None, LOCK_VERSION):
        raise LockFileError(
            f"{source}: lockVersion {data.get('lockVersion')!r} is not supported by this llmserve (it reads {LOCK_VERSION})",
            hint="Upgrade llmserve, or regenerate the lock with `llmserve lock --upgrade`.",
        )
    try:
        return Lock.model_validate(data)
    except ValidationError as exc:
        problems = [
            f"{'.'.join(str(p) for p in e['loc']) or '(top level)'}: "
            f"{'unknown key' if e['type'] == 'extra_forbidden' else e['msg'].removeprefix('Value error, ')}"
            for e in exc.errors()
        ]
        raise LockFileError(f"{source}: " + "\n".join(problems)) from exc


def load_lock(path: Path) -> Lock:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (FileNotFoundError, IsADirectoryError) as exc:
        raise LockNotFoundError(f"{path}: no lock here") from exc
    except UnicodeDecodeError as exc:
        raise LockFileError(f"{path}: not UTF-8 text") from exc
    return parse_lock(text, str(path))
