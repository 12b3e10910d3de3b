"""The local fast cache: verified archives keyed by digest, shared safely by processes and pods.

Layout under the cache folder (a local disk, or a shared file system such as FSx with POSIX locks):

    blobs/sha256/<digest>.llmpkg   verified archives, read-only; nothing unverified is ever under this name
    tmp/<digest>.partial           a download in progress (preallocated to its full size)
    locks/<digest>.use             held shared by every user of the entry, exclusive by eviction
    locks/<digest>.fetch           held exclusive by the one process downloading the entry
    locks/cache                    held exclusive while space is reserved and entries evicted
    refs/<modelId>/<version>       the digest a version resolved to at its last pull (for --offline)

Why two locks per entry: users hold `use` shared for as long as they use the file, so eviction,
which needs it exclusive and never waits for it, cannot remove an entry in use; downloaders meet on
`fetch`, so one downloads while the others wait, then find the file and reuse it. A lock dies with
its process (flock), so a crashed user never pins an entry, and a crashed download leaves only a
temporary file that the next reservation removes.

Least recently used: the mtime of `locks/<digest>.use`, touched at every lease.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from llmserve.store.errors import CacheFullError, CacheReadOnlyError, DiskFullError

log = logging.getLogger(__name__)

_READ_ONLY_ERRNOS = (errno.EROFS, errno.EACCES, errno.EPERM)
_SPACE_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


@dataclass
class CacheLease:
    """A cached archive held for use: it cannot be evicted until `close()` (or the process ends)."""

    path: Path
    digest: str
    size: int
    downloaded: bool  # False: it was in the cache already
    evicted: list[str] = field(default_factory=list)  # digests evicted to make room for it
    _fd: int | None = None

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # releases the shared lock
            self._fd = None

    def __enter__(self) -> CacheLease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# Fills `tmp` (an existing, preallocated file) with the archive and verifies it; raises on any failure.
Fetch = Callable[[Path], None]


class ModelCache:
    def __init__(self, root: Path, max_bytes: int | None = None):
        self.root = Path(root)
        self.max_bytes = max_bytes
        self.blobs = self.root / "blobs" / "sha256"
        self.locks = self.root / "locks"
        self.tmp = self.root / "tmp"
        self.refs = self.root / "refs"

    def blob(self, digest: str) -> Path:
        return self.blobs / f"{digest}.llmpkg"

    # --- locks --------------------------------------------------------------------------------

    def _prepare(self) -> bool:
        """Create the folders; False when the cache cannot be written (a read-only file system)."""
        try:
            for d in (self.blobs, self.locks, self.tmp, self.refs):
                d.mkdir(parents=True, exist_ok=True)
            probe = self.locks / "cache"
            os.close(os.open(probe, os.O_RDWR | os.O_CREAT, 0o644))
        except OSError as exc:
            if exc.errno in _READ_ONLY_ERRNOS:
                return False
            if exc.errno in _SPACE_ERRNOS:
                raise DiskFullError(f"{self.root}: no space left to create the cache") from exc
            raise
        return True

    def _lock_fd(self, name: str) -> int:
        return os.open(self.locks / name, os.O_RDWR | os.O_CREAT, 0o644)

    @contextmanager
    def _exclusive(self, name: str) -> Iterator[None]:
        fd = self._lock_fd(name)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _try_exclusive(self, name: str) -> int | None:
        fd = self._lock_fd(name)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        return fd

    # --- space --------------------------------------------------------------------------------

    def usage(self) -> int:
        """Bytes held by verified archives and by downloads in progress (their full reserved size)."""
        total = 0
        for folder in (self.blobs, self.tmp):
            for p in folder.iterdir() if folder.is_dir() else ():
                try:
                    total += p.stat().st_size
                except FileNotFoundError:
                    pass
        return total

    def entries(self) -> list[tuple[str, int, float]]:
        """(digest, size, last use) of every cached archive, least recently used first."""
        out = []
        for p in self.blobs.glob("*.llmpkg"):
            digest = p.name.removesuffix(".llmpkg")
            try:
                size = p.stat().st_size
                used = (self.locks / f"{digest}.use").stat().st_mtime
            except FileNotFoundError:
                used = 0.0
                if not p.exists():
                    continue
            out.append((digest, size, used))
        return sorted(out, key=lambda e: e[2])

    def _clear_stale_tmp(self) -> None:
        # A temporary file whose fetch lock is free belongs to a download that died.
        for p in self.tmp.glob("*.partial"):
            fd = self._try_exclusive(f"{p.name.removesuffix('.partial')}.fetch")
            if fd is not None:
                try:
                    p.unlink(missing_ok=True)
                finally:
                    os.close(fd)

    def _evict_for(self, digest: str, size: int) -> list[str]:
        """Evict least recently used entries not in use until `size` more bytes fit; the evicted digests."""
        evicted: list[str] = []
        if self.max_bytes is None:
            return evicted
        if size > self.max_bytes:
            raise CacheFullError(
                f"{self.root}: the package is {size:,} bytes, more than the cache's limit of {self.max_bytes:,}",
                hint="Raise --max-cache-size above the package's size, then run the command again.",
            )
        used = self.usage()
        in_use = 0
        for other, other_size, _ in self.entries():
            if used + size <= self.max_bytes:
                break
            if other == digest:
                continue
            fd = self._try_exclusive(f"{other}.use")
            if fd is None:
                in_use += 1
                continue
            try:
                self.blob(other).unlink(missing_ok=True)
            finally:
                os.close(fd)
            used -= other_size
            evicted.append(other)
            log.info("cache: evicted sha256:%s (%d bytes, least recently used)", other[:16], other_size)
        if used + size > self.max_bytes:
            raise CacheFullError(
                f"{self.root}: {size:,} more bytes do not fit under the {self.max_bytes:,}-byte limit "
                f"({used:,} bytes held, {in_use} package(s) in use cannot be evicted)"
            )
        return evicted

    def _reserve(self, digest: str, size: int) -> tuple[Path, list[str]]:
        """Make room for and preallocate tmp/<digest>.partial; the caller holds the entry's fetch lock."""
        tmp = self.tmp / f"{digest}.partial"
        with self._exclusive("cache"):
            tmp.unlink(missing_ok=True)  # ours: we hold the fetch lock, so whoever wrote it is gone
            self._clear_stale_tmp()
            evicted = self._evict_for(digest, size)
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                if size:
                    # Reserves the blocks now: a full disk fails here, before any byte is transferred,
                    # and the reservation counts in usage() for concurrent pulls of other packages.
                    os.posix_fallocate(fd, 0, size)
            except OSError as exc:
                tmp.unlink(missing_ok=True)
                if exc.errno in _SPACE_ERRNOS:
                    raise DiskFullError(
                        f"{self.root}: no space left for {size:,} bytes (the package being pulled)"
                    ) from exc
                raise
            finally:
                os.close(fd)
        return tmp, evicted

    # --- leases -------------------------------------------------------------------------------

    def cached(self, digest: str) -> bool:
        return self.blob(digest).is_file()

    def lease(self, digest: str, size: int, fetch: Fetch) -> CacheLease:
        """Hold the archive `digest` for use, downloading it with `fetch` first if it is not cached."""
        blob = self.blob(digest)
        if not self._prepare():
            if blob.is_file() and blob.stat().st_size == size:
                # Nothing can change or evict it on a read-only file system, and nothing can be locked.
                return CacheLease(blob, digest, size, downloaded=False)
            raise CacheReadOnlyError(
                f"{self.root}: the cache is on a read-only file system and does not hold sha256:{digest[:16]}…"
            )
        use_fd = self._lock_fd(f"{digest}.use")
        try:
            fcntl.flock(use_fd, fcntl.LOCK_SH)  # waits only while an evictor removes this very entry
            downloaded, evicted = False, []
            if not blob.is_file():
                with self._exclusive(f"{digest}.fetch"):  # one downloads; the others wait here, then reuse
                    if not blob.is_file():
                        evicted = self._download(digest, size, fetch)
                        downloaded = True
            os.utime(self.locks / f"{digest}.use")
            return CacheLease(blob, digest, size, downloaded, evicted, use_fd)
        except BaseException:
            os.close(use_fd)
            raise

    def _download(self, digest: str, size: int, fetch: Fetch) -> list[str]:
        tmp, evicted = self._reserve(digest, size)
        try:
            fetch(tmp)
            os.chmod(tmp, 0o444)
            os.replace(tmp, self.blob(digest))
            _fsync_dir(self.blobs)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            if exc.errno in _SPACE_ERRNOS:
                raise DiskFullError(f"{self.root}: no space left on the device while pulling") from exc
            raise
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return evicted

    # --- refs (offline resolution) --------------------------------------------------------------

    def write_ref(self, model_id: str, version: int, digest: str) -> None:
        path = self.refs / model_id / str(version)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            tmp.write_text(digest + "\n")
            os.replace(tmp, path)
        except OSError as exc:
            log.warning("cache: cannot record %s:%s -> %s (%s)", model_id, version, digest[:16], exc.strerror)

    def read_ref(self, model_id: str, version: int) -> str | None:
        try:
            text = (self.refs / model_id / str(version)).read_text().strip()
        except OSError:
            return None
        return text if len(text) == 64 and all(c in "0123456789abcdef" for c in text) else None


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
