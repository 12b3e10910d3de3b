#!/usr/bin/env python
"""A cold `llmserve serve s3://...` that pulls from the store, against one that starts from the store cache,
time to ready, side by side in one run.

The package is the tiny model (examples/tiny-model) plus a padding file of --pad bytes (default 1 GiB,
random, so nothing compresses it) standing in for large weights: the engine loads only the tiny model,
so the difference is what the cache saves, the transfer. The S3 server is moto's server mode on
127.0.0.1 (s3_server.py, as run.py). Each round, alternating which goes first:

    from the store   `llmserve serve s3://B/P/MODEL:1 --cache EMPTY`: resolve, pull 1 GiB (verified),
                     unpack, start the engine
    from the cache   `llmserve serve s3://B/P/MODEL:1 --cache FILLED`: the same command on a cache that
                     holds the package (pulled earlier): resolve, lease, start

Each server is a fresh process (imports, engine start) with a fresh package unpack cache
($LLMSERVE_CACHE) unless --warm-unpack (the unpacked package is on the shared file system too, as it
would be with the cache on FSx shared by the nodes). Time to ready: process start -> GET /health 200.

Usage:
    python benchmarks/store/cold_start.py [--pad 1GiB] [--rounds 3] [--warm-unpack] [--json out.json]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx

from llmserve.packaging import build_package, read_index
from llmserve.store import pull, push
from llmserve.store.reference import parse_size

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).parent))
from run import _free_port, _start_moto  # noqa: E402  (the same S3 server as the push/pull benchmark)

MODEL = "cold-start"


def _make_package(root: Path, pad: int) -> Path:
    spec = importlib.util.spec_from_file_location("make_tiny_model", REPO / "examples/tiny-model/make_tiny_model.py")
    assert spec is not None and spec.loader is not None
    maker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(maker)
    src = root / "src"
    maker.make_tiny_model(src / "model", seed=0)
    rng = random.Random(0)
    with open(src / "model" / "padding.dat", "wb") as fh:  # not a weights file: the engine never reads it
        for off in range(0, pad, 64 << 20):
            fh.write(rng.randbytes(min(64 << 20, pad - off)))
    (src / "llmserve.yaml").write_text(
        f"modelId: {MODEL}\nmodelVersion: 1\nbackend: vllm\n"
        "engine:\n  max_model_len: 512\n  dtype: float32\n  enforce_eager: true\n"
    )
    return build_package(src, root / "dist").path


_STEP = re.compile(r"startup: (\S+)\s+done in ([0-9.]+) s")
_STORE = re.compile(r"startup: store\s+\S+ -> .* in ([0-9.]+) s")


def _steps(log: Path) -> dict[str, float]:
    """The server's own startup steps from its log: store (pull or lease), package (open/unpack), engine..."""
    text = log.read_text(errors="replace")
    out = {m[1]: float(m[2]) for m in _STEP.finditer(text)}
    if m := _STORE.search(text):
        out["store"] = float(m[1])
    return out


def _serve_to_ready(ref: str, cache: Path, unpack_cache: Path, log: Path, timeout: float = 900) -> float:
    port = _free_port()
    env = {**os.environ, "LLMSERVE_CACHE": str(unpack_cache)}
    argv = [str(Path(sys.executable).parent / "llmserve"), "serve", ref, "--openai", "--port", str(port),
            "--grpc-port", "0", "--cache", str(cache)]  # fmt: skip
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env)
    try:
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"server exited ({proc.returncode}):\n{log.read_text()[-3000:]}")
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    return time.perf_counter() - t0
            except httpx.HTTPError:
                pass
            if time.perf_counter() - t0 > timeout:
                raise SystemExit(f"not ready after {timeout} s:\n{log.read_text()[-3000:]}")
            time.sleep(0.05)
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pad", default="1GiB", help="padding added to the tiny model (default 1GiB)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warm-unpack", action="store_true", help="keep the unpacked package between cache starts")
    ap.add_argument("--json", type=Path, help="write the results here too")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="llmserve-cold-start-"))
    proc, endpoint = _start_moto(work / "moto.log")
    os.environ.update(
        AWS_ENDPOINT_URL=endpoint,
        AWS_ACCESS_KEY_ID="bench",
        AWS_SECRET_ACCESS_KEY="bench",
        AWS_DEFAULT_REGION="us-east-1",
    )
    try:
        t = time.perf_counter()
        pkg = _make_package(work, parse_size(args.pad))
        size = pkg.stat().st_size
        digest = read_index(pkg, verify=False).digest
        print(f"package: {size:,} bytes, built in {time.perf_counter() - t:.1f} s; server {endpoint}", flush=True)
        import boto3

        bucket = f"bench-{uuid.uuid4().hex[:10]}"
        boto3.client("s3").create_bucket(Bucket=bucket)
        push(pkg, f"s3://{bucket}/store")
        ref = f"s3://{bucket}/store/{MODEL}:1"
        filled = work / "filled-cache"
        assert pull(ref, filled).digest == digest
        warm_unpack = work / "unpack-warm"
        if args.warm_unpack:
            _serve_to_ready(ref, filled, warm_unpack, work / "warmup.log")
        times: dict[str, list[float]] = {"from the store": [], "from the cache": []}
        steps: dict[str, list[dict[str, float]]] = {"from the store": [], "from the cache": []}
        for r in range(args.rounds):
            order = ["from the store", "from the cache"] if r % 2 == 0 else ["from the cache", "from the store"]
            for side in order:
                unpack = (
                    warm_unpack if (args.warm_unpack and side == "from the cache") else work / f"unpack-{r}-{side[5:]}"
                )
                cache = filled if side == "from the cache" else work / f"empty-cache-{r}"
                log = work / f"serve-{r}-{side[5:]}.log"
                times[side].append(_serve_to_ready(ref, cache, unpack, log))
                steps[side].append(_steps(log))
                if side == "from the store":
                    shutil.rmtree(cache)
                if unpack != warm_unpack:
                    shutil.rmtree(unpack, ignore_errors=True)
            print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in times.items()), flush=True)
            for k, v in steps.items():
                print(f"  {k}: steps " + ", ".join(f"{n} {t:.2f} s" for n, t in v[-1].items()), flush=True)
        med = {k: statistics.median(v) for k, v in times.items()}
        ratio = med["from the store"] / med["from the cache"]
        print()
        for k, v in times.items():
            print(f"{k:16s} {med[k]:7.2f} s to ready  (rounds: {', '.join(f'{x:.2f}' for x in v)})")
        print(f"cache start faster by {ratio:.2f}x  (target >= 5)")
        step_med = {
            side: {n: statistics.median(x.get(n, 0.0) for x in v) for n in sorted({n for x in v for n in x})}
            for side, v in steps.items()
        }
        for side, med_steps in step_med.items():
            print(f"{side:16s} step medians: " + ", ".join(f"{n} {t:.2f} s" for n, t in med_steps.items()))
        acquire = {side: m.get("store", 0.0) + m.get("package", 0.0) for side, m in step_med.items()}
        print(
            f"getting the package (store + package steps): {acquire['from the store']:.2f} s vs "
            f"{acquire['from the cache']:.2f} s"
        )
        if args.json:
            args.json.write_text(
                json.dumps(
                    {
                        "bytes": size,
                        "warm_unpack": args.warm_unpack,
                        "rounds": times,
                        "median_s": med,
                        "ratio": ratio,
                        "steps": steps,
                        "step_medians": step_med,
                    },
                    indent=2,
                )
            )
    finally:
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
