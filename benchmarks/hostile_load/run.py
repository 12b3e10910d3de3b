#!/usr/bin/env python
"""Normal requests' latency alone, then mixed with hostile requests, on a real `llmserve serve` (#11).

Bounded: it talks to 127.0.0.1 only, sends a fixed number of requests, and stops by itself (a time
cap on each phase, the server stopped at the end). See README.md next to this file.

    .venv/bin/python benchmarks/hostile_load/run.py [--normal 60] [--concurrency 2] [--hostile-workers 2]
        [--phase-cap-s 600] [--json out.json] [--constraints]

Targets: the normal requests' p50 and p99 with hostile traffic within 1.5x of alone, and no failed
normal request. Every hostile request must get its 4xx (a 500 or a connection error is a failure).
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import importlib.util
import itertools
import json
import multiprocessing
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[2]
MODEL = "tiny-chat"
KEY = "hostile-load-key"
MANIFEST = textwrap.dedent(f"""\
    modelId: {MODEL}
    modelVersion: 1
    backend: vllm
    engine:
      max_model_len: 512
      dtype: float32
      enforce_eager: true
    """)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_package(work: Path) -> Path:
    """The tiny model (examples/tiny-model) packaged as tests/serve does it."""
    from llmserve.packaging import build_package

    spec = importlib.util.spec_from_file_location("make_tiny_model", REPO / "examples/tiny-model/make_tiny_model.py")
    assert spec is not None and spec.loader is not None
    maker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(maker)
    src = work / "src"
    maker.make_tiny_model(src / "model", seed=0)
    (src / "llmserve.yaml").write_text(MANIFEST)
    return build_package(src, work / "dist").path


def start_server(package: Path, work: Path, ready_cap_s: float) -> tuple[subprocess.Popen, str, Path]:
    port, grpc_port = free_port(), free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "LLMSERVE_API_KEY": KEY}
    for var, sub in (
        ("LLMSERVE_CACHE", "llmserve"),
        ("VLLM_CACHE_ROOT", "vllm"),
        ("TORCHINDUCTOR_CACHE_DIR", "inductor"),
        ("HF_HOME", "hf"),
        ("VLLM_RPC_BASE_PATH", "rpc"),
    ):
        env[var] = str(work / "caches" / sub)
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    log = work / "server.log"
    cmd = [sys.executable, "-m", "llmserve.cli.app", "serve", str(package), "--openai"]
    cmd += ["--host", "127.0.0.1", "--port", str(port), "--grpc-port", str(grpc_port)]
    proc = subprocess.Popen(cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + ready_cap_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(base + "/health", timeout=2).status_code == 200:
                return proc, base, log
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    stop_server(proc)
    raise SystemExit(f"server not ready after {ready_cap_s} s")


def stop_server(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# ---- requests --------------------------------------------------------------------------------------


def normal_request(i: int) -> tuple[str, dict]:
    return "/v1/chat/completions", {
        "model": MODEL,
        "messages": [{"role": "user", "content": f"tell me about item {i}"}],
        "max_tokens": 8,
        "temperature": 0,
    }


def hostile_requests(with_constraints: bool) -> list[tuple[str, str, dict]]:
    """(name, path, httpx request kwargs): each must be refused with a 4xx. JSON bodies are encoded
    once here, so the hostile client spends its CPU sending, not serializing."""
    json_h = {"content-type": "application/json"}
    bomb = gzip.compress(b'{"inputs": [{"name": "text_input", "data": ["' + b" " * (64 * 1024 * 1024))
    infer = f"/v2/models/{MODEL}/infer"
    msg = [{"role": "user", "content": "hi"}]

    async def chunked():  # an async generator: httpx's AsyncClient sends it chunked, without a length
        for _ in range(10):
            yield b"x" * (1024 * 1024)

    out = [
        ("gzip_bomb", infer, {"content": bomb, "headers": {**json_h, "content-encoding": "gzip"}}),
        ("deep_json_openai", "/v1/chat/completions", {"content": "[" * 200_000 + "]" * 200_000, "headers": json_h}),
        ("deep_json_kserve", f"/v2/models/{MODEL}/generate", {"content": "{" + '"a":{' * 100_000, "headers": json_h}),
        (
            "huge_prompt_openai",
            "/v1/completions",
            {"json": {"model": MODEL, "prompt": "x" * 1_000_000, "max_tokens": 1}},
        ),
        ("huge_prompt_kserve", f"/v2/models/{MODEL}/generate", {"json": {"text_input": "x" * 1_000_000}}),
        (
            "many_stop_strings",
            "/v1/chat/completions",
            {"json": {"model": MODEL, "messages": msg, "stop": [f"s{i}" for i in range(100_000)]}},
        ),
        ("many_messages", "/v1/chat/completions", {"json": {"model": MODEL, "messages": msg * 100_000}}),
        ("chunked_oversize", "/v1/completions", {"content": chunked, "headers": json_h}),
        (
            "many_bytes_elements",
            infer,
            {
                "content": json.dumps(
                    {"inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1], "data": ["a"] * 500_000}]}
                ).encode(),
                "headers": json_h,
            },
        ),
    ]
    if with_constraints:
        counter = itertools.count()

        def schema_body() -> bytes:
            # a new schema each time, as an attacker would send: a refused constraint is remembered,
            # so resending one would measure the memo rather than the compile's cost to others
            n = next(counter)
            schema = {
                "type": "object",
                "properties": {f"p{i}_{n}": {"type": "string", "pattern": "a{1,99}b{1,99}"} for i in range(300)},
            }
            body = {"model": MODEL, "messages": msg, "vllm_xargs": {"constraint_json_schema": schema}}
            return json.dumps(body).encode()

        out.append(("constraint_schema", "/v1/chat/completions", {"content": schema_body, "headers": json_h}))
    return [
        (name, path, {"content": json.dumps(kw["json"]).encode(), "headers": json_h} if "json" in kw else kw)
        for name, path, kw in out
    ]


async def run_normal(client: httpx.AsyncClient, n: int, concurrency: int, cap_s: float) -> tuple[list[float], int]:
    latencies: list[float] = []
    failed = 0
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(n):
        queue.put_nowait(i)
    deadline = time.monotonic() + cap_s

    async def worker() -> None:
        nonlocal failed
        while not queue.empty() and time.monotonic() < deadline:
            i = queue.get_nowait()
            path, body = normal_request(i)
            t0 = time.perf_counter()
            try:
                r = await client.post(path, json=body)
                ok = r.status_code == 200 and r.json()["choices"][0]["message"]["content"] is not None
            except (httpx.HTTPError, ValueError, KeyError):
                ok = False
            if ok:
                latencies.append(time.perf_counter() - t0)
            else:
                failed += 1

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    failed += queue.qsize()  # not sent within the cap: counted as failed
    return latencies, failed


def hostile_process(
    base: str, workers: int, constraints: bool, stop: Any, results: Any, only: list[str] | None = None
) -> None:
    """The hostile clients, in their own process: their work (multi-megabyte bodies) does not run on
    the normal clients' event loop, so what the normal requests measure is the server."""

    async def main() -> Counter:
        headers = {"Authorization": f"Bearer {KEY}"}
        async with httpx.AsyncClient(base_url=base, headers=headers, timeout=120) as client:
            done = asyncio.Event()

            async def watch() -> None:
                while not stop.is_set():
                    await asyncio.sleep(0.05)
                done.set()

            watcher = asyncio.create_task(watch())
            outcomes = await run_hostile(client, done, workers, constraints, only)
            await watcher
            return outcomes

    results.put(dict(asyncio.run(main())))


async def run_hostile(
    client: httpx.AsyncClient, stop: asyncio.Event, workers: int, constraints: bool, only: list[str] | None = None
) -> Counter:
    outcomes: Counter = Counter()
    cases = [c for c in hostile_requests(constraints) if only is None or c[0] in only]

    async def worker(offset: int) -> None:
        i = offset
        while not stop.is_set():
            name, path, kwargs = cases[i % len(cases)]
            if callable(kwargs.get("content")):  # a fresh body (or body generator) each time
                kwargs = {**kwargs, "content": kwargs["content"]()}
            try:
                r = await client.post(path, **kwargs)
                outcomes[(name, r.status_code)] += 1
            except Exception as exc:  # a refused connection or a reset: counted, not fatal to the run
                outcomes[(name, type(exc).__name__)] += 1
            i += 1

    await asyncio.gather(*(worker(k) for k in range(workers)))
    return outcomes


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def mixed_phase(
    client: httpx.AsyncClient, base: str, args: argparse.Namespace, only: list[str] | None
) -> tuple[list[float], int, Counter, float]:
    """Normal requests while the hostile clients (all cases, or `only` these) send back to back; also
    the hostile requests per second (the clients are closed-loop: a slower refusal means fewer)."""
    ctx = multiprocessing.get_context("spawn")
    stop, results = ctx.Event(), ctx.Queue()
    proc = ctx.Process(target=hostile_process, args=(base, args.hostile_workers, args.constraints, stop, results, only))
    proc.start()
    started = time.monotonic()
    await asyncio.sleep(3)  # the hostile clients are sending before the normal ones start
    mixed, failed = await run_normal(client, args.normal, args.concurrency, args.phase_cap_s)
    stop.set()
    outcomes = Counter(await asyncio.to_thread(results.get, True, 300))
    rate = sum(outcomes.values()) / (time.monotonic() - started)
    proc.join(60)
    return mixed, failed, outcomes, rate


async def measure(base: str, args: argparse.Namespace) -> dict:
    headers = {"Authorization": f"Bearer {KEY}"}
    limits = httpx.Limits(max_connections=64)
    async with httpx.AsyncClient(base_url=base, headers=headers, timeout=120, limits=limits) as client:
        # warm-up (first requests compile the chat template, fill caches)
        await run_normal(client, 4, 1, args.phase_cap_s)
        alone, failed_alone = await run_normal(client, args.normal, args.concurrency, args.phase_cap_s)
        mixed, failed_mixed, outcomes, hostile_rps = await mixed_phase(client, base, args, None)
        per_case = {}
        if args.per_case:  # what each hostile request costs the normal ones: one case at a time
            for name, _, _ in hostile_requests(args.constraints):
                lat, failed, _, rps = await mixed_phase(client, base, args, [name])
                per_case[name] = {
                    "ratio_p50": round(pct(lat, 0.5) / pct(alone, 0.5), 2),
                    "ratio_p99": round(pct(lat, 0.99) / pct(alone, 0.99), 2),
                    "failed_normal": failed,
                    "hostile_rps": round(rps, 1),
                }
    p50a, p99a, p50m, p99m = pct(alone, 0.5), pct(alone, 0.99), pct(mixed, 0.5), pct(mixed, 0.99)
    bad = {f"{n}:{s}": c for (n, s), c in outcomes.items() if not (isinstance(s, int) and 400 <= s < 500)}
    return {
        "normal_requests": args.normal,
        "concurrency": args.concurrency,
        "hostile_workers": args.hostile_workers,
        "alone": {"p50_s": p50a, "p99_s": p99a, "mean_s": statistics.fmean(alone) if alone else None},
        "mixed": {"p50_s": p50m, "p99_s": p99m, "mean_s": statistics.fmean(mixed) if mixed else None},
        "ratio_p50": p50m / p50a,
        "ratio_p99": p99m / p99a,
        "failed_normal": {"alone": failed_alone, "mixed": failed_mixed},
        "hostile_rps": round(hostile_rps, 1),
        "hostile_outcomes": {f"{n}:{s}": c for (n, s), c in sorted(outcomes.items(), key=str)},
        "hostile_not_4xx": bad,
        **({"per_case": per_case} if per_case else {}),
        "targets_met": p50m / p50a <= 1.5 and p99m / p99a <= 1.5 and failed_mixed == 0 and not bad,
    }


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of one process so far (its own threads, not its children)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def cpu_per_case(base: str, pid: int, args: argparse.Namespace) -> dict:
    """What each kind of request costs the server's API process in CPU, one request at a time: a
    figure a noisy machine disturbs far less than latency ratios (clock ticks are 10 ms: use >= 10)."""
    headers = {"Authorization": f"Bearer {KEY}"}
    out = {}
    normal = ("normal", "/v1/chat/completions", {"json": normal_request(0)[1]})
    async with httpx.AsyncClient(base_url=base, headers=headers, timeout=120) as client:
        for name, path, kwargs in [normal, *hostile_requests(args.constraints)]:
            statuses: Counter = Counter()
            before = process_cpu_s(pid)
            for _ in range(args.cpu_per_case):
                sent = {**kwargs, "content": kwargs["content"]()} if callable(kwargs.get("content")) else kwargs
                statuses[(await client.post(path, **sent)).status_code] += 1
            cost = (process_cpu_s(pid) - before) / args.cpu_per_case
            out[name] = {"api_cpu_ms": round(cost * 1000, 1), "statuses": dict(statuses)}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--normal", type=int, default=60, help="normal requests per phase")
    ap.add_argument("--concurrency", type=int, default=2, help="concurrent normal clients")
    ap.add_argument("--hostile-workers", type=int, default=2, help="concurrent hostile clients (mixed phase)")
    ap.add_argument("--phase-cap-s", type=float, default=600, help="time cap of each phase")
    ap.add_argument("--ready-cap-s", type=float, default=900, help="time cap for the server to get ready")
    ap.add_argument("--constraints", action="store_true", help="also send hostile constraint schemas")
    ap.add_argument("--per-case", action="store_true", help="also one mixed phase per hostile case (diagnosis)")
    ap.add_argument(
        "--cpu-per-case",
        type=int,
        default=0,
        metavar="N",
        help="also N requests of each case, one at a time: API CPU each",
    )
    ap.add_argument("--json", type=Path, help="write the result here too")
    args = ap.parse_args()
    # SIGTERM ends the run like Ctrl-C: the finally below still stops the server and cleans up
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    work = Path(tempfile.mkdtemp(prefix="llmserve-hostile-"))
    proc = None
    try:
        package = make_package(work)
        proc, base, log = start_server(package, work, args.ready_cap_s)
        result = asyncio.run(measure(base, args))
        if args.cpu_per_case:
            result["cpu_per_case"] = asyncio.run(cpu_per_case(base, proc.pid, args))
        result["server_alive_after"] = proc.poll() is None
        result["server_log_tracebacks"] = log.read_text(errors="replace").count("Traceback")
    finally:
        if proc is not None:
            stop_server(proc)
        shutil.rmtree(work, ignore_errors=True)
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0 if result["targets_met"] else 1


if __name__ == "__main__":
    sys.exit(main())
