"""The model store: packages pushed to S3-compatible object storage, pulled into a local fast cache.

Public surface (everything else is private to the package):

    push(package, "s3://bucket/prefix")              -> PushResult
    pull("s3://bucket/prefix/model:1", cache_dir)    -> PullResult
    materialise(reference, cache_dir) -> Path        the verified .llmpkg in the cache
    lease(reference, cache_dir) -> (CacheLease, PullResult)   the same, held against eviction
    list_models("s3://bucket/prefix")                -> list[VersionIndex]
"""

from llmserve.store.client import StoreOptions
from llmserve.store.listing import list_models
from llmserve.store.materialise import PullResult, default_cache_dir, lease, materialise, pull
from llmserve.store.push import PushResult, push
from llmserve.store.records import VersionIndex
from llmserve.store.reference import parse_size

__all__ = [
    "PullResult",
    "PushResult",
    "StoreOptions",
    "VersionIndex",
    "default_cache_dir",
    "lease",
    "list_models",
    "materialise",
    "parse_size",
    "pull",
    "push",
]
