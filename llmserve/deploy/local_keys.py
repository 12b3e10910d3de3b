"""The API key of a local deployment, and the key its gateway uses towards its servers.

A deployment is authenticated by default. Callers present its key to the gateway (`Authorization:
Bearer KEY` or `X-API-Key`); the gateway checks it on every route but `GET /health`, then forwards
with a second key that only it and the servers know, so nobody on the machine reaches a server
around the gateway without a key. Both keys live in files under the state folder (mode 600), and
servers get the path (`--api-key-file`), never the key, so no key is ever in a process argument.

The key comes from `--api-key-file` or `LLMSERVE_API_KEY`; a new deployment given neither gets a
generated one (the CLI says in which file). The deployment records a fingerprint of it: a later
rollout that brings a different key (or `--no-api-key`) is refused unless `--rotate-api-key`
confirms it, and one that brings none keeps the current key.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path

from llmserve.deploy.errors import DeployInputError

KEY_ENV = "LLMSERVE_API_KEY"  # = llmserve.serve.options.API_KEY_ENV (deploy does not import serve)
OPEN = "none"  # the recorded fingerprint of a deployment that takes requests without a key
ROTATE = "--rotate-api-key"


@dataclass
class KeyRequest:
    """What a deploy command brings: a key (and where it came from), --no-api-key, --rotate-api-key."""

    value: str | None = field(default=None, repr=False)
    value_from: str = ""
    open: bool = False
    rotate: bool = False


@dataclass(frozen=True)
class KeyFiles:
    client: Path  # what callers present; absent when the deployment is open
    backend: Path  # what the gateway presents to the servers

    def client_key(self) -> str | None:
        return _read(self.client)

    def backend_key(self) -> str | None:
        return _read(self.backend)


def key_files(state_root: Path, name: str) -> KeyFiles:
    folder = state_root / "keys"
    return KeyFiles(folder / f"{name}.key", folder / f"{name}.backend.key")


def fingerprint(key: str) -> str:
    return "sha256:" + hashlib.sha256(key.encode()).hexdigest()[:16]


def settle(state_root: Path, name: str, recorded: str | None, request: KeyRequest, report) -> str:
    """Check the request against the deployment's key and write the key files; returns the fingerprint
    to record. `recorded` is None for a new deployment. Raises before writing anything when refused."""
    if request.open and request.value:
        raise DeployInputError(f"--no-api-key and a key from {request.value_from} together: choose one")
    files = key_files(state_root, name)
    value = request.value
    if request.open:
        wanted = OPEN
    elif value:
        wanted = fingerprint(value)
    elif recorded is None:
        value = secrets.token_urlsafe(32)
        wanted = fingerprint(value)
        report(
            f"deployment '{name}' is authenticated: its API key was generated into {files.client} "
            "(send it as 'Authorization: Bearer <key>'; give your own with --api-key-file)"
        )
    else:
        wanted = recorded
    if recorded is not None and wanted != recorded and not request.rotate:
        raise DeployInputError(
            f"this rollout would change the API key of '{name}' from {_describe(recorded)} to "
            f"{_describe(wanted)}" + (f" (from {request.value_from})" if request.value_from else ""),
            hint=f"Pass {ROTATE} to change it, or deploy with no key option to keep the current one.",
        )
    if wanted == OPEN:
        files.client.unlink(missing_ok=True)
    elif value:
        _write(files.client, value)
    if files.backend_key() is None:
        _write(files.backend, secrets.token_urlsafe(32))
    if recorded is not None and wanted != recorded:
        report(f"API key of '{name}' changed to {_describe(wanted)}: the gateway takes only the new key from now")
    return wanted


def remove(state_root: Path, name: str) -> None:
    files = key_files(state_root, name)
    files.client.unlink(missing_ok=True)
    files.backend.unlink(missing_ok=True)


def _describe(recorded: str) -> str:
    return "no key (open)" if recorded == OPEN else f"key {recorded}"


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip() or None
    except FileNotFoundError:
        return None


def _write(path: Path, value: str) -> None:
    """Atomically, readable by the owner only from the first byte on."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, value.encode() + b"\n")
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
