"""Verify an archive while its parts are still arriving.

A pull writes parts in parallel into a preallocated file; they land roughly in order. A verifier
thread reads the file sequentially behind the "watermark" (the end of the contiguous run of parts
written from offset 0) and checks it exactly as `read_index(verify=True)` would: the digest index
first (its sha256 must be the digest the reference resolved to), then every member hashed against
it, no member missing, none extra. When the last part lands, verification is a moment from done,
instead of a second pass over the whole file.

Only the hashes are checked here: the archive's hostile-content checks (links, devices, names) run
when it is unpacked (llmserve.packaging.unpack), which also re-verifies every file.
"""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
import threading
from pathlib import Path
from typing import Any

from llmserve.packaging.archive import DIGESTS_NAME, read_index

_MAX_INDEX_BYTES = 16 << 20


class Aborted(Exception):
    """The download failed; the verifier stops without a verdict."""


class Watermark:
    """How many bytes from offset 0 are written, from parts reported done in any order."""

    def __init__(self, ranges: list[tuple[int, int]]):
        self._ranges = ranges
        self._done = [False] * len(ranges)
        self._next = 0  # first part not yet contiguous
        self.upto = 0
        self.failed = False
        self._cond = threading.Condition()

    def part_done(self, i: int) -> None:
        with self._cond:
            self._done[i] = True
            while self._next < len(self._done) and self._done[self._next]:
                offset, length = self._ranges[self._next]
                self.upto = offset + length
                self._next += 1
            self._cond.notify_all()

    def fail(self) -> None:
        with self._cond:
            self.failed = True
            self._cond.notify_all()

    def wait_for(self, end: int) -> None:
        with self._cond:
            while self.upto < end and not self.failed:
                self._cond.wait()
            if self.failed:
                raise Aborted()


class _Reader(io.RawIOBase):
    """Sequential reads of the file that wait until the bytes asked for are written."""

    def __init__(self, path: Path, size: int, mark: Watermark):
        self._fd = os.open(path, os.O_RDONLY)
        self._size = size
        self._mark = mark
        self.pos = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buf: Any) -> int:
        n = min(len(buf), self._size - self.pos)
        if n <= 0:
            return 0
        self._mark.wait_for(self.pos + n)
        data = os.pread(self._fd, n, self.pos)
        buf[: len(data)] = data
        self.pos += len(data)
        return len(data)

    def close(self) -> None:
        if not self.closed:
            os.close(self._fd)
        super().close()


def verify_while_written(path: Path, size: int, digest: str, mark: Watermark) -> str | None:
    """Follow `mark` through the archive at path; None if it is the package `digest`, else what is wrong.
    Raises Aborted when the download fails first."""
    reader = _Reader(path, size, mark)
    try:
        # bufsize: the stream reads 10 KiB records by default, 100,000 Python-level reads per GiB.
        with tarfile.open(fileobj=io.BufferedReader(reader, 1 << 20), mode="r|", bufsize=1 << 20) as tar:
            first = tar.next()
            if first is None or first.name != DIGESTS_NAME or not first.isreg() or first.size > _MAX_INDEX_BYTES:
                return f"the first member is not {DIGESTS_NAME}"
            mark.wait_for(first.offset_data + first.size)
            index = read_index(path, verify=False)  # the index, parsed and checked by the packaging code
            if index.digest != digest:
                return f"its digest index is package sha256:{index.digest[:16]}…, not sha256:{digest[:16]}…"
            seen: set[str] = set()
            while (member := tar.next()) is not None:  # (iterating `tar` would start over at the index)
                entry = index.files.get(member.name)
                if entry is None or member.name in seen or not member.isreg() or member.size != entry.size:
                    return f"'{member.name}' is not the indexed file of that name (or appears twice)"
                seen.add(member.name)
                fh = tar.extractfile(member)
                h = hashlib.sha256()
                while fh is not None and (chunk := fh.read(1 << 20)):
                    h.update(chunk)
                if h.hexdigest() != entry.sha256:
                    return f"digest mismatch for '{member.name}'"
            missing = set(index.files) - seen
            if missing:
                return f"{len(missing)} indexed file(s) missing, first '{sorted(missing)[0]}'"
            return None
    except (tarfile.TarError, EOFError, OSError, ValueError) as exc:
        if isinstance(exc, OSError) and mark.failed:
            raise Aborted() from exc
        return f"not a readable package archive ({type(exc).__name__}: {exc})"
    finally:
        reader.close()
