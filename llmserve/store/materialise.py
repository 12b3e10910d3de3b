"""From a store reference to a verified archive in the local cache: what `pull` and `serve` call."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from llmserve.packaging.opened import cache_root
from llmserve.store.cache import CacheLease, ModelCache
from llmserve.store.client import StoreOptions, make_client
from llmserve.store.errors import ModelNotFoundError
from llmserve.store.pull import download, resolve
from llmserve.store.push import DEFAULT_CONCURRENCY
from llmserve.store.reference import parse_model


def default_cache_dir() -> Path:
    """LLMSERVE_STORE_CACHE, else <LLMSERVE_CACHE or ~/.cache/llmserve>/store."""
    env = os.environ.get("LLMSERVE_STORE_CACHE")
    return Path(env) if env else cache_root() / "store"


@dataclass
class PullResult:
    reference: str
    digest: str
    size: int
    path: Path
    modelId: str | None
    modelVersion: int | None
    downloaded: bool
    evicted: list[str]
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "path": str(self.path)}


def lease(
    reference: str,
    cache_dir: Path | None = None,
    *,
    options: StoreOptions | None = None,
    max_cache_bytes: int | None = None,
    concurrency: int = DEFAULT_CONCURRENCY,
    offline: bool = False,
    on_total: Callable[[int], None] | None = None,
    advance: Callable[[int], None] | None = None,
) -> tuple[CacheLease, PullResult]:
    """Resolve `reference` and hold its verified archive in the cache (downloading it if needed).

    The lease keeps the archive from eviction until it is closed or the process exits. A reference
    by digest that is already cached, or any reference with `offline`, makes no request to the store.
    """
    started = time.monotonic()
    ref = parse_model(reference)
    cache = ModelCache(cache_dir or default_cache_dir(), max_cache_bytes)
    digest = ref.digest
    if offline and digest is None:
        assert ref.model_id is not None and ref.version is not None
        digest = cache.read_ref(ref.model_id, ref.version)
        if digest is None:
            raise ModelNotFoundError(
                f"{reference}: never pulled into {cache.root}, so it cannot be resolved offline",
                hint="Pull it once with the store reachable: `llmserve pull " + reference + "`.",
            )
    if digest is not None and (offline or cache.cached(digest)):
        if not cache.cached(digest):
            raise ModelNotFoundError(
                f"{reference}: sha256:{digest[:16]}… is not in {cache.root} (evicted?)",
                hint="Pull it with the store reachable: `llmserve pull " + reference + "`.",
            )
        size = cache.blob(digest).stat().st_size
        held = cache.lease(digest, size, _unreachable)
        return held, _result(reference, held, ref.model_id, ref.version, started)
    client = make_client(replace(options or StoreOptions(), max_connections=concurrency + 4))
    resolved = resolve(client, ref)
    record = resolved.record
    if on_total:
        on_total(record.size)
    url = ref.url

    def fetch(tmp: Path) -> None:
        download(client, ref.store, record, tmp, concurrency=concurrency, advance=advance or (lambda n: None), url=url)

    held = cache.lease(record.digest, record.size, fetch)
    if not held.downloaded and advance:
        advance(record.size)
    if resolved.index is not None:
        cache.write_ref(resolved.index.modelId, resolved.index.modelVersion, record.digest)
    model_id = resolved.index.modelId if resolved.index else None
    version = resolved.index.modelVersion if resolved.index else None
    return held, _result(reference, held, model_id, version, started)


def _unreachable(tmp: Path) -> None:
    raise AssertionError("a cached entry is never fetched")  # lease() only takes this path for cached entries


def _result(reference: str, held: CacheLease, model_id: str | None, version: int | None, started: float) -> PullResult:
    return PullResult(
        reference=reference,
        digest=held.digest,
        size=held.size,
        path=held.path,
        modelId=model_id,
        modelVersion=version,
        downloaded=held.downloaded,
        evicted=held.evicted,
        seconds=round(time.monotonic() - started, 3),
    )


def materialise(reference: str, cache_dir: Path | None = None, **kwargs: Any) -> Path:
    """The verified .llmpkg for `reference` in the cache, pulled first if needed (see `lease` for kwargs).

    Nothing is held once this returns: a later pull under a size limit may evict the file. A caller
    that keeps using it (a server unpacking it) should hold `lease(...)` instead."""
    held, result = lease(reference, cache_dir, **kwargs)
    held.close()
    return result.path


def pull(reference: str, cache_dir: Path | None = None, **kwargs: Any) -> PullResult:
    """`llmserve pull`: materialise and report."""
    held, result = lease(reference, cache_dir, **kwargs)
    held.close()
    return result
