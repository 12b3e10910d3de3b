"""`pull --list`: what a store holds, one row per (modelId, modelVersion)."""

from __future__ import annotations

from llmserve.store.client import StoreOptions, make_client
from llmserve.store.pull import list_store
from llmserve.store.records import VersionIndex
from llmserve.store.reference import parse_store


def list_models(store_url: str, *, options: StoreOptions | None = None) -> list[VersionIndex]:
    return list_store(make_client(options or StoreOptions()), parse_store(store_url))
