"""Store URLs, model references, sizes and the part plan (pure functions, no server)."""

from __future__ import annotations

import pytest

from llmserve.store.errors import StoreReferenceError
from llmserve.store.push import DEFAULT_PART_SIZE, MAX_PARTS, default_part_size
from llmserve.store.reference import parse_model, parse_size, parse_store


def test_model_references():
    ref = parse_model("s3://models/team/prod/tiny-chat:12")
    assert (ref.store.bucket, ref.store.prefix, ref.model_id, ref.version) == ("models", "team/prod", "tiny-chat", 12)
    assert ref.store.index_key("tiny-chat", 12) == "team/prod/index/tiny-chat/12.json"
    digest = "ab" * 32
    ref = parse_model(f"s3://models/sha256:{digest}")
    assert (
        ref.digest == digest
        and ref.store.prefix == ""
        and ref.store.blob_key(digest) == f"blobs/sha256/{digest}.llmpkg"
    )
    assert parse_store("s3://models/a//b/").url == "s3://models/a/b"


@pytest.mark.parametrize(
    "url", ["models/x:1", "s3://Bad_Bucket/x:1", "s3://models/x", "s3://models/x:0", "s3://models/../x:1", "s3://m/x:1"]
)
def test_bad_model_references(url):
    with pytest.raises(StoreReferenceError):
        parse_model(url)


def test_sizes():
    assert parse_size("16MiB") == 16 << 20 and parse_size("10G") == 10**10 and parse_size("500") == 500
    assert parse_size("1.5 GiB") == 3 << 29 and parse_size("14M") == 14_000_000
    with pytest.raises(StoreReferenceError):
        parse_size("ten")


def test_part_size_depends_on_size_alone():
    assert default_part_size(1 << 30) == DEFAULT_PART_SIZE
    huge = 400 << 30  # 400 GiB would need 25,600 parts of 16 MiB
    assert -(-huge // default_part_size(huge)) <= MAX_PARTS and default_part_size(huge) % (1 << 20) == 0
