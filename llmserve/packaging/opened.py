"""Open a package for use: a `.llmpkg` (unpacked once into the local cache) or a folder.

Serving and deployment call `open_package`; they never read archives themselves.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from llmserve.errors import IntegrityError, NotFoundError
from llmserve.formats.manifest import MANIFEST_NAME, Manifest, load_manifest
from llmserve.packaging.archive import DIGESTS_NAME, PackageIndex, read_index, unpack
from llmserve.packaging.builders import PACKAGE_SUFFIX, PLUGINS_DIR, REPOSITORY_DIR, weights_dir_in_package


def cache_root() -> Path:
    env = os.environ.get("LLMSERVE_CACHE")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "llmserve"


@dataclass(frozen=True)
class OpenedPackage:
    root: Path
    manifest: Manifest
    weights_dir: Path
    repository_dir: Path | None  # None for a source folder (no model repository is rendered)
    plugins_dir: Path | None
    digest: str | None  # package digest when opened from an archive or unpacked package
    from_cache: bool = False

    def plugin_source(self, name: str) -> Path:
        if self.plugins_dir is not None:
            return self.plugins_dir / name
        plugin = next(p for p in self.manifest.plugins if p.name == name)
        return (self.root / plugin.source).resolve()


def _from_unpacked(root: Path, digest: str | None, from_cache: bool) -> OpenedPackage:
    manifest = load_manifest(root / MANIFEST_NAME)
    return OpenedPackage(
        root=root,
        manifest=manifest,
        weights_dir=root / weights_dir_in_package(manifest),
        repository_dir=root / REPOSITORY_DIR,
        plugins_dir=root / PLUGINS_DIR,
        digest=digest,
        from_cache=from_cache,
    )


def _unpacked_digest(root: Path) -> str | None:
    try:
        body = json.loads((root / DIGESTS_NAME).read_text())
    except (OSError, ValueError):
        return None
    from llmserve.packaging.archive import FileEntry

    files = {p: FileEntry(p, m["size"], m["sha256"]) for p, m in body.get("files", {}).items()}
    return PackageIndex(files).digest


def open_package(
    path: Path, *, cache: Path | None = None, progress: Callable[[int], None] | None = None
) -> OpenedPackage:
    """Return a ready-to-use view of the package at path (archive, unpacked package or source folder)."""
    path = Path(path)
    if path.is_dir():
        if (path / DIGESTS_NAME).is_file():
            return _from_unpacked(path, _unpacked_digest(path), from_cache=False)
        manifest = load_manifest(path / MANIFEST_NAME)
        weights = (path / manifest.weights).resolve()
        if not weights.is_dir():
            raise NotFoundError(f"{weights}: weights folder not found (from `weights: {manifest.weights}`)")
        return OpenedPackage(path, manifest, weights, None, None, None)
    if not path.exists():
        raise NotFoundError(f"{path}: no such package or folder", hint="Build one with `llmserve package SRC`.")
    if path.suffix != PACKAGE_SUFFIX:
        raise IntegrityError(f"{path}: expected a {PACKAGE_SUFFIX} archive or a folder")
    # The index is cheap to read; its digest keys the cache, so a changed archive never reuses
    # a stale unpack. Content is verified while unpacking.
    index = read_index(path, verify=False)
    digest = index.digest
    cache_dir = (cache or cache_root()) / "packages"
    target = cache_dir / f"{path.stem}-{digest[:16]}"
    if target.is_dir() and _unpacked_digest(target) == digest:
        return _from_unpacked(target, digest, from_cache=True)
    unpack(path, target, progress=progress, replace=True)
    return _from_unpacked(target, digest, from_cache=False)
