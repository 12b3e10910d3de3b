"""`push`: upload a package to the store, content-addressed by its digest.

- The package is verified against its own digest index while its parts go up, and the upload is
  completed only if that passes: a corrupted local file is never published.
- The archive goes up as a multipart upload with parallel parts, each sent with its sha256
  (ChecksumAlgorithm SHA256): the store checks each part on receipt, and the object's composite
  checksum is compared with ours once the upload is complete.
- Resumable: the upload of a blob that was interrupted is still listed by the store; a second push
  finds it, lists its parts, and sends only those missing or different (compared by checksum, or
  by ETag, the part's MD5, where the store does not list checksums).
- Idempotent: when the blob and its parts record already exist, nothing is transferred.
- Order of writes: archive, then its parts record, then the version index, so a reader that finds
  an index always finds a whole blob.
"""

from __future__ import annotations

import base64
import hashlib
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from llmserve.errors import InvalidInputError, NotFoundError
from llmserve.formats.manifest import MANIFEST_NAME, Manifest, parse_manifest
from llmserve.packaging.archive import read_index, read_member
from llmserve.store.client import StoreOptions, error_code, is_not_found, make_client, store_errors, translate
from llmserve.store.errors import CorruptObjectError, TransferInterruptedError
from llmserve.store.objects import check_bucket, get_bytes, put_json
from llmserve.store.records import PartsRecord, VersionIndex, load_record
from llmserve.store.reference import StoreLocation, parse_store

MIN_PART_SIZE = 5 << 20  # S3's floor for every part but the last
DEFAULT_PART_SIZE = 16 << 20
MAX_PARTS = 10_000  # S3's ceiling
DEFAULT_CONCURRENCY = 8

Advance = Callable[[int], None]


def default_part_size(size: int) -> int:
    """16 MiB, or larger (whole MiB) when the archive would otherwise need more than 10,000 parts.
    A function of the size alone, so a resumed push cuts the archive exactly as the first one did."""
    need = -(-size // MAX_PARTS)
    return max(DEFAULT_PART_SIZE, -(-need // (1 << 20)) << 20)


@dataclass
class PushResult:
    url: str
    digest: str
    size: int
    modelId: str
    modelVersion: int
    alreadyPresent: bool
    partsTotal: int = 0
    partsUploaded: int = 0
    partsReused: int = 0
    bytesUploaded: int = 0
    indexUpdated: bool = False
    replacedDigest: str | None = None
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


class _RateLimit:
    """At most `rate` bytes per second across all workers (None: unlimited), scheduled per part."""

    def __init__(self, rate: int | None):
        self.rate = rate
        self._next = time.monotonic()
        self._lock = threading.Lock()

    def wait(self, n: int) -> None:
        if not self.rate:
            return
        with self._lock:
            start = max(time.monotonic(), self._next)
            self._next = start + n / self.rate
        time.sleep(max(0.0, start - time.monotonic()))


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def _blob_present(client: Any, store: StoreLocation, digest: str, size: int) -> bool:
    raw = get_bytes(client, store.bucket, store.parts_key(digest))
    if raw is None:
        return False
    record = load_record(PartsRecord, raw, f"s3://{store.bucket}/{store.parts_key(digest)}")
    if record.digest != digest or record.size != size:
        return False
    try:
        head = client.head_object(Bucket=store.bucket, Key=store.blob_key(digest))
    except store_errors() as exc:
        if is_not_found(exc):
            return False
        raise translate(exc, f"reading s3://{store.bucket}/{store.blob_key(digest)}", bucket=store.bucket) from exc
    return int(head["ContentLength"]) == size


def _find_upload(client: Any, bucket: str, key: str) -> tuple[str | None, dict[int, dict]]:
    """The newest unfinished SHA256 multipart upload of key and its parts (number -> listing)."""
    uploads = client.list_multipart_uploads(Bucket=bucket, Prefix=key).get("Uploads", [])
    ours = [u for u in uploads if u["Key"] == key and u.get("ChecksumAlgorithm", "SHA256") == "SHA256"]
    if not ours:
        return None, {}
    upload_id = max(ours, key=lambda u: u["Initiated"])["UploadId"]
    parts: dict[int, dict] = {}
    for page in client.get_paginator("list_parts").paginate(Bucket=bucket, Key=key, UploadId=upload_id):
        for p in page.get("Parts", []):
            parts[int(p["PartNumber"])] = p
    return upload_id, parts


def _same_part(listed: dict | None, data: bytes, sha_b64: str) -> bool:
    """Whether a part the store already holds is this data: its checksum when listed, else its ETag
    (the MD5 of the part for uploads without SSE-KMS or SSE-C; a mismatch only costs a re-upload)."""
    if listed is None or int(listed.get("Size", -1)) != len(data):
        return False
    if listed.get("ChecksumSHA256"):
        return bool(listed["ChecksumSHA256"] == sha_b64)
    return bool(str(listed.get("ETag", "")).strip('"') == hashlib.md5(data, usedforsecurity=False).hexdigest())


@dataclass
class _Upload:
    client: Any
    bucket: str
    key: str
    upload_id: str
    listed: dict[int, dict]
    fd: int
    limit: _RateLimit
    advance: Advance
    uploaded: int = 0
    reused: int = 0
    bytes_uploaded: int = 0

    def __post_init__(self) -> None:
        self._lock = threading.Lock()

    def part(self, number: int, offset: int, length: int) -> tuple[str, bytes]:
        """Send part `number` unless the store holds it already; return (ETag, raw sha256)."""
        data = os.pread(self.fd, length, offset)
        if len(data) != length:
            raise TransferInterruptedError(f"the package changed size while it was being pushed (part {number})")
        sha = hashlib.sha256(data).digest()
        listed = self.listed.get(number)
        if _same_part(listed, data, _b64(sha)):
            assert listed is not None
            with self._lock:
                self.reused += 1
            self.advance(length)
            return str(listed["ETag"]), sha
        self.limit.wait(length)
        r = self.client.upload_part(
            Bucket=self.bucket,
            Key=self.key,
            UploadId=self.upload_id,
            PartNumber=number,
            Body=data,
            ChecksumSHA256=_b64(sha),
        )
        with self._lock:
            self.uploaded += 1
            self.bytes_uploaded += length
        self.advance(length)
        return str(r["ETag"]), sha


def _run_parts(up: _Upload, ranges: list[tuple[int, int]], concurrency: int, url: str) -> list[tuple[str, bytes]]:
    results: list[tuple[str, bytes] | None] = [None] * len(ranges)
    pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="push")
    futures: dict[Future, int] = {}
    try:
        for i, (offset, length) in enumerate(ranges):
            futures[pool.submit(up.part, i + 1, offset, length)] = i
        done, _ = wait(futures, return_when=FIRST_EXCEPTION)
        for fut in done:
            exc = fut.exception()
            if exc is not None:
                n = futures[fut] + 1
                if isinstance(exc, store_errors()):
                    if error_code(exc) == "NoSuchUpload":
                        raise _Superseded() from exc
                    raise translate(
                        exc, f"pushing part {n} of {len(ranges)} to {url}", bucket=up.bucket, during_transfer=True
                    ) from exc
                raise exc
            results[futures[fut]] = fut.result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    assert all(r is not None for r in results)
    return [r for r in results if r is not None]


class _Superseded(Exception):
    """Our multipart upload is gone: another push of the same package completed (or aborted) it."""


_SUPERSEDED_WAIT_S = 60.0


def _blob_exists(client: Any, store: StoreLocation, digest: str, size: int) -> bool:
    try:
        return int(client.head_object(Bucket=store.bucket, Key=store.blob_key(digest))["ContentLength"]) == size
    except store_errors():
        return False


def _await_other_push(client: Any, store: StoreLocation, digest: str, size: int) -> bool:
    """Whether the push that superseded ours finishes the blob (its parts record appears) in time.
    That push verified its own upload; checking ours against it could fail on a different part size."""
    deadline = time.monotonic() + _SUPERSEDED_WAIT_S
    while time.monotonic() < deadline:
        if _blob_present(client, store, digest, size):
            return True
        time.sleep(0.5)
    return False


_START_ATTEMPTS = 3
_START_PAUSE_S = 0.2


def _start_upload(client: Any, store: StoreLocation, digest: str, size: int) -> tuple[str, dict[int, dict]]:
    """The upload to continue (the newest unfinished one of the blob, with its parts) or a new one."""
    bucket, key = store.bucket, store.blob_key(digest)
    url = f"s3://{bucket}/{key}"
    for attempt in range(_START_ATTEMPTS):
        try:
            # the last attempt does not resume: a store that keeps listing uploads gone costs a re-send
            upload_id, listed = _find_upload(client, bucket, key) if attempt < _START_ATTEMPTS - 1 else (None, {})
            if upload_id is None:
                upload_id = client.create_multipart_upload(
                    Bucket=bucket,
                    Key=key,
                    ChecksumAlgorithm="SHA256",
                    ContentType="application/x-tar",
                    Metadata={"llmserve-digest": digest},
                )["UploadId"]
            return upload_id, listed
        except store_errors() as exc:
            if error_code(exc) != "NoSuchUpload":
                raise translate(exc, f"starting the upload of {url}", bucket=bucket) from exc
            # The upload we listed was completed or aborted before its parts were read: another push
            # of the same package finished it (then wait for that push), or gave it up (look again).
            if _blob_exists(client, store, digest, size):
                raise _Superseded() from exc
            time.sleep(_START_PAUSE_S * (attempt + 1))
    raise AssertionError("unreachable: the last attempt creates an upload or raises")


def _composite(shas: list[bytes]) -> str:
    return _b64(hashlib.sha256(b"".join(shas)).digest())


def _upload_blob(
    client: Any,
    store: StoreLocation,
    package: Path,
    digest: str,
    size: int,
    part_size: int,
    concurrency: int,
    limit: _RateLimit,
    advance: Advance,
    result: PushResult,
    verified: Callable[[], object],
) -> list[bytes]:
    bucket, key = store.bucket, store.blob_key(digest)
    url = f"s3://{bucket}/{key}"
    ranges = [(off, min(part_size, size - off)) for off in range(0, size, part_size)] or [(0, 0)]
    upload_id, listed = _start_upload(client, store, digest, size)
    fd = os.open(package, os.O_RDONLY)
    up = _Upload(client, bucket, key, upload_id, listed, fd, limit, advance)
    try:
        parts = _run_parts(up, ranges, concurrency, url)
    finally:
        os.close(fd)
        # counted even when the upload stops: the bytes were sent
        result.partsTotal, result.partsUploaded, result.partsReused = len(ranges), up.uploaded, up.reused
        result.bytesUploaded = up.bytes_uploaded
    shas = [sha for _etag, sha in parts]
    try:
        verified()
    except BaseException:
        # A package that fails verification is never completed: drop its parts, publish nothing.
        try:
            client.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id)
        except store_errors():
            pass
        raise
    try:
        client.complete_multipart_upload(
            Bucket=bucket,
            Key=key,
            UploadId=upload_id,
            MultipartUpload={
                "Parts": [
                    {"PartNumber": i + 1, "ETag": etag, "ChecksumSHA256": _b64(sha)}
                    for i, (etag, sha) in enumerate(parts)
                ]
            },
        )
    except store_errors() as exc:
        if error_code(exc) == "NoSuchUpload":
            raise _Superseded() from exc
        raise translate(exc, f"completing the upload of {url}", bucket=bucket, during_transfer=True) from exc
    _check_uploaded(client, bucket, key, size, shas, url)
    _abort_others(client, bucket, key, keep=upload_id)
    return shas


def _check_uploaded(client: Any, bucket: str, key: str, size: int, shas: list[bytes], url: str) -> None:
    """The object is our bytes: its length, and its composite SHA256 (a checksum of the parts'
    checksums) where the store reports one. A mismatch removes the object, leaving the store as it was."""
    try:
        head = client.head_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED")
    except store_errors() as exc:
        raise translate(exc, f"checking {url} after the upload", bucket=bucket, during_transfer=True) from exc
    got = str(head.get("ChecksumSHA256") or "").split("-")[0]
    problem = None
    if int(head["ContentLength"]) != size:
        problem = f"{head['ContentLength']} bytes stored, {size} sent"
    elif got and got != _composite(shas):
        problem = "its composite SHA256 differs from the parts sent"
    if problem:
        try:
            client.delete_object(Bucket=bucket, Key=key)
        except store_errors():
            pass  # the missing parts record already keeps readers away from it
        raise CorruptObjectError(
            f"{url}: the uploaded object does not match the package ({problem}); it was removed",
            hint="Run the same `llmserve push` again.",
        )


def _abort_others(client: Any, bucket: str, key: str, keep: str) -> None:
    """Unfinished uploads of the same blob are garbage once it is complete (they would cost storage)."""
    try:
        for u in client.list_multipart_uploads(Bucket=bucket, Prefix=key).get("Uploads", []):
            if u["Key"] == key and u["UploadId"] != keep:
                client.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=u["UploadId"])
    except store_errors():
        pass  # housekeeping only: the blob itself is complete and checked


def _update_index(client: Any, store: StoreLocation, manifest: Manifest, digest: str, size: int) -> str | None:
    """Point modelId:modelVersion at digest; return the digest it named before when that changes."""
    key = store.index_key(manifest.modelId, manifest.modelVersion)
    raw = get_bytes(client, store.bucket, key)
    old = load_record(VersionIndex, raw, f"s3://{store.bucket}/{key}") if raw is not None else None
    if old is not None and old.digest == digest:
        return digest
    index = VersionIndex(
        modelId=manifest.modelId,
        modelVersion=manifest.modelVersion,
        digest=digest,
        size=size,
        backend=manifest.backend,
        pushedAt=datetime.now(UTC).isoformat(timespec="seconds"),
        previous=([old.digest, *old.previous][:10] if old else []),
    )
    put_json(client, store.bucket, key, index.model_dump_json(indent=1) + "\n")
    return old.digest if old else None


def push(
    package: Path,
    store_url: str,
    *,
    options: StoreOptions | None = None,
    part_size: int | None = None,
    concurrency: int = DEFAULT_CONCURRENCY,
    max_bandwidth: int | None = None,
    on_total: Callable[[int], None] | None = None,
    advance: Advance | None = None,
) -> PushResult:
    """Push the .llmpkg at `package` to the store at `store_url` (s3://BUCKET/PREFIX)."""
    started = time.monotonic()
    store = parse_store(store_url)
    package = Path(package)
    if not package.is_file():
        raise NotFoundError(f"{package}: no such package", hint="Build one with `llmserve package SRC`.")
    part_size = part_size or default_part_size(package.stat().st_size)
    if part_size < MIN_PART_SIZE:
        raise InvalidInputError(f"part size {part_size} is below S3's minimum of {MIN_PART_SIZE} bytes")
    index = read_index(package, verify=False)  # the digest; the content is verified below, alongside the upload
    manifest = parse_manifest(read_member(package, MANIFEST_NAME).decode(), f"{package}:{MANIFEST_NAME}")
    size, digest = package.stat().st_size, index.digest
    if -(-size // part_size) > MAX_PARTS:
        raise InvalidInputError(f"{size} bytes in parts of {part_size} is over S3's {MAX_PARTS} parts")
    client = make_client(replace(options or StoreOptions(), max_connections=concurrency + 4))
    result = PushResult(
        url=f"{store.url}/{manifest.modelId}:{manifest.modelVersion}",
        digest=digest,
        size=size,
        modelId=manifest.modelId,
        modelVersion=manifest.modelVersion,
        alreadyPresent=False,
    )
    if on_total:
        on_total(size)
    tick = advance or (lambda n: None)
    # Every member is hashed against the index while the parts go up (hashlib releases the GIL), and
    # the upload is completed only if that passes: the check costs no time on the way.
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="verify") as verifier:
        verifying = verifier.submit(read_index, package, verify=True)
        check_bucket(client, store)
        if _blob_present(client, store, digest, size):
            verifying.result()
            result.alreadyPresent = True
            tick(size)
        else:
            try:
                shas = _upload_blob(
                    client,
                    store,
                    package,
                    digest,
                    size,
                    part_size,
                    concurrency,
                    _RateLimit(max_bandwidth),
                    tick,
                    result,
                    verifying.result,
                )
            except _Superseded:
                verifying.result()
                if not _await_other_push(client, store, digest, size):
                    raise TransferInterruptedError(
                        f"{result.url}: another push of the same package took over this upload and did not finish"
                    ) from None
                result.alreadyPresent = True
            except TransferInterruptedError:
                # Some stores answer a part of an upload that another push completed with an error
                # other than NoSuchUpload (moto: 500). If the blob is there now, that push won.
                if not (_blob_exists(client, store, digest, size) and _await_other_push(client, store, digest, size)):
                    raise
                verifying.result()
                result.alreadyPresent = True
            else:
                record = PartsRecord(digest=digest, size=size, partSize=part_size, parts=[s.hex() for s in shas])
                put_json(client, store.bucket, store.parts_key(digest), record.model_dump_json() + "\n")
    before = _update_index(client, store, manifest, digest, size)
    result.indexUpdated = before != digest
    result.replacedDigest = before if before not in (None, digest) else None
    result.seconds = round(time.monotonic() - started, 3)
    return result
