"""Small-object reads and writes of the store (records, indexes) with their errors translated."""

from __future__ import annotations

from typing import Any

from llmserve.store.client import error_code, is_not_found, store_errors, translate
from llmserve.store.errors import BucketNotFoundError
from llmserve.store.reference import StoreLocation


def get_bytes(client: Any, bucket: str, key: str) -> bytes | None:
    try:
        body: bytes = client.get_object(Bucket=bucket, Key=key)["Body"].read()
        return body
    except store_errors() as exc:
        if is_not_found(exc):
            return None
        raise translate(exc, f"reading s3://{bucket}/{key}", bucket=bucket) from exc


def check_bucket(client: Any, store: StoreLocation) -> None:
    try:
        client.head_bucket(Bucket=store.bucket)
    except store_errors() as exc:
        if error_code(exc) in ("404", "NoSuchBucket"):
            raise BucketNotFoundError(f"{store.url}: bucket '{store.bucket}' does not exist") from exc
        raise translate(exc, f"opening {store.url}", bucket=store.bucket) from exc


def put_json(client: Any, bucket: str, key: str, body: str) -> None:
    try:
        client.put_object(Bucket=bucket, Key=key, Body=body.encode(), ContentType="application/json")
    except store_errors() as exc:
        raise translate(exc, f"writing s3://{bucket}/{key}", bucket=bucket) from exc
