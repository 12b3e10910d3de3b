"""Artifact builders and the `.llmpkg` archive format (digests, reproducible writing, safe unpacking)."""

from llmserve.packaging.archive import (
    DIGESTS_NAME,
    ArchiveLimits,
    PackageIndex,
    read_index,
    unpack,
    write_archive,
)
from llmserve.packaging.builders import BuildResult, build_package

__all__ = [
    "DIGESTS_NAME",
    "ArchiveLimits",
    "BuildResult",
    "PackageIndex",
    "build_package",
    "read_index",
    "unpack",
    "write_archive",
]
