"""A push killed mid-way (SIGKILL, as a node loss would) continues where it stopped; a pull killed
mid-way leaves nothing visible and the next pull completes."""

from __future__ import annotations

import hashlib
import signal
import time

from support.cli import popen_cli, run_cli_json

from llmserve.packaging import read_index


def _wait(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _parts_done(s3, bucket: str) -> int:
    uploads = s3.list_multipart_uploads(Bucket=bucket).get("Uploads", [])
    if not uploads:
        return 0
    u = uploads[0]
    return len(s3.list_parts(Bucket=bucket, Key=u["Key"], UploadId=u["UploadId"]).get("Parts", []))


def _whole_parts(s3, bucket: str, data: bytes, part_size: int) -> list[int]:
    """Numbers of the listed parts of the one unfinished upload that hold exactly our bytes."""
    u = s3.list_multipart_uploads(Bucket=bucket)["Uploads"][0]
    whole = []
    for p in s3.list_parts(Bucket=bucket, Key=u["Key"], UploadId=u["UploadId"]).get("Parts", []):
        n = p["PartNumber"]
        mine = data[(n - 1) * part_size : n * part_size]
        if p["Size"] == len(mine) and p["ETag"].strip('"') == hashlib.md5(mine).hexdigest():
            whole.append(n)
    return whole


def test_killed_push_resumes_from_its_parts(tmp_path, aws_env, s3, bucket, multipart_package):
    store = f"s3://{bucket}/prod"
    size = multipart_package.stat().st_size
    digest = read_index(multipart_package, verify=False).digest
    # One part at a time at ~5 MB/s: five 5 MiB parts take ~5 s, time enough to kill it after three.
    proc = popen_cli(
        "push", multipart_package, store, "--part-size", "5MiB", "--concurrency", "1", "--max-bandwidth", "5M",
        log=tmp_path / "push.log", env=aws_env,
    )  # fmt: skip
    try:
        done = _wait(lambda: _parts_done(s3, bucket) >= 3, 60, "three uploaded parts")
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        proc.kill()
    assert done < 5, "the push finished before it could be killed"
    # nothing is visible: no archive, no parts record, no index; the upload's parts are kept
    assert s3.list_objects_v2(Bucket=bucket).get("KeyCount", 0) == 0
    # With one part in flight at a time, at least two of the listed parts are whole (the store may
    # list the part being received when the push died; the resumed push must send that one again).
    whole = _whole_parts(s3, bucket, multipart_package.read_bytes(), 5 << 20)
    assert len(whole) >= 2

    code, resumed, out = run_cli_json("push", multipart_package, store, "--part-size", "5MiB", env=aws_env)
    assert code == 0, out
    assert resumed["partsReused"] == len(whole) and resumed["partsUploaded"] == 5 - len(whole)
    assert resumed["bytesUploaded"] == size - len(whole) * (5 << 20)
    assert not s3.list_multipart_uploads(Bucket=bucket).get("Uploads")
    blob = s3.get_object(Bucket=bucket, Key=f"prod/blobs/sha256/{digest}.llmpkg")["Body"].read()
    assert blob == multipart_package.read_bytes()

    code, pulled, out = run_cli_json("pull", f"{store}/big-model:3", "--cache", tmp_path / "cache", env=aws_env)
    assert code == 0 and pulled["digest"] == digest, out


def test_resume_replaces_a_part_that_differs(tmp_path, aws_env, s3, bucket, multipart_package):
    """A part left by an earlier upload that is not our bytes (another build, a bad write) is sent again."""
    from llmserve.store import push

    digest = read_index(multipart_package, verify=False).digest
    key = f"blobs/sha256/{digest}.llmpkg"
    upload = s3.create_multipart_upload(Bucket=bucket, Key=key, ChecksumAlgorithm="SHA256")
    s3.upload_part(Bucket=bucket, Key=key, UploadId=upload["UploadId"], PartNumber=1, Body=b"x" * (5 << 20))
    data = multipart_package.read_bytes()
    s3.upload_part(Bucket=bucket, Key=key, UploadId=upload["UploadId"], PartNumber=2, Body=data[5 << 20 : 10 << 20])
    result = push(multipart_package, f"s3://{bucket}", part_size=5 << 20)
    assert result.partsReused == 1 and result.partsUploaded == 4
    assert s3.get_object(Bucket=bucket, Key=key)["Body"].read() == data


def test_killed_pull_leaves_nothing_visible(tmp_path, aws_env, s3, bucket, multipart_package):
    from llmserve.store import push

    push(multipart_package, f"s3://{bucket}", part_size=5 << 20)
    cache = tmp_path / "cache"
    proc = popen_cli("pull", f"s3://{bucket}/big-model:3", "--cache", cache, "--concurrency", "1",
                     log=tmp_path / "pull.log", env=aws_env)  # fmt: skip
    try:
        # the download's temporary file is preallocated before the first byte arrives
        _wait(lambda: list((cache / "tmp").glob("*.partial")) if (cache / "tmp").is_dir() else None, 60, "a download")
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        proc.kill()
    assert not list((cache / "blobs" / "sha256").glob("*.llmpkg")), "an unverified archive became visible"
    code, pulled, out = run_cli_json("pull", f"s3://{bucket}/big-model:3", "--cache", cache, env=aws_env)
    assert code == 0 and pulled["downloaded"] is True, out
    assert list((cache / "tmp").iterdir()) == []
    assert (cache / "blobs" / "sha256" / f"{pulled['digest']}.llmpkg").read_bytes() == multipart_package.read_bytes()
