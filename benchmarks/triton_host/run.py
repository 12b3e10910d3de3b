#!/usr/bin/env python
"""The Triton host against the embedded engine: time to ready, and KServe v2 gRPC generation throughput.

Three servers on the same tiny-model package, started one after the other by this script:
  embedded   `llmserve serve PKG` (the embedded vLLM engine, llmserve's KServe v2 gRPC frontend)
  triton     `llmserve serve PKG --engine triton` (executionMode embedded: llmserve's gRPC proxy in front of a
             Triton on loopback running llmserve's vLLM backend)
  standalone the same with executionMode standalone (clients talk to Triton's own gRPC endpoint)
Each is timed from process start to "ready", then driven with ROUNDS rounds of CONCURRENCY concurrent streamed
generations (ModelStreamInfer, max_tokens fixed with ignore_eos). Reports per server: start seconds, requests/s,
output tokens/s, and ratios against the embedded engine measured in the same run (targets in issue #12: Triton
start within 1.2x, throughput within 10%). The OpenAI leg over Triton is not measured: that frontend is not built.

Usage:
    LLMSERVE_TRITON_ENV=.venv-triton python benchmarks/triton_host/run.py [--concurrency 16] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))
from support.models import tiny_maker, write_vllm_source  # noqa: E402

from llmserve.packaging import build_package  # noqa: E402
from llmserve.serve.triton.server import free_ports  # noqa: E402

LLMSERVE = str(Path(sys.executable).parent / "llmserve")


def start(package: Path, log: Path, engine: str | None) -> tuple[subprocess.Popen, int, float]:
    http, grpc, metrics = free_ports("127.0.0.1", 3)
    argv = [LLMSERVE, "serve", str(package), "--port", str(http), "--grpc-port", str(grpc)]
    if engine:
        argv += ["--engine", engine, "--metrics-port", str(metrics)]
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    while "ready in" not in log.read_text(errors="replace"):
        if proc.poll() is not None:
            raise SystemExit(f"{argv} exited {proc.returncode}:\n{log.read_text()[-3000:]}")
        time.sleep(0.2)
    return proc, grpc, time.monotonic() - t0


def one_generation(port: int, max_tokens: int) -> int:
    params = {"max_tokens": max_tokens, "ignore_eos": True, "temperature": 0.0}
    inputs = []
    for name, datatype, value in (
        ("text_input", "BYTES", np.array([b"Tell me about parcels"], dtype=np.object_)),
        ("stream", "BOOL", np.array([True])),
        ("sampling_parameters", "BYTES", np.array([json.dumps(params).encode()], dtype=np.object_)),
    ):
        tensor = grpcclient.InferInput(name, [1], datatype)
        tensor.set_data_from_numpy(value)
        inputs.append(tensor)
    answers: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
    client.start_stream(lambda result, error: answers.put((result, error)))
    client.async_stream_infer("tiny-chat", inputs, enable_empty_final_response=True)
    pieces = 0
    while True:
        result, error = answers.get(timeout=300)
        if error is not None:
            raise RuntimeError(str(error))
        pieces += 1
        if result.get_response().parameters["triton_final_response"].bool_param:
            break
    client.stop_stream()
    client.close()
    return pieces


def drive(port: int, concurrency: int, rounds: int, max_tokens: int) -> dict[str, float]:
    one_generation(port, 4)  # warm up
    t0 = time.monotonic()
    with ThreadPoolExecutor(concurrency) as pool:
        for _ in range(rounds):
            list(pool.map(lambda _: one_generation(port, max_tokens), range(concurrency)))
    seconds = time.monotonic() - t0
    requests = concurrency * rounds
    return {"requests_per_s": requests / seconds, "output_tokens_per_s": requests * max_tokens / seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    os.environ.setdefault("LLMSERVE_TRITON_ENV", str(REPO / ".venv-triton"))
    work = Path(tempfile.mkdtemp(prefix="llmserve-bench-triton-"))
    try:
        tiny_maker().make_tiny_model(work / "model", seed=0)
        packages = {
            "embedded": build_package(write_vllm_source(work / "a", work / "model"), work / "d1").path,
            "standalone": build_package(
                write_vllm_source(work / "b", work / "model", extra="executionMode: standalone\n"), work / "d2"
            ).path,
        }
        legs = [("embedded", packages["embedded"], None), ("triton", packages["embedded"], "triton")]
        legs.append(("standalone", packages["standalone"], "triton"))
        results: dict[str, dict[str, float]] = {}
        for name, package, engine in legs:
            proc, port, ready_s = start(package, work / f"{name}.log", engine)
            try:
                results[name] = {"ready_s": ready_s, **drive(port, args.concurrency, args.rounds, args.max_tokens)}
            finally:
                proc.send_signal(signal.SIGTERM)
                proc.wait(120)
            print(name, {k: round(v, 2) for k, v in results[name].items()}, flush=True)
        base = results["embedded"]
        for name in ("triton", "standalone"):
            r = results[name]
            print(
                f"{name}: start {r['ready_s'] / base['ready_s']:.2f}x the embedded engine's; "
                f"throughput {r['output_tokens_per_s'] / base['output_tokens_per_s']:.2f}x"
            )
        if args.json:
            args.json.write_text(json.dumps(results, indent=2))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
