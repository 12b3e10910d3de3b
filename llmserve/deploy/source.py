"""What a deploy is given: a local package (a .llmpkg or a package folder) or a model store reference.

A store reference (s3://BUCKET/PREFIX/MODEL_ID:VERSION or .../sha256:DIGEST) is pulled once into the
store cache, verified, and held there (a lease) while the rollout runs. The servers then start from
the cache with the reference pinned to what was pulled, s3://BUCKET/PREFIX/sha256:DIGEST: that is
resolved in the cache without a request to the store, so every server of a version runs exactly the
package the rollout checked, even if MODEL_ID:VERSION is pointed at another digest later, and each
server holds its own lease on the cached archive for as long as it runs (LRU eviction never removes
a package in use).

The pull happens before anything of the deployment changes: a missing bucket, an unknown version or
an unreachable store fails the command and leaves the current version serving.

Credentials are never part of a server's arguments: the servers inherit the environment (AWS_* and
the usual AWS configuration) and, started from the cache by digest, never contact the store anyway.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from llmserve.store import StoreOptions
    from llmserve.store.cache import CacheLease

STORE_SCHEME = "s3://"


def is_reference(package: str | Path) -> bool:
    return str(package).startswith(STORE_SCHEME)


@dataclass
class PackageSource:
    """A package ready to open, and how servers are started from it."""

    reference: str  # what the state records: the resolved local path, or the store reference as given
    path: Path  # the local archive (or folder) to open
    serve_ref: str  # what `llmserve serve` gets: the path, or the store reference pinned by digest
    store_digest: str | None = None  # the digest the store resolved the reference to
    cache_dir: Path | None = None  # the store cache the servers start from (store references only)
    downloaded: bool = False
    _lease: CacheLease | None = None

    @property
    def from_store(self) -> bool:
        return self.store_digest is not None

    def serve_args(self) -> list[str]:
        """Extra `llmserve serve` arguments: the cache the pinned reference is read from."""
        return ["--cache", str(self.cache_dir)] if self.cache_dir is not None else []

    def close(self) -> None:
        if self._lease is not None:
            self._lease.close()
            self._lease = None

    def __enter__(self) -> PackageSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def reference_model_id(reference: str) -> str | None:
    """The MODEL_ID of s3://.../MODEL_ID:VERSION (None for a reference by digest or anything else)."""
    if not is_reference(reference):
        return None
    last = reference.rstrip("/").rsplit("/", 1)[-1]
    model_id, sep, _version = last.partition(":")
    return model_id if sep and model_id != "sha256" else None


def pinned(reference: str, digest: str) -> str:
    """s3://BUCKET/PREFIX/MODEL:VERSION -> s3://BUCKET/PREFIX/sha256:DIGEST (the same store, by digest)."""
    return f"{reference.rstrip('/').rsplit('/', 1)[0]}/sha256:{digest}"


def open_source(
    package: str | Path,
    *,
    cache_dir: Path | None = None,
    store_options: StoreOptions | None = None,
    digest_hint: str | None = None,
    report=None,
) -> PackageSource:
    """Resolve what `deploy` was given; a store reference is pulled (or found) in the cache and leased.

    `digest_hint`: the digest the state recorded for this reference (a rollback): that exact package is
    used, from the cache without a request to the store when it is still there."""
    if not is_reference(package):
        path = Path(package).resolve()
        return PackageSource(reference=str(path), path=path, serve_ref=str(path))
    from llmserve.store import default_cache_dir, lease  # deferred: boto3 is imported only for references

    reference = str(package)
    cache = Path(cache_dir or default_cache_dir()).resolve()
    if report:
        report(f"store: resolving {reference} (cache {cache})")
    by = pinned(reference, digest_hint) if digest_hint else reference
    held, result = lease(by, cache, options=store_options)
    if report:
        how = f"pulled {result.size:,} bytes in {result.seconds:.1f} s" if result.downloaded else "already cached"
        report(f"store: {reference} is sha256:{result.digest[:16]}… ({how})")
    return PackageSource(
        reference=reference,
        path=result.path,
        serve_ref=pinned(reference, result.digest),
        store_digest=result.digest,
        cache_dir=cache,
        downloaded=result.downloaded,
        _lease=held,
    )
