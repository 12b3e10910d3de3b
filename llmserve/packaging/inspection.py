"""What `llmserve inspect` reports: manifest, files and digests, verified, and the state of the
local cache entry `serve` would use for this package (which the archive's digests say nothing about)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from llmserve.formats.manifest import parse_manifest
from llmserve.packaging.archive import FileEntry, PackageIndex, read_index, read_member
from llmserve.packaging.unpacked import check_unpacked


@dataclass(frozen=True)
class CacheState:
    path: str
    state: str  # "absent" | "matches" | "does-not-match"
    detail: str | None = None

    def to_dict(self) -> dict:
        return {"path": self.path, "state": self.state, "detail": self.detail}

    def describe(self) -> str:
        if self.state == "absent":
            return f"cache: not unpacked yet ({self.path})"
        if self.state == "matches":
            return f"cache: {self.path} matches the package ({self.detail})"
        return (
            f"cache: {self.path} does NOT match the package ({self.detail}); the next `serve` discards and rebuilds it"
        )


@dataclass(frozen=True)
class InspectReport:
    digest: str
    manifest_yaml: str
    manifest: dict
    files: list[FileEntry]
    cache: CacheState

    @property
    def total_size(self) -> int:
        return sum(f.size for f in self.files)

    def to_dict(self) -> dict:
        return {
            "digest": self.digest,
            # True means: every file of the archive was hashed against its digest index. The cache is
            # reported separately because `serve` runs from it, not from the archive.
            "verified": True,
            "cache": self.cache.to_dict(),
            "manifest": self.manifest,
            "files": [{"path": f.path, "size": f.size, "sha256": f.sha256} for f in self.files],
            "totalSize": self.total_size,
        }


def cache_state(path: Path, index: PackageIndex, cache: Path | None = None) -> CacheState:
    """Check the cache entry for this package without changing it."""
    from llmserve.packaging.opened import cache_entry

    target = cache_entry(path, index, cache)
    if not os.path.lexists(target):
        return CacheState(str(target), "absent")
    check = check_unpacked(target, index)
    if check.ok:
        return CacheState(str(target), "matches", check.summary())
    return CacheState(str(target), "does-not-match", check.problem)


def inspect_package(path: Path, *, cache: Path | None = None) -> InspectReport:
    index = read_index(path, verify=True)
    text = read_member(path, "llmserve.yaml").decode("utf-8")
    manifest = parse_manifest(text, f"{path}!llmserve.yaml")
    files = [index.files[p] for p in sorted(index.files)]
    return InspectReport(
        index.digest,
        text,
        manifest.model_dump(mode="json", exclude_none=True),
        files,
        cache_state(path, index, cache),
    )
