"""What `llmserve inspect` reports: manifest, files and digests, verified."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from llmserve.formats.manifest import parse_manifest
from llmserve.packaging.archive import FileEntry, read_index, read_member


@dataclass(frozen=True)
class InspectReport:
    digest: str
    manifest_yaml: str
    manifest: dict
    files: list[FileEntry]

    @property
    def total_size(self) -> int:
        return sum(f.size for f in self.files)

    def to_dict(self) -> dict:
        return {
            "digest": self.digest,
            "verified": True,
            "manifest": self.manifest,
            "files": [{"path": f.path, "size": f.size, "sha256": f.sha256} for f in self.files],
            "totalSize": self.total_size,
        }


def inspect_package(path: Path) -> InspectReport:
    index = read_index(path, verify=True)
    text = read_member(path, "llmserve.yaml").decode("utf-8")
    manifest = parse_manifest(text, f"{path}!llmserve.yaml")
    files = [index.files[p] for p in sorted(index.files)]
    return InspectReport(index.digest, text, manifest.model_dump(mode="json", exclude_none=True), files)
