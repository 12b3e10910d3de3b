"""`pull`'s transfer half: resolve a reference, download an archive in parallel ranges, verify it.

Verification has two layers, both before the file is handed to the cache for its atomic rename:
each part is hashed as it arrives and checked against the parts record written at push (which
names the corrupted part, and runs in parallel); and the whole archive is checked against the
package digest the reference resolved to (every member hashed against the archive's digest index,
whose sha256 is that digest), by a reader that follows the parts as they land (streaming.py).
"""

from __future__ import annotations

import errno
import hashlib
import os
from collections.abc import Callable
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmserve.store.client import is_not_found, store_errors, translate
from llmserve.store.errors import CorruptObjectError, DiskFullError, ModelNotFoundError, TransferInterruptedError
from llmserve.store.objects import check_bucket, get_bytes
from llmserve.store.records import PartsRecord, VersionIndex, load_record
from llmserve.store.reference import ModelReference, StoreLocation
from llmserve.store.streaming import Aborted, Watermark, verify_while_written

Advance = Callable[[int], None]
_CHUNK = 1 << 20


@dataclass(frozen=True)
class Resolved:
    reference: ModelReference
    record: PartsRecord
    index: VersionIndex | None  # None for a reference by digest

    @property
    def digest(self) -> str:
        return self.record.digest


def read_parts_record(client: Any, store: StoreLocation, digest: str, named_by: str) -> PartsRecord:
    key = store.parts_key(digest)
    raw = get_bytes(client, store.bucket, key)
    if raw is None:
        check_bucket(client, store)
        raise ModelNotFoundError(
            f"{named_by}: package sha256:{digest[:16]}… is not (completely) in the store",
            hint="Push it (again) with `llmserve push PKG " + store.url + "`; an interrupted push continues.",
        )
    record = load_record(PartsRecord, raw, f"s3://{store.bucket}/{key}")
    if record.digest != digest:
        raise CorruptObjectError(f"s3://{store.bucket}/{key}: describes sha256:{record.digest[:16]}…, not {digest}")
    return record


def resolve(client: Any, ref: ModelReference) -> Resolved:
    store = ref.store
    if ref.digest:
        return Resolved(ref, read_parts_record(client, store, ref.digest, ref.url), None)
    assert ref.model_id is not None and ref.version is not None
    key = store.index_key(ref.model_id, ref.version)
    raw = get_bytes(client, store.bucket, key)
    if raw is None:
        check_bucket(client, store)
        raise ModelNotFoundError(f"{ref.url}: no such model version in the store")
    index = load_record(VersionIndex, raw, f"s3://{store.bucket}/{key}")
    return Resolved(ref, read_parts_record(client, store, index.digest, ref.url), index)


def list_store(client: Any, store: StoreLocation) -> list[VersionIndex]:
    """Every version index under the store, sorted by modelId then version."""
    check_bucket(client, store)
    keys: list[str] = []
    try:
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=store.bucket, Prefix=store.index_prefix):
            keys += [o["Key"] for o in page.get("Contents", []) if o["Key"].endswith(".json")]
    except store_errors() as exc:
        raise translate(exc, f"listing {store.url}", bucket=store.bucket) from exc
    with ThreadPoolExecutor(max_workers=8, thread_name_prefix="list") as pool:
        raws = list(pool.map(lambda k: (k, get_bytes(client, store.bucket, k)), keys))
    found = [load_record(VersionIndex, raw, f"s3://{store.bucket}/{k}") for k, raw in raws if raw is not None]
    return sorted(found, key=lambda v: (v.modelId, v.modelVersion))


def _disk_error(exc: OSError, path: Path) -> Exception:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return DiskFullError(f"{path.parent}: no space left on the device while pulling")
    return exc


_ATTEMPTS = 3  # per part: botocore retries a failed request, not a body cut off while streaming


def _fetch_range(
    client: Any, store: StoreLocation, key: str, offset: int, length: int, fd: int, path: Path, advance: Advance
) -> tuple[int, str]:
    """GET one range into fd at its offset; (bytes written, their sha256)."""
    h = hashlib.sha256()
    got = 0
    if not length:
        return 0, h.hexdigest()
    body = client.get_object(Bucket=store.bucket, Key=key, Range=f"bytes={offset}-{offset + length - 1}")["Body"]
    for chunk in body.iter_chunks(_CHUNK):
        chunk = chunk[: length - got]  # never past the range, whatever the server sends
        h.update(chunk)
        try:
            os.pwrite(fd, chunk, offset + got)
        except OSError as exc:
            raise _disk_error(exc, path) from exc
        got += len(chunk)
        advance(len(chunk))
        if got >= length:
            break
    return got, h.hexdigest()


def _part(
    client: Any, store: StoreLocation, record: PartsRecord, i: int, fd: int, path: Path, advance: Advance
) -> None:
    offset, length = record.ranges()[i]
    key = store.blob_key(record.digest)
    url = f"s3://{store.bucket}/{key}"
    counted = [0]  # bytes of the current attempt on the progress bar

    def tick(n: int) -> None:
        counted[0] += n
        advance(n)

    for attempt in range(1, _ATTEMPTS + 1):
        counted[0] = 0
        try:
            got, sha = _fetch_range(client, store, key, offset, length, fd, path, tick)
            break
        except store_errors() as exc:
            if is_not_found(exc):
                raise ModelNotFoundError(
                    f"{url}: the archive is missing from the store (its parts record is there)"
                ) from exc
            error = translate(exc, f"pulling part {i + 1} of {url}", bucket=store.bucket, during_transfer=True)
            if attempt == _ATTEMPTS or not isinstance(error, TransferInterruptedError):
                raise error from exc
            advance(-counted[0])  # the part starts over: take its bytes back off the progress bar
    if got != length or sha != record.parts[i]:
        raise CorruptObjectError(
            f"{url}: part {i + 1} of {len(record.parts)} (bytes {offset}-{offset + length - 1}) does not match the "
            "sha256 recorded at push: the object in the store is corrupted"
        )


def download(
    client: Any,
    store: StoreLocation,
    record: PartsRecord,
    path: Path,
    *,
    concurrency: int,
    advance: Advance,
    url: str,
) -> None:
    """Write the archive into `path` (an existing file, preallocated by the cache), part by part, and
    verify it while it arrives: each part against the parts record, the whole against the package
    digest (streaming.verify_while_written). Returns only when the file is verified and on disk."""
    ranges = record.ranges()
    mark = Watermark(ranges)
    fd = os.open(path, os.O_WRONLY)
    pool = ThreadPoolExecutor(max_workers=concurrency + 1, thread_name_prefix="pull")

    def part(i: int) -> None:
        if mark.failed:
            return
        _part(client, store, record, i, fd, path, advance)
        # Flushed part by part, so that the flush before the rename has little left to do.
        try:
            os.fdatasync(fd)
        except OSError as exc:
            raise _disk_error(exc, path) from exc
        mark.part_done(i)

    try:
        verdict = pool.submit(verify_while_written, path, record.size, record.digest, mark)
        futures: list[Future] = [pool.submit(part, i) for i in range(len(ranges))]
        done, _ = wait(futures, return_when=FIRST_EXCEPTION)
        for fut in futures:
            if fut in done and fut.exception() is not None:
                mark.fail()
                raise fut.exception()  # type: ignore[misc]
        try:
            problem = verdict.result()
        except Aborted:  # only after a failed part, already raised above
            raise CorruptObjectError(f"{url}: the download stopped before it could be verified") from None
        if problem is not None:
            raise CorruptObjectError(f"{url}: the downloaded archive fails verification ({problem})")
        try:
            os.fsync(fd)
        except OSError as exc:
            raise _disk_error(exc, path) from exc
    finally:
        mark.fail()  # releases the verifier if it still waits
        pool.shutdown(wait=True, cancel_futures=True)
        os.close(fd)
