"""The local cache: concurrent pulls, the size limit with LRU eviction, entries in use, bad objects."""

from __future__ import annotations

import json
import shlex
import subprocess

import pytest
from support.cli import cli_argv, cli_env, popen_cli, run_cli_json

from llmserve.packaging import read_index
from llmserve.store import lease, pull, push


def _blobs(cache) -> set[str]:
    return {p.name.removesuffix(".llmpkg") for p in (cache / "blobs" / "sha256").glob("*.llmpkg")}


def test_concurrent_pulls_download_once(tmp_path, aws_env, bucket, multipart_package):
    push(multipart_package, f"s3://{bucket}", part_size=5 << 20)
    cache = tmp_path / "cache"
    logs = [tmp_path / f"pull{i}.log" for i in range(3)]
    procs = [popen_cli("pull", f"s3://{bucket}/big-model:3", "--cache", cache, log=log, env=aws_env) for log in logs]
    for p in procs:
        assert p.wait(120) == 0
    results = [json.loads(log.read_text()) for log in logs]
    assert sorted(r["downloaded"] for r in results) == [False, False, True]  # one downloads, the others reuse
    assert len({r["path"] for r in results}) == 1
    digest = read_index(multipart_package, verify=False).digest
    assert _blobs(cache) == {digest} and list((cache / "tmp").iterdir()) == []
    assert (cache / "blobs" / "sha256" / f"{digest}.llmpkg").read_bytes() == multipart_package.read_bytes()


@pytest.fixture
def three_pushed(bucket, small_packages) -> dict[str, str]:
    """model-a, -b, -c pushed; name -> digest."""
    return {name: push(pkg, f"s3://{bucket}").digest for name, pkg in small_packages.items()}


LIMIT = "14M"  # two ~6.3 MB packages fit, three do not


def test_size_limit_evicts_least_recently_used(tmp_path, aws_env, bucket, three_pushed):
    cache = tmp_path / "cache"
    pull(f"s3://{bucket}/model-a:1", cache)
    pull(f"s3://{bucket}/model-b:1", cache)
    pull(f"s3://{bucket}/model-a:1", cache)  # a is used again: b is now the least recently used
    code, got, out = run_cli_json("pull", f"s3://{bucket}/model-c:1", "--cache", cache, "--max-cache-size", LIMIT,
                                  env=aws_env)  # fmt: skip
    assert code == 0, out
    assert got["evicted"] == [three_pushed["b"]]
    assert _blobs(cache) == {three_pushed["a"], three_pushed["c"]}


def test_a_package_in_use_is_never_evicted(tmp_path, aws_env, bucket, three_pushed):
    cache = tmp_path / "cache"
    held_a, _ = lease(f"s3://{bucket}/model-a:1", cache)  # the least recently used, but in use
    pull(f"s3://{bucket}/model-b:1", cache)
    try:
        code, got, out = run_cli_json("pull", f"s3://{bucket}/model-c:1", "--cache", cache, "--max-cache-size", LIMIT,
                                      env=aws_env)  # fmt: skip
        assert code == 0, out
        assert got["evicted"] == [three_pushed["b"]]
        with lease(f"s3://{bucket}/model-c:1", cache)[0]:
            # a and c in use: b cannot come back under the limit
            code, err, out = run_cli_json("pull", f"s3://{bucket}/model-b:1", "--cache", cache, "--max-cache-size",
                                          LIMIT, env=aws_env)  # fmt: skip
            assert code == 8 and err["error"] == "cache-full", out
            assert "2 package(s) in use" in err["message"] and "--max-cache-size" in err["hint"]
        assert _blobs(cache) == {three_pushed["a"], three_pushed["c"]}
        assert list((cache / "tmp").iterdir()) == []
    finally:
        held_a.close()
    # released: now a (least recently used) can go
    got = pull(f"s3://{bucket}/model-b:1", cache, max_cache_bytes=14_000_000)
    assert got.evicted == [three_pushed["a"]]


def test_corrupted_object_is_refused_and_never_cached(tmp_path, aws_env, s3, bucket, small_packages):
    digest = push(small_packages["a"], f"s3://{bucket}").digest
    key = f"blobs/sha256/{digest}.llmpkg"
    raw = bytearray(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
    raw[len(raw) // 2] ^= 0x01  # one bit, same size
    s3.put_object(Bucket=bucket, Key=key, Body=bytes(raw))
    cache = tmp_path / "cache"
    code, err, out = run_cli_json("pull", f"s3://{bucket}/model-a:1", "--cache", cache, env=aws_env)
    assert code == 4 and err["error"] == "store-object-corrupt", out
    assert "does not match the sha256 recorded at push" in err["message"] and "llmserve push" in err["hint"]
    assert _blobs(cache) == set() and list((cache / "tmp").iterdir()) == []


def test_parts_record_that_lies_is_caught_by_the_package_digest(tmp_path, aws_env, s3, bucket, small_packages):
    """Even with a parts record rewritten to match a tampered archive, the package digest refuses it."""
    import hashlib

    digest = push(small_packages["a"], f"s3://{bucket}").digest
    key = f"blobs/sha256/{digest}.llmpkg"
    raw = bytearray(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
    raw[len(raw) // 2] ^= 0x01
    s3.put_object(Bucket=bucket, Key=key, Body=bytes(raw))
    record = json.loads(s3.get_object(Bucket=bucket, Key=f"blobs/sha256/{digest}.parts.json")["Body"].read())
    size = record["partSize"]
    record["parts"] = [hashlib.sha256(raw[i : i + size]).hexdigest() for i in range(0, len(raw), size)]
    s3.put_object(Bucket=bucket, Key=f"blobs/sha256/{digest}.parts.json", Body=json.dumps(record).encode())
    code, err, out = run_cli_json("pull", f"s3://{bucket}/model-a:1", "--cache", tmp_path, env=aws_env)
    assert code == 4 and err["error"] == "store-object-corrupt" and "fails verification" in err["message"], out
    assert _blobs(tmp_path) == set()


def test_corrupted_local_package_is_never_pushed(tmp_path, aws_env, s3, bucket, small_packages):
    bad = tmp_path / "bad.llmpkg"
    raw = bytearray(small_packages["a"].read_bytes())
    raw[len(raw) // 2] ^= 0x01
    bad.write_bytes(bytes(raw))
    code, err, out = run_cli_json("push", bad, f"s3://{bucket}", env=aws_env)
    assert code == 4 and err["error"] == "integrity", out
    assert s3.list_objects_v2(Bucket=bucket).get("KeyCount", 0) == 0
    assert not s3.list_multipart_uploads(Bucket=bucket).get("Uploads")


def _in_private_mount(setup: str, *args: object, env: dict[str, str]) -> tuple[int, dict | None, str]:
    """`llmserve ARGS -o json` in a private mount namespace after `setup` (shell) ran in it: a small or
    read-only file system for this one process, invisible to the rest of the machine."""
    script = f"{setup} && exec {shlex.join(cli_argv(*args, '-o', 'json'))}"
    p = subprocess.run(["unshare", "--mount", "sh", "-c", script], capture_output=True, text=True,
                       env=cli_env(env), timeout=120)  # fmt: skip
    try:
        data = json.loads(p.stdout) if p.stdout.strip() else None
    except ValueError:
        data = None
    return p.returncode, data, p.stderr + p.stdout


def test_disk_full_is_a_clear_error(tmp_path, aws_env, bucket, multipart_package):
    push(multipart_package, f"s3://{bucket}", part_size=5 << 20)
    cache = tmp_path / "small"
    cache.mkdir()
    code, err, out = _in_private_mount(
        f"mount -t tmpfs -o size=8m tmpfs {cache}", "pull", f"s3://{bucket}/big-model:3", "--cache", cache, env=aws_env
    )
    assert code == 8 and err is not None and err["error"] == "disk-full", out
    assert "--max-cache-size" in err["hint"]


def test_read_only_cache(tmp_path, aws_env, bucket, small_packages):
    digest = push(small_packages["a"], f"s3://{bucket}").digest
    ref = f"s3://{bucket}/model-a:1"
    empty = tmp_path / "empty"
    empty.mkdir()
    code, err, out = _in_private_mount(
        f"mount -t tmpfs tmpfs {empty} && mount -o remount,ro {empty}", "pull", ref, "--cache", empty, env=aws_env
    )
    assert code == 8 and err is not None and err["error"] == "cache-read-only", out
    assert "writable folder" in err["hint"]

    # a read-only cache filled beforehand (a shared volume mounted read-only) still serves what it holds
    filled = tmp_path / "filled"
    pull(ref, filled)
    code, got, out = _in_private_mount(
        f"mount --bind {filled} {filled} && mount -o remount,bind,ro {filled}", "pull", ref, "--cache", filled,
        env=aws_env,
    )  # fmt: skip
    assert code == 0 and got is not None and got["digest"] == digest and got["downloaded"] is False, out


def test_another_package_under_the_digest_is_refused(tmp_path, aws_env, s3, bucket, small_packages):
    """A blob swapped for another (valid) package, its parts record rewritten to match: the digest
    index inside the archive names another package, and the pull says so."""
    a = push(small_packages["a"], f"s3://{bucket}").digest
    b = push(small_packages["b"], f"s3://{bucket}").digest
    blob_b = s3.get_object(Bucket=bucket, Key=f"blobs/sha256/{b}.llmpkg")["Body"].read()
    record_b = json.loads(s3.get_object(Bucket=bucket, Key=f"blobs/sha256/{b}.parts.json")["Body"].read())
    s3.put_object(Bucket=bucket, Key=f"blobs/sha256/{a}.llmpkg", Body=blob_b)
    s3.put_object(Bucket=bucket, Key=f"blobs/sha256/{a}.parts.json", Body=json.dumps({**record_b, "digest": a}))
    code, err, out = run_cli_json("pull", f"s3://{bucket}/model-a:1", "--cache", tmp_path, env=aws_env)
    assert code == 4 and err["error"] == "store-object-corrupt", out
    assert f"is package sha256:{b[:16]}" in err["message"] and f"not sha256:{a[:16]}" in err["message"]
    assert _blobs(tmp_path) == set()
