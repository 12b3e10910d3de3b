"""The S3 client: built from the usual AWS configuration, and its failures turned into store errors.

Endpoint, region and credentials come from boto3's own chain (environment, AWS_PROFILE or --profile,
~/.aws/config and credentials, AWS_ENDPOINT_URL); the only flags are the endpoint URL, the profile
and the region, never a secret, so no credential ever sits in a process's arguments.

boto3 is imported here, lazily: `llmserve --help` and the commands that do not touch a store stay fast.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from llmserve.errors import LLMServeError, MissingExtraError
from llmserve.store.errors import (
    BucketNotFoundError,
    CorruptObjectError,
    StoreCredentialsError,
    StoreUnreachableError,
    TransferInterruptedError,
)

_CREDENTIAL_CODES = frozenset(
    {
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "AccessDenied",
        "ExpiredToken",
        "InvalidToken",
        "TokenRefreshRequired",
        "InvalidClientTokenId",
        "AuthorizationHeaderMalformed",
        "403",
    }
)
_BUCKET_CODES = frozenset({"NoSuchBucket"})
_DIGEST_CODES = frozenset({"BadDigest", "InvalidDigest", "XAmzContentSHA256Mismatch"})


@dataclass(frozen=True)
class StoreOptions:
    """Where the store is and who we are: everything else comes from the AWS configuration."""

    endpoint_url: str | None = None
    profile: str | None = None
    region: str | None = None
    max_connections: int = 16


def make_client(options: StoreOptions) -> Any:
    try:
        import boto3
        from botocore.config import Config
    except ModuleNotFoundError as exc:  # boto3 is the store's only third-party dependency
        raise MissingExtraError(exc.name or "boto3", "store") from exc
    import botocore.exceptions as bex

    try:
        session = boto3.Session(profile_name=options.profile, region_name=options.region)
    except bex.ProfileNotFound as exc:
        raise StoreCredentialsError(f"AWS profile '{options.profile}' is not configured") from exc
    config = Config(
        max_pool_connections=options.max_connections,
        retries={"mode": "standard", "max_attempts": 5},
        connect_timeout=10,
        read_timeout=60,
    )
    return session.client("s3", endpoint_url=options.endpoint_url, config=config)


def error_code(exc: BaseException) -> str | None:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        code = response.get("Error", {}).get("Code")
        return str(code) if code is not None else None
    return None


def is_not_found(exc: BaseException) -> bool:
    return error_code(exc) in ("404", "NoSuchKey", "NotFound")


def translate(exc: BaseException, what: str, *, bucket: str, during_transfer: bool = False) -> LLMServeError:
    """A typed store error for a botocore failure while doing `what` (e.g. "uploading part 3 of s3://...").

    The message names the operation and the error code, never the server's text or request data.
    """
    import botocore.exceptions as bex

    code = error_code(exc)
    if isinstance(exc, bex.NoCredentialsError | bex.PartialCredentialsError):
        return StoreCredentialsError(f"{what}: no AWS credentials found")
    if code in _BUCKET_CODES:
        return BucketNotFoundError(f"{what}: bucket '{bucket}' does not exist")
    if code in _CREDENTIAL_CODES:
        return StoreCredentialsError(f"{what}: the store refused our credentials ({code})")
    if code in _DIGEST_CODES:
        return CorruptObjectError(
            f"{what}: the store received bytes that do not match their checksum ({code})",
            hint="Run the same command again; if it fails again, check the network path to the store.",
        )
    if isinstance(exc, bex.EndpointConnectionError | bex.ConnectTimeoutError):
        if during_transfer:  # the store went away mid-way: what was sent is kept, and a rerun continues
            return TransferInterruptedError(f"{what}: the store stopped answering ({type(exc).__name__})")
        return StoreUnreachableError(f"{what}: cannot connect to the store ({type(exc).__name__})")
    if isinstance(exc, bex.ReadTimeoutError | bex.ConnectionClosedError | bex.IncompleteReadError) or during_transfer:
        return TransferInterruptedError(f"{what}: the transfer was interrupted ({code or type(exc).__name__})")
    if isinstance(exc, bex.BotoCoreError):
        return StoreUnreachableError(f"{what}: {type(exc).__name__}")
    return StoreUnreachableError(f"{what}: the store answered with error {code or type(exc).__name__}")


def store_errors() -> tuple[type[BaseException], ...]:
    """The exception types that `translate` handles (botocore's), for `except` clauses."""
    import botocore.exceptions as bex

    return (bex.BotoCoreError, bex.ClientError)
