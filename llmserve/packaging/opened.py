"""Open a package for use: a `.llmpkg` (unpacked once into the local cache) or a folder.

Serving and deployment call `open_package`; they never read archives themselves. A cache entry is
reused only after `check_unpacked` has matched it against the archive's own digest index; an entry
that fails is discarded and unpacked again from the archive, never used.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from llmserve.errors import CacheEntryError, IntegrityError, NotFoundError
from llmserve.formats.manifest import MANIFEST_NAME, Manifest, load_manifest, parse_manifest
from llmserve.packaging.archive import (
    DIGESTS_NAME,
    FileEntry,
    PackageIndex,
    read_index,
    read_member,
    unpack,
    write_record,
)
from llmserve.packaging.builders import PACKAGE_SUFFIX, PLUGINS_DIR, REPOSITORY_DIR, weights_dir_in_package
from llmserve.packaging.unpacked import UnpackedCheck, check_unpacked

log = logging.getLogger(__name__)

VERIFIED_BY_UNPACK = "archive: every file hashed against the digest index while unpacking"
VERIFIED_NOT = "folder: used as it is, not verified"


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
    verification: str = VERIFIED_NOT  # what was actually checked before this view was handed out
    discarded: str | None = None  # why a cache entry for this package was thrown away, if one was

    def plugin_source(self, name: str) -> Path:
        if self.plugins_dir is not None:
            return self.plugins_dir / name
        plugin = next(p for p in self.manifest.plugins if p.name == name)
        return (self.root / plugin.source).resolve()


def _from_unpacked(
    root: Path,
    digest: str | None,
    from_cache: bool,
    verification: str = VERIFIED_NOT,
    discarded: str | None = None,
) -> OpenedPackage:
    manifest = load_manifest(root / MANIFEST_NAME)
    return OpenedPackage(
        root=root,
        manifest=manifest,
        weights_dir=root / weights_dir_in_package(manifest),
        repository_dir=root / REPOSITORY_DIR,
        plugins_dir=root / PLUGINS_DIR,
        digest=digest,
        from_cache=from_cache,
        verification=verification,
        discarded=discarded,
    )


def _unpacked_digest(root: Path) -> str | None:
    """The digest an unpacked folder claims for itself (not verified)."""
    try:
        body = json.loads((root / DIGESTS_NAME).read_text())
        files = {p: FileEntry(p, m["size"], m["sha256"]) for p, m in body.get("files", {}).items()}
    except (OSError, ValueError, RecursionError, AttributeError, KeyError, TypeError):
        return None
    return PackageIndex(files).digest


def cache_entry(path: Path, index: PackageIndex, cache: Path | None = None) -> Path:
    """Where the package at path is unpacked in the cache. Keyed by digest: a changed archive never
    lands on a stale unpack."""
    return (cache or cache_root()) / "packages" / f"{Path(path).stem}-{index.digest[:16]}"


def _reuse(target: Path, index: PackageIndex) -> UnpackedCheck:
    check = check_unpacked(target, index)
    if not check.ok:
        return check
    try:
        for folder in check.bytecode_dirs:
            shutil.rmtree(folder)
        if check.stale_record:
            write_record(target, index)
    except OSError as exc:
        check.problem = f"cannot be tidied for reuse ({exc.strerror or exc})"
    return check


def _discard(target: Path, problem: str) -> None:
    log.warning("cache: discarding %s: %s; unpacking the package again", target, problem)
    try:
        if target.is_symlink() or not target.is_dir():
            target.unlink()
    except OSError as exc:
        raise CacheEntryError(
            f"{target}: cache entry does not match its package ({problem}) and cannot be removed"
        ) from exc


def package_manifest(path: Path) -> Manifest:
    """The manifest of a package (archive, unpacked package or source folder), read without unpacking it."""
    path = Path(path)
    if path.is_dir():
        return load_manifest(path / MANIFEST_NAME)
    if not path.exists():
        raise NotFoundError(f"{path}: no such package or folder", hint="Build one with `llmserve package SRC`.")
    return parse_manifest(read_member(path, MANIFEST_NAME).decode("utf-8"), f"{path}:{MANIFEST_NAME}")


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
    # The index is cheap to read; content is verified while unpacking, or on reuse by check_unpacked.
    index = read_index(path, verify=False)
    target = cache_entry(path, index, cache)
    discarded = None
    if os.path.lexists(target):
        check = _reuse(target, index)
        if check.ok:
            return _from_unpacked(target, index.digest, from_cache=True, verification=f"cache: {check.summary()}")
        discarded = check.problem
        _discard(target, check.problem or "")
    try:
        unpack(path, target, progress=progress, replace=True)
    except PermissionError as exc:
        raise CacheEntryError(f"{target}: cannot unpack into the cache ({exc.strerror or exc})") from exc
    return _from_unpacked(target, index.digest, from_cache=False, verification=VERIFIED_BY_UNPACK, discarded=discarded)
