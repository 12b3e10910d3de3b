"""deploy_switch: time from `llmserve deploy` to 100% traffic on the new version (local target, tiny model),
and request success rate + p99 latency during the switch vs steady state, in the same run.

    .venv/bin/python benchmarks/deploy_switch/run.py --steady 20 --pause 5 --workers 2 --json out.json

It makes the tiny model, packages v1 and v2 (same interface), deploys v1 with the real CLI into a
temporary state folder, runs a closed-loop client (WORKERS threads, chat completions with max_tokens 8,
every third one streamed) against the gateway, measures a steady window, then deploys v2 red-black
and keeps measuring until the CLI exits (old version drained and stopped). Everything is torn down
at the end (`llmserve deploy down`).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]
MODEL = "tiny-chat"
MANIFEST = """modelId: tiny-chat
modelVersion: {version}
backend: vllm
engine:
  max_model_len: 512
  dtype: float32
  enforce_eager: true
"""


def make_packages(root: Path) -> dict[int, Path]:
    import shutil

    from llmserve.packaging import build_package

    spec = importlib.util.spec_from_file_location(
        "make_tiny_model", REPO / "examples" / "tiny-model" / "make_tiny_model.py"
    )
    maker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(maker)
    maker.make_tiny_model(root / "model", seed=0)
    out = {}
    for v in (1, 2):
        src = root / f"src-{v}"
        shutil.copytree(root / "model", src / "model")
        (src / "llmserve.yaml").write_text(MANIFEST.format(version=v))
        out[v] = build_package(src, root / "dist").path
    return out


class Client:
    def __init__(self, url: str, workers: int):
        self.url, self.workers = url, workers
        self.records: list[tuple[float, float, bool, str]] = []  # (end time, latency, ok, served version)
        self.stop = threading.Event()
        self.lock = threading.Lock()

    def run(self) -> None:
        threads = [threading.Thread(target=self._loop, args=(k,), daemon=True) for k in range(self.workers)]
        for t in threads:
            t.start()
        self.threads = threads

    def _loop(self, k: int) -> None:
        n = k
        with httpx.Client(base_url=self.url, timeout=60) as c:
            while not self.stop.is_set():
                body = {"model": MODEL, "messages": [{"role": "user", "content": f"hi {n}"}], "max_tokens": 8}
                t0 = time.perf_counter()
                ok, version = False, "?"
                try:
                    if n % 3 == 2:
                        body["stream"] = True
                        with c.stream("POST", "/v1/chat/completions", json=body) as r:
                            lines = [x for x in r.iter_lines() if x.startswith("data:")]
                            ok = r.status_code == 200 and lines[-1:] == ["data: [DONE]"]
                            version = r.headers.get("x-served-version", "?")
                    else:
                        r = c.post("/v1/chat/completions", json=body)
                        ok = r.status_code == 200 and bool(r.json().get("choices"))
                        version = r.headers.get("x-served-version", "?")
                except Exception:
                    ok = False
                with self.lock:
                    self.records.append((time.monotonic(), time.perf_counter() - t0, ok, version))
                n += self.workers

    def window(self, t0: float, t1: float) -> dict:
        rows = [r for r in self.records if t0 <= r[0] < t1]
        lat = sorted(r[1] for r in rows)
        ok = sum(r[2] for r in rows)

        def pct(p: float) -> float | None:
            return round(lat[min(len(lat) - 1, int(p * len(lat)))], 4) if lat else None

        versions: dict[str, int] = {}
        for r in rows:
            versions[r[3]] = versions.get(r[3], 0) + 1
        return {
            "requests": len(rows),
            "ok": ok,
            "success_rate": round(ok / len(rows), 5) if rows else None,
            "p50_s": pct(0.50),
            "p99_s": pct(0.99),
            "seconds": round(t1 - t0, 2),
            "served_versions": versions,
        }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steady", type=float, default=20.0, help="Seconds of steady-state load before the deploy.")
    ap.add_argument("--pause", type=float, default=5.0, help="Pause at each red-black step (the CLI default).")
    ap.add_argument("--steps", default="10,25,50,100")
    ap.add_argument("--workers", type=int, default=2, help="Concurrent client threads (closed loop).")
    ap.add_argument("--json", type=Path, help="Write the results here too.")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="deploy-switch-"))
    os.environ.setdefault("LLMSERVE_CACHE", str(work / "cache"))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    state = work / "state"
    cli = [sys.executable, "-m", "llmserve.cli.app"]
    packages = make_packages(work)
    results: dict = {"steps": args.steps, "pause_s": args.pause, "workers": args.workers}
    try:
        t = time.monotonic()
        p = subprocess.run(
            [*cli, "deploy", str(packages[1]), "--state-dir", str(state), "-o", "json"],
            capture_output=True,
            text=True,
            check=True,
        )
        results["first_deploy_s"] = round(time.monotonic() - t, 2)
        url = json.loads(p.stdout)["gateway"]["url"]
        client = Client(url, args.workers)
        client.run()
        time.sleep(3)  # warm-up, not measured
        steady0 = time.monotonic()
        time.sleep(args.steady)
        deploy0 = time.monotonic()
        proc = subprocess.Popen(
            [
                *cli,
                "deploy",
                str(packages[2]),
                "--state-dir",
                str(state),
                "--steps",
                args.steps,
                "--pause",
                str(args.pause),
                "-o",
                "json",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        marks: dict[str, float] = {}
        for line in proc.stderr:
            now = time.monotonic()
            if "healthy after" in line:
                marks["new_healthy_s"] = round(now - deploy0, 2)
            if "100% of traffic on v2" in line:
                marks["to_100_percent_s"] = round(now - deploy0, 2)
        out = proc.stdout.read()
        proc.wait()
        deploy1 = time.monotonic()
        time.sleep(2)
        client.stop.set()
        for th in client.threads:
            th.join(60)
        done = json.loads(out)
        results.update(marks)
        results["deploy_total_s"] = round(deploy1 - deploy0, 2)
        results["deploy_rc"] = proc.returncode
        results["final_versions"] = {
            str(i["version"]): i["weight"] for i in done["instances"] if i["status"] == "serving"
        }
        results["steady"] = client.window(steady0, deploy0)
        results["switch"] = client.window(deploy0, deploy1)
    finally:
        subprocess.run([*cli, "deploy", "down", MODEL, "--state-dir", str(state)], capture_output=True)
    print(json.dumps(results, indent=2))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0 if results.get("deploy_rc") == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
