"""push and pull through the real `llmserve` entry point against a real S3 API (moto's server)."""

from __future__ import annotations

import importlib
import json
import stat

from store_helpers import free_port
from support.cli import run_cli, run_cli_json

from llmserve.packaging import read_index
from llmserve.store import pull, push
from llmserve.store.reference import parse_store


def test_push_then_pull_round_trip(tmp_path, aws_env, s3, bucket, multipart_package):
    store = f"s3://{bucket}/prod"
    code, pushed, out = run_cli_json("push", multipart_package, store, "--part-size", "5MiB", env=aws_env)
    assert code == 0, out
    digest = read_index(multipart_package, verify=False).digest
    size = multipart_package.stat().st_size
    assert pushed["digest"] == digest and pushed["size"] == size
    assert pushed["url"] == f"{store}/big-model:3" and not pushed["alreadyPresent"]
    assert pushed["partsTotal"] == 5 and pushed["partsUploaded"] == 5 and pushed["bytesUploaded"] == size

    # content-addressed layout: the archive under its digest, its parts record, one index per version
    keys = {o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]}
    assert keys == {
        f"prod/blobs/sha256/{digest}.llmpkg",
        f"prod/blobs/sha256/{digest}.parts.json",
        "prod/index/big-model/3.json",
    }
    head = s3.head_object(Bucket=bucket, Key=f"prod/blobs/sha256/{digest}.llmpkg", ChecksumMode="ENABLED")
    assert head["ContentLength"] == size and head["ChecksumSHA256"]  # uploaded with SHA256 part checksums
    assert not s3.list_multipart_uploads(Bucket=bucket).get("Uploads")

    cache = tmp_path / "cache"
    code, pulled, out = run_cli_json("pull", f"{store}/big-model:3", "--cache", cache, env=aws_env)
    assert code == 0, out
    assert pulled["digest"] == digest and pulled["downloaded"] is True and pulled["modelVersion"] == 3
    path = cache / "blobs" / "sha256" / f"{digest}.llmpkg"
    assert pulled["path"] == str(path)
    assert path.read_bytes() == multipart_package.read_bytes()
    assert not stat.S_IMODE(path.stat().st_mode) & 0o222  # cached archives are read-only
    assert list((cache / "tmp").iterdir()) == []

    # by digest, from the cache: nothing to download
    code, again, out = run_cli_json("pull", f"{store}/sha256:{digest}", "--cache", cache, env=aws_env)
    assert code == 0 and again["downloaded"] is False and again["path"] == str(path), out


def test_second_push_transfers_nothing(aws_env, s3, bucket, small_packages):
    store = f"s3://{bucket}"
    code, first, out = run_cli_json("push", small_packages["a"], store, env=aws_env)
    assert code == 0 and first["bytesUploaded"] == first["size"] and first["indexUpdated"], out
    blob = f"blobs/sha256/{first['digest']}.llmpkg"
    modified = s3.head_object(Bucket=bucket, Key=blob)["LastModified"]
    code, second, out = run_cli_json("push", small_packages["a"], store, env=aws_env)
    assert code == 0, out
    assert second["alreadyPresent"] is True and second["bytesUploaded"] == 0 and second["partsUploaded"] == 0
    assert second["indexUpdated"] is False
    assert s3.head_object(Bucket=bucket, Key=blob)["LastModified"] == modified

    r = run_cli("push", small_packages["a"], store, env=aws_env)
    assert r.returncode == 0 and "already in the store, nothing transferred" in r.stdout


def test_list_shows_every_version(aws_env, bucket, small_packages):
    store = f"s3://{bucket}/team/models"
    for name in ("a", "b"):
        push(small_packages[name], store)
    r = run_cli("pull", "--list", store, "-o", "json", env=aws_env)
    assert r.returncode == 0, r.stderr
    listed = json.loads(r.stdout)
    assert [(v["modelId"], v["modelVersion"]) for v in listed] == [("model-a", 1), ("model-b", 1)]
    assert all(len(v["digest"]) == 64 and v["backend"] == "vllm" for v in listed)
    r = run_cli("pull", "--list", store, env=aws_env)
    assert r.returncode == 0 and "model-a" in r.stdout and "model-b" in r.stdout


def test_endpoint_flag_without_env(tmp_path, aws_env, bucket, small_packages):
    env = {**aws_env, "AWS_ENDPOINT_URL": ""}
    endpoint = aws_env["AWS_ENDPOINT_URL"]
    code, pushed, out = run_cli_json("push", small_packages["b"], f"s3://{bucket}", "--endpoint-url", endpoint, env=env)
    assert code == 0, out
    code, pulled, out = run_cli_json(
        "pull", f"s3://{bucket}/model-b:1", "--cache", tmp_path, "--endpoint-url", endpoint, env=env
    )
    assert code == 0 and pulled["digest"] == pushed["digest"], out


def test_a_new_build_of_a_version_replaces_its_index(tmp_path, aws_env, s3, bucket, small_packages):
    from store_helpers import make_package

    store = f"s3://{bucket}"
    first = push(small_packages["a"], store).to_dict()
    rebuilt = make_package(tmp_path / "rebuilt", "model-a", 1, 1 << 20, seed=99)
    code, second, out = run_cli_json("push", rebuilt, store, env=aws_env)
    assert code == 0 and second["replacedDigest"] == first["digest"], out
    index = json.loads(s3.get_object(Bucket=bucket, Key="index/model-a/1.json")["Body"].read())
    assert index["digest"] == second["digest"] and index["previous"] == [first["digest"]]
    # both blobs stay: a digest reference to the first build still resolves
    code, pulled, out = run_cli_json(
        "pull", f"{store}/sha256:{first['digest']}", "--cache", tmp_path / "c", env=aws_env
    )
    assert code == 0 and pulled["digest"] == first["digest"], out


def test_offline_pull_needs_no_store(tmp_path, aws_env, bucket, small_packages):
    pushed = push(small_packages["c"], f"s3://{bucket}").to_dict()
    ref = f"s3://{bucket}/model-c:1"
    pull(ref, tmp_path)
    dead = {**aws_env, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}"}
    code, pulled, out = run_cli_json("pull", ref, "--cache", tmp_path, "--offline", env=dead)
    assert code == 0 and pulled["digest"] == pushed["digest"] and pulled["downloaded"] is False, out
    code, err, out = run_cli_json("pull", f"s3://{bucket}/model-a:1", "--cache", tmp_path, "--offline", env=dead)
    assert code == 5 and err["error"] == "store-model-not-found" and "llmserve pull" in err["hint"], out


def test_concurrent_pushes_of_one_package_both_succeed(tmp_path, aws_env, s3, bucket, multipart_package):
    from support.cli import popen_cli

    logs = [tmp_path / f"push{i}.log" for i in range(2)]
    procs = [popen_cli("push", multipart_package, f"s3://{bucket}", "--part-size", "5MiB", log=log, env=aws_env)
             for log in logs]  # fmt: skip
    codes = [p.wait(120) for p in procs]
    results = [json.loads(log.read_text()) for log in logs]
    assert codes == [0, 0], results
    assert {r["digest"] for r in results} == {read_index(multipart_package, verify=False).digest}
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]]
    assert len([k for k in keys if k.endswith(".llmpkg")]) == 1 and len(keys) == 3
    assert not s3.list_multipart_uploads(Bucket=bucket).get("Uploads")
    code, pulled, out = run_cli_json("pull", f"s3://{bucket}/big-model:3", "--cache", tmp_path / "c", env=aws_env)
    assert code == 0 and pulled["downloaded"], out


def _after_each_listing(monkeypatch, then) -> None:
    """Push's clients call then(listing) after each list of unfinished uploads: another party's step,
    run on the real store at the one moment a race would put it."""
    push_module = importlib.import_module("llmserve.store.push")  # the package exports a function of that name
    real_client = push_module.make_client

    class Interleaved:
        def __init__(self, inner):
            self._inner = inner

        def __getattr__(self, name):
            return getattr(self._inner, name)

        def list_multipart_uploads(self, **kwargs):
            listing = self._inner.list_multipart_uploads(**kwargs)
            then(listing)
            return listing

    monkeypatch.setattr(push_module, "make_client", lambda options: Interleaved(real_client(options)))


def test_a_push_whose_listed_upload_another_completes_waits_for_that_push(
    aws_env, s3, bucket, multipart_package, monkeypatch
):
    """The interleaving behind a flaky CI run, forced: push A lists an unfinished upload of the blob,
    push B completes that upload before A reads its parts (A then met NoSuchUpload and failed)."""
    store = f"s3://{bucket}"
    digest = read_index(multipart_package, verify=False).digest
    s3.create_multipart_upload(Bucket=bucket, Key=parse_store(store).blob_key(digest), ChecksumAlgorithm="SHA256")
    other: list = []

    def b_runs_to_the_end(listing):
        if not other:
            other.append(None)  # B's own listings pass through
            other[0] = push(multipart_package, store, part_size=5 << 20)

    _after_each_listing(monkeypatch, b_runs_to_the_end)
    first = push(multipart_package, store, part_size=5 << 20)
    assert other[0].alreadyPresent is False and other[0].partsUploaded == 5
    assert first.alreadyPresent is True and first.digest == digest
    assert not s3.list_multipart_uploads(Bucket=bucket).get("Uploads")


def test_a_push_whose_listed_upload_is_aborted_starts_a_new_one(
    tmp_path, aws_env, s3, bucket, multipart_package, monkeypatch
):
    """An unfinished upload aborted between the listing and the read of its parts (a lifecycle rule,
    an operator) leaves no blob: the push looks again and uploads into an upload of its own."""
    store = f"s3://{bucket}"
    key = parse_store(store).blob_key(read_index(multipart_package, verify=False).digest)
    stale = s3.create_multipart_upload(Bucket=bucket, Key=key, ChecksumAlgorithm="SHA256")["UploadId"]

    def aborted(listing):
        if any(u["UploadId"] == stale for u in listing.get("Uploads", [])):
            s3.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=stale)

    _after_each_listing(monkeypatch, aborted)
    result = push(multipart_package, store, part_size=5 << 20)
    assert result.alreadyPresent is False and result.partsUploaded == 5
    code, pulled, out = run_cli_json("pull", f"{store}/big-model:3", "--cache", tmp_path / "c", env=aws_env)
    assert code == 0 and pulled["downloaded"], out


def test_a_push_whose_listed_uploads_keep_going_away_uploads_into_its_own(
    tmp_path, aws_env, s3, bucket, multipart_package, monkeypatch
):
    """Every listing names an upload that is gone before its parts are read (a store whose listing
    lags behind its aborts): after two looks the push stops resuming and starts an upload of its own
    (the third upload listed is the one its housekeeping finds once the blob is complete)."""
    store = f"s3://{bucket}"
    key = parse_store(store).blob_key(read_index(multipart_package, verify=False).digest)
    s3.create_multipart_upload(Bucket=bucket, Key=key, ChecksumAlgorithm="SHA256")
    vanished: list[str] = []

    def gone_once_listed(listing):
        for u in listing.get("Uploads", []):
            s3.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=u["UploadId"])
            vanished.append(u["UploadId"])
        if len(vanished) < 3:  # the next look finds another one, gone as well
            s3.create_multipart_upload(Bucket=bucket, Key=key, ChecksumAlgorithm="SHA256")

    _after_each_listing(monkeypatch, gone_once_listed)
    result = push(multipart_package, store, part_size=5 << 20)
    assert len(vanished) == 3 and result.alreadyPresent is False and result.partsUploaded == 5
    code, pulled, out = run_cli_json("pull", f"{store}/big-model:3", "--cache", tmp_path / "c", env=aws_env)
    assert code == 0 and pulled["downloaded"], out
