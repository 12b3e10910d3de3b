"""deploy_switch: time from `llmserve deploy` to 100% traffic on the new version (local target, tiny model),
and request success rate + p99 latency during the switch vs steady state, in the same run; or, with
`--scenario kill`, failed requests, p99 and time to full recovery after a `kill -9` of the live server
and of the gateway, against the engine's start time measured in the same run.

    .venv/bin/python benchmarks/deploy_switch/run.py --steady 20 --pause 5 --workers 2 --json out.json
    .venv/bin/python benchmarks/deploy_switch/run.py --scenario kill --json kill.json

It makes the tiny model, packages v1 and v2 (same interface), deploys v1 with the real CLI into a
temporary state folder, runs a closed-loop client (WORKERS threads, chat completions with max_tokens 8,
every third one streamed, `Authorization: Bearer KEY` on each) against the gateway, and measures a
steady window. switch (default): deploys v2 red-black and keeps measuring until the CLI exits (old
version drained and stopped). kill: `kill -9` of the live server (pid from `llmserve status`), measured
until `status` says it is healthy again (exit 0, restarts 1) plus --tail seconds; a second steady
window; then `kill -9` of the gateway (the watchdog's child), measured the same way. Everything is torn
down at the end (`llmserve deploy down`), and no process started by the run (found by a marker in its
environment) may be left.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
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
MARKER = "LLMSERVE_BENCH_DEPLOY_SWITCH"  # in the environment of every process the run starts


def make_packages(root: Path, versions: tuple[int, ...] = (1, 2)) -> dict[int, Path]:
    import shutil

    from llmserve.packaging import build_package

    spec = importlib.util.spec_from_file_location(
        "make_tiny_model", REPO / "examples" / "tiny-model" / "make_tiny_model.py"
    )
    maker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(maker)
    maker.make_tiny_model(root / "model", seed=0)
    out = {}
    for v in versions:
        src = root / f"src-{v}"
        shutil.copytree(root / "model", src / "model")
        (src / "llmserve.yaml").write_text(MANIFEST.format(version=v))
        out[v] = build_package(src, root / "dist").path
    return out


class Client:
    def __init__(self, url: str, workers: int, timeout: float = 60.0, api_key: str | None = None):
        self.url, self.workers, self.timeout = url, workers, timeout
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        # (end time, latency, ok, served version, start time, error or "")
        self.records: list[tuple[float, float, bool, str, float, str]] = []
        self.stop = threading.Event()
        self.lock = threading.Lock()

    def run(self) -> None:
        threads = [threading.Thread(target=self._loop, args=(k,), daemon=True) for k in range(self.workers)]
        for t in threads:
            t.start()
        self.threads = threads

    def _loop(self, k: int) -> None:
        n = k
        with httpx.Client(base_url=self.url, timeout=self.timeout, headers=self.headers) as c:
            while not self.stop.is_set():
                body = {"model": MODEL, "messages": [{"role": "user", "content": f"hi {n}"}], "max_tokens": 8}
                start = time.monotonic()
                t0 = time.perf_counter()
                ok, version, error = False, "?", ""
                try:
                    if n % 3 == 2:
                        body["stream"] = True
                        with c.stream("POST", "/v1/chat/completions", json=body) as r:
                            lines = [x for x in r.iter_lines() if x.startswith("data:")]
                            ok = r.status_code == 200 and lines[-1:] == ["data: [DONE]"]
                            version = r.headers.get("x-served-version", "?")
                            if not ok:
                                error = f"stream HTTP {r.status_code}, last event {lines[-1:]}"[:200]
                    else:
                        r = c.post("/v1/chat/completions", json=body)
                        ok = r.status_code == 200 and bool(r.json().get("choices"))
                        version = r.headers.get("x-served-version", "?")
                        if not ok:
                            error = f"HTTP {r.status_code}: {r.text[:150]}"
                except Exception as exc:
                    ok, error = False, f"{type(exc).__name__}: {exc}"[:200]
                with self.lock:
                    self.records.append((time.monotonic(), time.perf_counter() - t0, ok, version, start, error))
                n += self.workers

    def join(self) -> None:
        self.stop.set()
        for th in self.threads:
            th.join(self.timeout + 30)

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


# -- processes (read from /proc; the benchmark signals only pids it found for its own deployment) ----------------
def _start_time(pid: int) -> str | None:
    try:
        data = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    rest = data[data.rfind(")") + 2 :].split()
    return None if rest[0] in ("Z", "X") else rest[19]


def _session_of(pid: int) -> int | None:
    try:
        data = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(data[data.rfind(")") + 2 :].split()[3])


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def _tree(pid: int) -> dict[int, str]:
    """The live members of pid's session (a server and what it spawned: vLLM's engine core), pid -> start time."""
    session = _session_of(pid)
    found = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and _session_of(int(entry.name)) == session and session not in (None, 0, 1):
            start = _start_time(int(entry.name))
            if start:
                found[int(entry.name)] = start
    return found


def _still_alive(tree: dict[int, str]) -> list[str]:
    return [f"{p} {_cmdline(p)[:80]}" for p, start in tree.items() if _start_time(p) == start]


def _marked(value: str) -> list[int]:
    """Processes (other than this one) whose environment carries this run's marker."""
    needle = f"{MARKER}={value}\0".encode()
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in Path(f"/proc/{entry.name}/environ").read_bytes() and _start_time(int(entry.name)):
                found.append(int(entry.name))
        except OSError:
            pass
    return found


def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


# -- the CLI ---------------------------------------------------------------------------------------------------------
def _status(cli: list[str], state: Path) -> tuple[int, dict | None]:
    """`llmserve status NAME --no-metrics -o json` (exits 7 while the deployment is degraded)."""
    p = subprocess.run(
        [*cli, "status", MODEL, "--no-metrics", "-o", "json", "--state-dir", str(state)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    try:
        return p.returncode, json.loads(p.stdout)
    except json.JSONDecodeError:
        return p.returncode, None


def _direct_code(url: str, headers: dict | None = None) -> int | str:
    try:
        return httpx.get(url + "/v1/models", headers=headers or {}, timeout=10).status_code
    except httpx.HTTPError as exc:
        return type(exc).__name__


def run_switch(args, cli: list[str], work: Path, state: Path, client_box: list, results: dict) -> bool:
    packages = make_packages(work)
    results.update({"steps": args.steps, "pause_s": args.pause})
    t = time.monotonic()
    p = subprocess.run(
        [*cli, "deploy", str(packages[1]), "--state-dir", str(state), "-o", "json"],
        capture_output=True,
        text=True,
        check=True,
    )
    results["first_deploy_s"] = round(time.monotonic() - t, 2)
    url = json.loads(p.stdout)["gateway"]["url"]
    client = Client(url, args.workers, timeout=60, api_key=args.api_key)
    client_box.append(client)
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
    client.join()
    done = json.loads(out)
    results.update(marks)
    results["deploy_total_s"] = round(deploy1 - deploy0, 2)
    results["deploy_rc"] = proc.returncode
    results["final_versions"] = {str(i["version"]): i["weight"] for i in done["instances"] if i["status"] == "serving"}
    results["steady"] = client.window(steady0, deploy0)
    results["switch"] = client.window(deploy0, deploy1)
    return proc.returncode == 0


def _kill_and_watch(cli, state, pid: int, healthy, limit: float, tail: float) -> dict:
    """kill -9 pid, poll `status` until healthy(rc, data), keep the load on for tail more seconds."""
    kill_wall, t_kill = time.time(), time.monotonic()
    os.kill(pid, signal.SIGKILL)
    rcs: Counter = Counter()
    polls: list[float] = []
    t_healthy = None
    data = None
    while time.monotonic() - t_kill < limit:
        t0 = time.monotonic()
        rc, data = _status(cli, state)
        polls.append(time.monotonic() - t0)
        rcs[rc] += 1
        if data is not None and healthy(rc, data):
            t_healthy = time.monotonic()
            break
        time.sleep(0.5)
    time.sleep(tail)
    t_end = time.monotonic()
    time.sleep(0.05)
    return {
        "kill_wall": kill_wall,
        "t_kill": t_kill,
        "t_healthy": t_healthy,
        "t_end": t_end,
        "status_exit_codes": {str(k): v for k, v in sorted(rcs.items())},
        "status_poll_s": round(sorted(polls)[len(polls) // 2], 2) if polls else None,
        "last_status": data,
    }


def _kill_report(client: Client, w: dict, steady: dict, engine_start_s: float) -> dict:
    t_kill, t_healthy, t_end = w["t_kill"], w["t_healthy"], w["t_end"]
    with client.lock:
        rows = list(client.records)
    inflight = [r for r in rows if r[4] < t_kill <= r[0]]
    failed = [r for r in rows if t_kill <= r[0] < t_end and not r[2]]
    # Requests sent after the kill can only be served by the restarted process (a response the killed
    # process had already sent can end just after the kill: it does not count).
    first_ok = min((r[0] for r in rows if r[2] and r[4] >= t_kill), default=None)
    recovery = client.window(t_kill, t_end)
    out = {
        "client_inflight_at_kill": len(inflight),
        "failed_in_kill_window": len(failed),
        "failed_inflight_at_kill": sum(1 for r in failed if r[4] < t_kill),
        "failed_sent_after_kill": sum(1 for r in failed if r[4] >= t_kill),
        "failure_reasons": dict(Counter(re.sub(r"\d+\.\d+", "N", r[5])[:120] for r in failed)),
        "steady": steady,
        "recovery": recovery,
        "max_latency_in_recovery_s": round(max((r[1] for r in rows if t_kill <= r[0] < t_end), default=0), 3),
        "kill_to_first_ok_s": round(first_ok - t_kill, 2) if first_ok else None,
        "kill_to_status_healthy_s": round(t_healthy - t_kill, 2) if t_healthy else None,
        "status_poll_s": w["status_poll_s"],
        "status_exit_codes": w["status_exit_codes"],
    }
    if first_ok:
        out["first_ok_over_engine_start"] = round((first_ok - t_kill) / engine_start_s, 2)
    if t_healthy:
        out["status_healthy_over_engine_start"] = round((t_healthy - t_kill) / engine_start_s, 2)
    return out


def run_kill(args, cli: list[str], work: Path, state: Path, client_box: list, results: dict) -> bool:
    packages = make_packages(work, versions=(1,))
    t = time.monotonic()
    p = subprocess.run(
        [*cli, "deploy", str(packages[1]), "--pause", "0", "--state-dir", str(state), "-o", "json"],
        capture_output=True,
        text=True,
    )
    results["first_deploy_s"] = round(time.monotonic() - t, 2)
    if p.returncode != 0:
        raise RuntimeError(f"deploy exited {p.returncode}: {p.stderr[-2000:]}")
    m = re.search(r"healthy after ([\d.]+) s", p.stderr)
    engine_start_s = float(m.group(1)) if m else results["first_deploy_s"]
    results["engine_start_s"] = engine_start_s
    results["engine_start_from"] = (
        "the deploy CLI's 'v1 healthy after X s' (server launch -> /health 200)"
        if m
        else "deploy wall time (the CLI printed no 'healthy after')"
    )
    url = json.loads(p.stdout)["gateway"]["url"]
    rc, data = _status(cli, state)
    if rc != 0 or not data:
        raise RuntimeError(f"status after deploy exited {rc}: {data}")
    server = next(i for i in data["instances"] if i["status"] == "serving")
    watchdog = data["gateway"]["pid"]
    gateways = _children(watchdog)
    server_tree = _tree(server["pid"])
    results["processes"] = {
        "server_pid": server["pid"],
        "server_tree": {str(k): _cmdline(k)[:80] for k in server_tree},
        "watchdog_pid": watchdog,
        "gateway_pid": gateways[0] if gateways else None,
    }
    key = {"Authorization": f"Bearer {args.api_key}"}
    auth = {
        "gateway_without_key": _direct_code(url),
        "gateway_with_key": _direct_code(url, key),
        "server_direct_without_key_before": _direct_code(server["url"]),
    }
    results["auth"] = auth

    client = Client(url, args.workers, timeout=args.client_timeout, api_key=args.api_key)
    client_box.append(client)
    client.run()
    time.sleep(3)  # warm-up, not measured
    steady0 = time.monotonic()
    time.sleep(args.steady)
    steady = client.window(steady0, time.monotonic())

    # 1. kill -9 of the live server
    def server_back(rc: int, d: dict) -> bool:
        inst = next((i for i in d["instances"] if i["instance"] == server["instance"]), None)
        return rc == 0 and inst is not None and inst["restarts"] == 1 and inst["health"] == 200 and inst["alive"]

    w = _kill_and_watch(cli, state, server["pid"], server_back, args.limit, args.tail)
    rep = _kill_report(client, w, steady, engine_start_s)
    results.setdefault("_marks", {}).update(server_kill=w["t_kill"], server_status_healthy=w["t_healthy"] or 0.0)
    after = next((i for i in (w["last_status"] or {}).get("instances", []) if i["instance"] == server["instance"]), {})
    rep["killed_pid"] = server["pid"]
    rep["new_pid"] = after.get("pid")
    rep["restarts"] = after.get("restarts")
    rep["killed_tree_left"] = _still_alive(server_tree)
    hist = {}
    for e in (w["last_status"] or {}).get("history", []):
        dt = round(e["ts"] - w["kill_wall"], 2) if isinstance(e.get("ts"), (int, float)) else e.get("ts")
        msg = e["message"]
        if "is gone" in msg and "marked_down" not in hist:
            hist["marked_down"] = dt
        elif "started again" in msg:
            hist["restart_launched"] = dt
        elif "serving again" in msg:
            hist["serving_again"] = dt
            rep["supervisor_says"] = msg
    rep["history_s_after_kill"] = hist
    if "restart_launched" in hist and "serving_again" in hist:
        rep["restarted_engine_start_s"] = round(hist["serving_again"] - hist["restart_launched"], 2)
    rep["hold_timeout_s"] = ((w["last_status"] or {}).get("config") or {}).get(
        "hold_timeout_s"
    ) or "default (the health timeout)"
    if after.get("url"):
        auth["server_direct_without_key_after_restart"] = _direct_code(after["url"])
    results["server_kill"] = rep

    # 2. a steady window on the restarted server, then kill -9 of the gateway (the watchdog's child)
    steady0 = time.monotonic()
    time.sleep(args.steady)
    steady2 = client.window(steady0, time.monotonic())
    gateway = _children(watchdog)
    if not gateway:
        raise RuntimeError(f"the watchdog {watchdog} has no gateway child")

    def gateway_back(rc: int, d: dict) -> bool:
        new = _children(watchdog)
        return rc == 0 and d["gateway"]["alive"] and bool(new) and new[0] != gateway[0]

    w = _kill_and_watch(cli, state, gateway[0], gateway_back, args.limit, args.tail)
    rep = _kill_report(client, w, steady2, engine_start_s)
    results.setdefault("_marks", {}).update(gateway_kill=w["t_kill"], gateway_status_healthy=w["t_healthy"] or 0.0)
    rep["killed_pid"] = gateway[0]
    rep["new_pid"] = (_children(watchdog) or [None])[0]
    results["gateway_kill"] = rep
    client.join()
    results["client_total"] = client.window(client.records[0][4], time.monotonic() + 1)
    return bool(results["server_kill"]["kill_to_status_healthy_s"] and rep["kill_to_status_healthy_s"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", choices=("switch", "kill"), default="switch", help="What to measure.")
    ap.add_argument("--steady", type=float, default=20.0, help="Seconds of steady-state load before the deploy.")
    ap.add_argument("--pause", type=float, default=5.0, help="Pause at each red-black step (the CLI default).")
    ap.add_argument("--steps", default="10,25,50,100")
    ap.add_argument("--workers", type=int, default=2, help="Concurrent client threads (closed loop).")
    ap.add_argument("--tail", type=float, default=5.0, help="kill: seconds measured after status is healthy again.")
    ap.add_argument("--limit", type=float, default=300.0, help="kill: give up waiting for recovery after this.")
    ap.add_argument("--client-timeout", type=float, default=300.0, help="kill: per request (held requests wait).")
    ap.add_argument("--json", type=Path, help="Write the results here too.")
    ap.add_argument("--records", type=Path, help="Write every request (start, end, latency, ok, error) here.")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="deploy-switch-"))
    os.environ.setdefault("LLMSERVE_CACHE", str(work / "cache"))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    # The deployment's API key: from the environment of the CLI (the gateway will require it), sent as a
    # bearer token on every client request.
    args.api_key = os.environ.get("LLMSERVE_API_KEY") or "bench-" + secrets.token_urlsafe(24)
    os.environ["LLMSERVE_API_KEY"] = args.api_key
    os.environ[MARKER] = str(work)
    state = work / "state"
    cli = [sys.executable, "-m", "llmserve.cli.app"]
    results: dict = {"scenario": args.scenario, "workers": args.workers}
    if args.scenario == "kill":
        results["client_timeout_s"] = args.client_timeout
    client_box: list[Client] = []
    ok = False
    try:
        ok = (run_kill if args.scenario == "kill" else run_switch)(args, cli, work, state, client_box, results)
    finally:
        for c in client_box:
            c.stop.set()
        down = subprocess.run([*cli, "deploy", "down", MODEL, "--state-dir", str(state)], capture_output=True)
        results["down_rc"] = down.returncode
        deadline = time.monotonic() + 30
        left = _marked(str(work))
        while left and time.monotonic() < deadline:
            time.sleep(0.5)
            left = _marked(str(work))
        results["left_after_down"] = [f"{p} {_cmdline(p)[:100]}" for p in left]
        if left:
            print(f"left after deploy down (killed now): {results['left_after_down']}", file=sys.stderr)
        for p in left:  # started by this run: stop them, and fail the run
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
    marks = results.pop("_marks", {})
    print(json.dumps(results, indent=2))
    if args.records and client_box:
        t0 = client_box[0].records[0][4] if client_box[0].records else 0.0
        rows = [
            {"start": round(r[4] - t0, 3), "end": round(r[0] - t0, 3), "ok": r[2], "version": r[3], "error": r[5]}
            for r in client_box[0].records
        ]
        marks = {k: round(v - t0, 3) for k, v in marks.items()}
        args.records.write_text(json.dumps({"marks": marks, "requests": rows}) + "\n")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    if args.scenario == "switch":
        return 0 if results.get("deploy_rc") == 0 and not left else 1
    return 0 if ok and not left else 1


if __name__ == "__main__":
    sys.exit(main())
