"""Store URLs and model references, and the object keys of the store's layout.

    s3://BUCKET/PREFIX                      a store (push target, `pull --list`)
    s3://BUCKET/PREFIX/MODEL_ID:VERSION     a model version in it (resolved through its index)
    s3://BUCKET/PREFIX/sha256:DIGEST        a package by digest (no index read)

Layout under PREFIX, content-addressed by the package digest (the sha256 of the package's canonical
digest index, see llmserve.packaging.archive):

    blobs/sha256/<digest>.llmpkg       the archive, uploaded once whatever names point at it
    blobs/sha256/<digest>.parts.json   its size, part size and each part's sha256 (verifies a pull part by part)
    index/<modelId>/<modelVersion>.json   which digest that version is
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from llmserve.store.errors import StoreReferenceError

_MODEL_ID = r"[a-z0-9](?:[a-z0-9._-]{0,61}[a-z0-9])?"
_MODEL_REF = re.compile(rf"^(?P<model>{_MODEL_ID}):(?P<version>[1-9][0-9]{{0,9}})$")
_DIGEST_REF = re.compile(r"^sha256:(?P<digest>[0-9a-f]{64})$")
# S3's own bucket naming rules (lower case, digits, dots, hyphens; 3 to 63 characters).
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


@dataclass(frozen=True)
class StoreLocation:
    bucket: str
    prefix: str  # no leading or trailing slash; "" for the bucket's root

    @property
    def url(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}".rstrip("/")

    def key(self, rel: str) -> str:
        return f"{self.prefix}/{rel}" if self.prefix else rel

    def blob_key(self, digest: str) -> str:
        return self.key(f"blobs/sha256/{digest}.llmpkg")

    def parts_key(self, digest: str) -> str:
        return self.key(f"blobs/sha256/{digest}.parts.json")

    def index_key(self, model_id: str, version: int) -> str:
        return self.key(f"index/{model_id}/{version}.json")

    @property
    def index_prefix(self) -> str:
        return self.key("index/")


@dataclass(frozen=True)
class ModelReference:
    store: StoreLocation
    model_id: str | None = None
    version: int | None = None
    digest: str | None = None

    @property
    def url(self) -> str:
        name = f"sha256:{self.digest}" if self.digest else f"{self.model_id}:{self.version}"
        return f"{self.store.url}/{name}"


def _split(url: str) -> tuple[str, list[str]]:
    if not url.startswith("s3://"):
        raise StoreReferenceError(f"'{url}' is not an s3:// URL")
    bucket, _, rest = url[len("s3://") :].partition("/")
    if not _BUCKET.match(bucket):
        raise StoreReferenceError(f"'{url}': '{bucket}' is not a valid S3 bucket name")
    parts = [p for p in rest.split("/") if p]
    if any(p in (".", "..") for p in parts):
        raise StoreReferenceError(f"'{url}': '.' and '..' are not allowed in a store prefix")
    return bucket, parts


def parse_store(url: str) -> StoreLocation:
    bucket, parts = _split(url)
    if parts and (_MODEL_REF.match(parts[-1]) or _DIGEST_REF.match(parts[-1])):
        raise StoreReferenceError(
            f"'{url}' names a model; this command takes the store itself",
            hint=f"Use s3://{bucket}/{'/'.join(parts[:-1])}".rstrip("/") + " instead.",
        )
    return StoreLocation(bucket, "/".join(parts))


def parse_model(url: str) -> ModelReference:
    bucket, parts = _split(url)
    last = parts[-1] if parts else ""
    store = StoreLocation(bucket, "/".join(parts[:-1]))
    if m := _DIGEST_REF.match(last):
        return ModelReference(store, digest=m["digest"])
    if m := _MODEL_REF.match(last):
        return ModelReference(store, model_id=m["model"], version=int(m["version"]))
    raise StoreReferenceError(f"'{url}' does not end with MODEL_ID:VERSION or sha256:DIGEST")


_UNITS = {"": 1, "B": 1, "K": 1000, "M": 1000**2, "G": 1000**3, "T": 1000**4}
_IUNITS = {"KI": 1 << 10, "MI": 1 << 20, "GI": 1 << 30, "TI": 1 << 40}


def parse_size(text: str, what: str = "size") -> int:
    """'16MiB', '10G', '500M', '1048576' -> bytes (K/M/G/T are powers of 1000, KiB/MiB/GiB/TiB of 1024)."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([KMGT]i?)?B?\s*", text, re.IGNORECASE)
    if not m:
        raise StoreReferenceError(
            f"{what} '{text}' is not a size", hint="Write a size as bytes or with a unit: 500M, 16MiB, 10G."
        )
    unit = (m[2] or "").upper()
    return int(float(m[1]) * (_IUNITS[unit] if unit.endswith("I") else _UNITS[unit]))
