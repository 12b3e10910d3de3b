#!/usr/bin/env python
"""Push and pull of a large package (default 1 GiB) against a local S3 server, side by side with plain
boto3 `upload_file` / `download_file` at default settings, in one run.

The server is moto's server mode on 127.0.0.1, started by this script (s3_server.py: moto with
ranged GETs that read only their range, as S3 does; moto itself reads the whole object per range). Both sides run in this process
with the same endpoint and credentials, alternating, ROUNDS times, each on a fresh bucket:
    boto3 upload_file          vs  llmserve push  (verifies the package, SHA256 per part, composite check)
    boto3 download_file        vs  llmserve pull  (into an empty cache; per-part and package digest checks)
Reports seconds and MB/s per operation (median over rounds) and llmserve/boto3 throughput ratios
(target: >= 1.0 for both). The cold `llmserve serve` from the cache vs from the store is cold_start.py.

Usage:
    python benchmarks/store/run.py [--size 1GiB] [--rounds 2] [--concurrency 8] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from llmserve.packaging import build_package, read_index
from llmserve.store import pull, push
from llmserve.store.reference import parse_size


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start_moto(log: Path) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, str(Path(__file__).with_name("s3_server.py")), str(port)],
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        # Objects stay in the server's memory instead of spilling to temporary files on this machine's
        # disk: a remote store's disk is not the cache's, and its writeback would slow the pull's fsync.
        env={**os.environ, "MOTO_S3_DEFAULT_KEY_BUFFER_SIZE": str(8 << 30)},
    )
    for _ in range(300):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc, f"http://127.0.0.1:{port}"
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit("moto server did not start")


def _make_package(root: Path, size: int) -> Path:
    """A real .llmpkg around `size` bytes of random weights (random: nothing in the path can compress it)."""
    weights = root / "src" / "model"
    weights.mkdir(parents=True)
    (weights / "config.json").write_text('{"model_type": "llama"}')
    header = b'{"__metadata__":{}}'
    rng = random.Random(0)
    with open(weights / "model.safetensors", "wb") as fh:
        fh.write(len(header).to_bytes(8, "little") + header)
        for _ in range(0, size, 64 << 20):
            fh.write(rng.randbytes(min(64 << 20, size)))
    (root / "src" / "llmserve.yaml").write_text("modelId: bench-model\nmodelVersion: 1\nbackend: vllm\n")
    return build_package(root / "src", root / "dist").path


def _round(s3, pkg: Path, digest: str, work: Path, r: int, concurrency: int, times: dict[str, list[float]]) -> None:
    bucket = f"bench-{uuid.uuid4().hex[:10]}"
    s3.create_bucket(Bucket=bucket)
    # alternate which side goes first, so neither always meets a warmer server
    order = ["boto3", "llmserve"] if r % 2 == 0 else ["llmserve", "boto3"]
    for side in order:
        t = time.perf_counter()
        if side == "boto3":
            s3.upload_file(str(pkg), bucket, "plain.llmpkg")
            times["boto3 upload_file"].append(time.perf_counter() - t)
        else:
            push(pkg, f"s3://{bucket}/store", concurrency=concurrency)
            times["llmserve push"].append(time.perf_counter() - t)
    for side in order:
        t = time.perf_counter()
        if side == "boto3":
            out = work / "plain-download.llmpkg"
            s3.download_file(bucket, "plain.llmpkg", str(out))
            times["boto3 download_file"].append(time.perf_counter() - t)
            out.unlink()
        else:
            cache = work / f"cache-{r}"
            got = pull(f"s3://{bucket}/store/bench-model:1", cache, concurrency=concurrency)
            times["llmserve pull"].append(time.perf_counter() - t)
            assert got.downloaded and got.digest == digest
            shutil.rmtree(cache)
    for o in s3.list_objects_v2(Bucket=bucket).get("Contents", []):
        s3.delete_object(Bucket=bucket, Key=o["Key"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="1GiB", help="weights size (default 1GiB)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=8, help="llmserve's parts in parallel (its default: 8)")
    ap.add_argument("--json", type=Path, help="write the results here too")
    args = ap.parse_args()

    import boto3

    work = Path(tempfile.mkdtemp(prefix="llmserve-store-bench-"))
    proc, endpoint = _start_moto(work / "moto.log")
    os.environ.update(
        AWS_ENDPOINT_URL=endpoint,
        AWS_ACCESS_KEY_ID="bench",
        AWS_SECRET_ACCESS_KEY="bench",
        AWS_DEFAULT_REGION="us-east-1",
    )
    try:
        t = time.perf_counter()
        pkg = _make_package(work, parse_size(args.size))
        size = pkg.stat().st_size
        digest = read_index(pkg, verify=False).digest
        print(f"package: {size:,} bytes, built in {time.perf_counter() - t:.1f} s; server {endpoint}", flush=True)
        s3 = boto3.client("s3")
        times: dict[str, list[float]] = {"boto3 upload_file": [], "llmserve push": [], "boto3 download_file": [],
                                         "llmserve pull": []}  # fmt: skip
        for r in range(args.rounds):
            _round(s3, pkg, digest, work, r, args.concurrency, times)
            print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in times.items()), flush=True)

        med = {k: statistics.median(v) for k, v in times.items()}
        mbps = {k: size / v / 1e6 for k, v in med.items()}
        ratios = {
            "push/upload_file throughput": med["boto3 upload_file"] / med["llmserve push"],
            "pull/download_file throughput": med["boto3 download_file"] / med["llmserve pull"],
        }
        print()
        for k in times:
            print(f"{k:22s} {med[k]:7.2f} s  {mbps[k]:8.1f} MB/s  (rounds: {', '.join(f'{x:.2f}' for x in times[k])})")
        for k, v in ratios.items():
            print(f"{k:32s} {v:5.2f}x  (target >= 1.0)")
        if args.json:
            args.json.write_text(
                json.dumps({"bytes": size, "rounds": times, "median_s": med, "MBps": mbps, "ratios": ratios}, indent=2)
            )
    finally:
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
