"""The lock's say at packaging time (`llmserve package`).

A package never picks its engine: when a lock is present next to the source (SRC/llmserve.lock) or
given, an engine-version override in llmserve.yaml is refused with the versions the lock pins and
the command that moves them. A malformed lock is an error too (better now than at deploy).
"""

from __future__ import annotations

from pathlib import Path

from llmserve.errors import EngineVersionOverrideError
from llmserve.formats.lock import LOCK_NAME, Lock, load_lock
from llmserve.formats.manifest import Manifest, load_manifest


def find_lock(src: Path, lock: Path | None = None) -> Path | None:
    if lock is not None:
        return Path(lock)
    candidate = Path(src) / LOCK_NAME
    return candidate if candidate.is_file() else None


def describe_pins(lock: Lock) -> str:
    s = lock.stack
    parts = [f"{s.vllm.distribution} {s.vllm.version}"]
    if s.torch:
        parts.append(f"torch {s.torch}")
    if lock.target.image:
        parts.append(f"image {lock.target.image}")
    return ", ".join(parts)


def load_manifest_under_lock(manifest_path: Path, lock_path: Path | None) -> tuple[Manifest, Lock | None]:
    """Load llmserve.yaml; with a lock, explain an engine-version override in the lock's terms."""
    lock = load_lock(lock_path) if lock_path is not None else None
    try:
        manifest = load_manifest(manifest_path)
    except EngineVersionOverrideError as exc:
        if lock is None:
            raise
        raise EngineVersionOverrideError(
            f"{exc.message}\n{lock_path} pins target {lock.target.name}: {describe_pins(lock)}",
            hint=(
                "Remove the key from llmserve.yaml. To serve on another engine, move the lock instead: "
                "`llmserve lock --stack <line> --upgrade` (targets: `llmserve lock --list`)."
            ),
        ) from exc
    return manifest, lock
