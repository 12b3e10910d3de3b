"""Errors of the model store and the local cache.

Each one subclasses a type of llmserve.errors, so its exit code says what kind of failure it is
(4 integrity, 5 not found, 8 unavailable), and carries a hint naming the next step. Messages are
built from error codes and our own words, never from request data: a signature error's response
carries the string that was signed, and nothing of a credential may reach a log or a terminal.
"""

from __future__ import annotations

from llmserve.errors import IntegrityError, InvalidInputError, NotFoundError, UnavailableError


class StoreReferenceError(InvalidInputError):
    code = "store-reference"
    default_hint = (
        "Write a store as s3://BUCKET/PREFIX and a model in it as s3://BUCKET/PREFIX/MODEL_ID:VERSION "
        "(or s3://BUCKET/PREFIX/sha256:DIGEST)."
    )


class BucketNotFoundError(NotFoundError):
    code = "store-bucket-not-found"
    default_hint = "Check the bucket name and --endpoint-url, or create the bucket (`aws s3 mb s3://BUCKET`)."


class ModelNotFoundError(NotFoundError):
    code = "store-model-not-found"
    default_hint = "List what the store holds with `llmserve pull --list s3://BUCKET/PREFIX`."


class StoreCredentialsError(UnavailableError):
    code = "store-credentials"
    default_hint = (
        "Check the AWS profile (--profile, AWS_PROFILE) or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, "
        "then run the command again (`aws sts get-caller-identity` shows who you are)."
    )


class StoreUnreachableError(UnavailableError):
    code = "store-unreachable"
    default_hint = "Check --endpoint-url (or AWS_ENDPOINT_URL) and the network, then run the command again."


class TransferInterruptedError(UnavailableError):
    code = "transfer-interrupted"
    default_hint = "Run the same command again: a push continues from the parts already on the store."


class CorruptObjectError(IntegrityError):
    """What the store holds does not match the digests it was pushed with."""

    code = "store-object-corrupt"
    default_hint = "Push the package again (`llmserve push PKG s3://BUCKET/PREFIX`), then pull it."


class DiskFullError(UnavailableError):
    code = "disk-full"
    default_hint = "Free space on that file system, lower --max-cache-size, or pull into another --cache folder."


class CacheReadOnlyError(UnavailableError):
    code = "cache-read-only"
    default_hint = (
        "Point --cache (or LLMSERVE_CACHE) at a writable folder; a read-only cache serves only packages already in it."
    )


class CacheFullError(UnavailableError):
    code = "cache-full"
    default_hint = (
        "Raise --max-cache-size, or stop the servers using cached packages so that they can be evicted, "
        "then run the command again."
    )
