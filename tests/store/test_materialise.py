"""The library entry points `serve` will call: materialise() and lease(), in process, on the real server."""

from __future__ import annotations

import pytest
from store_helpers import free_port

from llmserve.errors import NotFoundError
from llmserve.packaging.opened import open_package
from llmserve.store import lease, materialise, push
from llmserve.store.errors import BucketNotFoundError, ModelNotFoundError, StoreUnreachableError


def test_materialise_gives_a_package_serve_can_open(tmp_path, aws_env, bucket, small_packages):
    pushed = push(small_packages["a"], f"s3://{bucket}/prod")
    cache = tmp_path / "cache"
    path = materialise(f"s3://{bucket}/prod/model-a:1", cache)
    assert path == cache / "blobs" / "sha256" / f"{pushed.digest}.llmpkg"
    assert materialise(f"s3://{bucket}/prod/sha256:{pushed.digest}", cache) == path
    opened = open_package(path, cache=tmp_path / "unpacked")  # what serve does with a .llmpkg
    assert opened.manifest.modelId == "model-a" and opened.digest == pushed.digest


def test_a_cached_digest_needs_no_store(tmp_path, aws_env, bucket, small_packages, monkeypatch):
    digest = push(small_packages["b"], f"s3://{bucket}").digest
    materialise(f"s3://{bucket}/model-b:1", tmp_path)
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")  # nothing listens there
    held, result = lease(f"s3://{bucket}/sha256:{digest}", tmp_path)
    with held:
        assert result.downloaded is False and held.path.is_file()
    with pytest.raises(StoreUnreachableError) as err:
        materialise(f"s3://{bucket}/model-b:1", tmp_path)  # a version needs its index: the store
    assert err.value.hint and "--endpoint-url" in err.value.hint


def test_typed_errors(tmp_path, aws_env, bucket):
    with pytest.raises(ModelNotFoundError) as err:
        materialise(f"s3://{bucket}/nothing:1", tmp_path)
    assert isinstance(err.value, NotFoundError) and "pull --list" in (err.value.hint or "")
    with pytest.raises(BucketNotFoundError):
        materialise("s3://no-such-bucket-anywhere/x:1", tmp_path)
    assert not list(tmp_path.rglob("*.llmpkg"))
