#!/usr/bin/env python
"""Overhead of `llmserve serve --openai` against vLLM's own OpenAI server, same model, same load.

Both servers are started by this script on the tiny model (examples/tiny-model) with the same engine
settings, then driven alternately with the same load: ROUNDS rounds of CONCURRENCY concurrent chat
requests, each with a fixed output length (max_tokens + ignore_eos). Reports per server: request
throughput, output tokens/s, p50/p99 latency, and llmserve/vLLM ratios (target: within 5%).

Usage:
    python benchmarks/serve_overhead/run.py [--concurrency 64] [--max-tokens 64] [--rounds 4] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]
MODEL = "tiny-chat"
ENGINE = {"max_model_len": 512, "dtype": "float32", "enforce_eager": True}
ENV = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "OMP_NUM_THREADS": "1",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "VLLM_NO_USAGE_STATS": "1",
    "VLLM_USE_V2_MODEL_RUNNER": "0",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_model(root: Path) -> Path:
    spec = importlib.util.spec_from_file_location("make_tiny_model", REPO / "examples/tiny-model/make_tiny_model.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    src = root / "src"
    mod.make_tiny_model(src / "model", seed=0)
    lines = [f"modelId: {MODEL}", "modelVersion: 1", "backend: vllm", "engine:"]
    lines += [f"  {k}: {json.dumps(v)}" for k, v in ENGINE.items()]
    (src / "llmserve.yaml").write_text("\n".join(lines) + "\n")
    return src


def start(cmd: list[str], env: dict, log: Path, port: int, timeout: float = 300) -> subprocess.Popen:
    proc = subprocess.Popen(cmd, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{cmd[:4]} exited with {proc.returncode}; see {log}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        time.sleep(0.25)
    proc.kill()
    raise SystemExit(f"{cmd[:4]} not ready after {timeout} s; see {log}")


async def one_round(url: str, concurrency: int, max_tokens: int, round_no: int) -> tuple[list[float], float, int]:
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:

        async def call(i: int) -> tuple[float, int]:
            body = {
                "model": MODEL,
                "messages": [{"role": "user", "content": f"request {round_no}-{i}: tell a story"}],
                "max_tokens": max_tokens,
                "ignore_eos": True,
                "temperature": 1.0,
                "seed": i,
            }
            t0 = time.perf_counter()
            r = await client.post("/v1/chat/completions", json=body)
            r.raise_for_status()
            return time.perf_counter() - t0, r.json()["usage"]["completion_tokens"]

        t0 = time.perf_counter()
        results = await asyncio.gather(*(call(i) for i in range(concurrency)))
        wall = time.perf_counter() - t0
    return [lat for lat, _ in results], wall, sum(n for _, n in results)


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, round(q * (len(values) - 1)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--json", type=Path)
    ap.add_argument(
        "--triton", action="store_true", help="also `llmserve serve --engine triton --openai` (needs .venv-triton)"
    )
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="serve-overhead-"))
    src = make_model(work)
    env = {**os.environ, **ENV}
    for var, sub in (
        ("LLMSERVE_CACHE", "llmserve"),
        ("VLLM_CACHE_ROOT", "vllm"),
        ("TORCHINDUCTOR_CACHE_DIR", "inductor"),
        ("HF_HOME", "hf"),
        ("VLLM_RPC_BASE_PATH", "rpc"),
    ):
        env[var] = str(work / sub)
        (work / sub).mkdir(parents=True, exist_ok=True)
    env.pop("LLMSERVE_API_KEY", None)
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)

    # llmserve as served by default (constraint processor loaded) and without the processor, so the
    # processor's per-step cost on unconstrained traffic is measured apart from frontend overhead
    ports = {"llmserve": free_port(), "llmserve-noc": free_port(), "vllm": free_port()}
    if args.triton:
        ports["llmserve-triton"] = free_port()
    so = json.dumps({"backend": "guidance", "disable_any_whitespace": True})
    cmds = {
        "llmserve": [
            sys.executable,
            "-m",
            "llmserve.cli.app",
            "serve",
            str(src),
            "--openai",
            "--port",
            str(ports["llmserve"]),
            "--grpc-port",
            "0",
        ],
        "llmserve-noc": [
            sys.executable,
            "-m",
            "llmserve.cli.app",
            "serve",
            str(src),
            "--openai",
            "--no-constraints",
            "--port",
            str(ports["llmserve-noc"]),
            "--grpc-port",
            "0",
        ],
        "vllm": [
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(src / "model"),
            "--served-model-name",
            MODEL,
            "--port",
            str(ports["vllm"]),
            "--host",
            "127.0.0.1",
            "--dtype",
            "float32",
            "--max-model-len",
            "512",
            "--enforce-eager",
            "--structured-outputs-config",
            so,
        ],
    }
    if args.triton:  # the same package on a Triton (llmserve's vLLM backend inside), OpenAI over Triton in front
        env.setdefault("LLMSERVE_TRITON_ENV", str(REPO / ".venv-triton"))
        from llmserve.packaging import build_package

        package = build_package(src, work / "dist").path  # Triton hosts packages (a model repository inside)
        cmds["llmserve-triton"] = [
            *cmds["llmserve"][:4],
            str(package),
            "--engine",
            "triton",
            "--openai",
            "--port",
            str(ports["llmserve-triton"]),
            "--grpc-port",
            "0",
            "--metrics-port",
            "0",
        ]
    procs = {}
    try:
        for name in cmds:
            t0 = time.perf_counter()
            procs[name] = start(cmds[name], env, work / f"{name}.log", ports[name])
            print(f"{name}: ready in {time.perf_counter() - t0:.1f} s (log {work / (name + '.log')})", flush=True)
        stats = {n: {"lat": [], "wall": 0.0, "tokens": 0, "requests": 0} for n in procs}
        for name in procs:  # warm-up round, not counted
            asyncio.run(one_round(f"http://127.0.0.1:{ports[name]}", args.concurrency, args.max_tokens, -1))
        for rnd in range(args.rounds):
            names = list(cmds)
            order = names[rnd % len(names) :] + names[: rnd % len(names)]  # each server in each position
            for name in order:
                lat, wall, toks = asyncio.run(
                    one_round(f"http://127.0.0.1:{ports[name]}", args.concurrency, args.max_tokens, rnd)
                )
                s = stats[name]
                s["lat"] += lat
                s["wall"] += wall
                s["tokens"] += toks
                s["requests"] += len(lat)
                print(
                    f"round {rnd} {name:12s} {len(lat) / wall:7.2f} req/s  p50 {pct(lat, 0.5):.3f} s  p99 {pct(lat, 0.99):.3f} s",
                    flush=True,
                )
    finally:
        for p in procs.values():
            p.send_signal(signal.SIGTERM)
        for p in procs.values():
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                p.kill()

    report = {"concurrency": args.concurrency, "max_tokens": args.max_tokens, "rounds": args.rounds, "servers": {}}
    for name, s in stats.items():
        report["servers"][name] = {
            "requests_per_s": s["requests"] / s["wall"],
            "output_tokens_per_s": s["tokens"] / s["wall"],
            "p50_s": statistics.median(s["lat"]),
            "p99_s": pct(s["lat"], 0.99),
            "requests": s["requests"],
        }

    def ratios(a, b):
        a, b = report["servers"][a], report["servers"][b]
        return {
            "throughput": a["requests_per_s"] / b["requests_per_s"],
            "p50_latency": a["p50_s"] / b["p50_s"],
            "p99_latency": a["p99_s"] / b["p99_s"],
        }

    report["ratios_llmserve_over_vllm"] = ratios("llmserve", "vllm")
    report["ratios_llmserve_no_constraints_over_vllm"] = ratios("llmserve-noc", "vllm")
    report["ratios_llmserve_over_llmserve_no_constraints"] = ratios("llmserve", "llmserve-noc")
    if args.triton:
        report["ratios_triton_over_llmserve"] = ratios("llmserve-triton", "llmserve")
        report["ratios_triton_over_vllm"] = ratios("llmserve-triton", "vllm")
    print(json.dumps(report, indent=2))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
