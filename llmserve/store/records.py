"""The two small JSON files the store keeps beside each package (pydantic models, strict on read)."""

from __future__ import annotations

from typing import TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from llmserve.store.errors import CorruptObjectError

FORMAT = 1
_SHA256 = r"^[0-9a-f]{64}$"
_Record = TypeVar("_Record", bound=BaseModel)


class PartsRecord(BaseModel):
    """blobs/sha256/<digest>.parts.json: how the archive was cut into parts, and each part's sha256.

    Written only after the archive is complete, so its presence means the blob is whole. A pull
    checks every downloaded part against it, in parallel, before the package digest is checked."""

    model_config = ConfigDict(extra="forbid")

    format: int = FORMAT
    digest: str = Field(pattern=_SHA256)
    size: int = Field(ge=0)
    partSize: int = Field(ge=1)
    parts: list[str] = Field(description="sha256 (hex) of each part, in order")

    def ranges(self) -> list[tuple[int, int]]:
        """(offset, length) of each part."""
        return [(i * self.partSize, min(self.partSize, self.size - i * self.partSize)) for i in range(len(self.parts))]


class VersionIndex(BaseModel):
    """index/<modelId>/<modelVersion>.json: which package that version is."""

    model_config = ConfigDict(extra="forbid")

    format: int = FORMAT
    modelId: str
    modelVersion: int
    digest: str = Field(pattern=_SHA256)
    size: int = Field(ge=0)
    backend: str
    pushedAt: str
    previous: list[str] = Field(default_factory=list, description="digests this version named before, newest first")


def load_record(model: type[_Record], raw: bytes, where: str) -> _Record:
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"]) or "(root)"
        raise CorruptObjectError(
            f"{where}: not a valid {model.__name__} ({loc}: {first['msg']})",
            hint="Push the package again (`llmserve push PKG s3://BUCKET/PREFIX`) to rewrite it.",
        ) from exc
