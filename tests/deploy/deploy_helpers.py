"""Helpers for the deploy tests: the CLI in a state folder and a bounded load client that counts every response."""

from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from support.cli import cli_argv, popen_cli, run_cli_json
from support.models import write_vllm_source

__all__ = ["MODEL", "Cli", "Load", "auth", "gateway_url", "kill_pid", "load_on", "write_vllm_source"]

MODEL = "tiny-chat"
DEGRADED = 7  # `llmserve status` exit code when a deployment is degraded


@dataclass
class Cli:
    """The shared CLI runner (support.cli) with `--state-dir` on every command."""

    state_dir: Path

    def args(self, *args: str) -> tuple[str, ...]:
        return (*args, "--state-dir", str(self.state_dir))

    def argv(self, *args: str) -> list[str]:
        return cli_argv(*self.args(*args))

    def run(self, *args: str, timeout: float = 600) -> tuple[int, dict | None, str]:
        return run_cli_json(*self.args(*args), timeout=timeout)

    def popen(self, *args: str, log: Path):
        return popen_cli(*self.args(*args), log=log)

    def status(self, name: str = MODEL, degraded: bool | None = False) -> dict:
        """The rollout state only (the servers' metrics are tests/metrics' subject); degraded: the exit
        code expected (7 or 0), None for either."""
        rc, data, text = self.run("status", name, "--no-metrics")
        assert rc in ((0, DEGRADED) if degraded is None else (DEGRADED if degraded else 0,)), text
        return data

    def serving(self, name: str = MODEL) -> dict[int, int]:
        """{version: weight} of the live servers; {} when the deployment does not exist."""
        rc, data, _ = self.run("status", "--no-metrics", "-o", "json")
        deps = {d["deployment"]: d for d in (data or {}).get("deployments", [])} if rc in (0, DEGRADED) else {}
        if name not in deps:
            return {}
        return {i["version"]: i["weight"] for i in deps[name]["instances"] if i["status"] == "serving"}

    def start_from(self, package: Path | None, version: int | None = None) -> None:
        """Bring the deployment to a known starting state, so a test runs the same alone or after others:
        nothing deployed (package None), or `version` alone at 100% from `package`. A no-op when it is
        already there, which is the case when the module runs in order."""
        if package is None:
            if self.serving():
                rc, _, text = self.run("deploy", "down", MODEL)
                assert rc == 0, text
            return
        if self.serving() == {version: 100}:
            return
        if self.serving():
            rc, _, text = self.run("deploy", "down", MODEL)
            assert rc == 0, text
        rc, _, text = self.run("deploy", str(package), "--pause", "0")
        assert rc == 0, text


@dataclass
class Load:
    """Bounded, loopback-only client load: every response is checked and counted."""

    url: str
    model: str = MODEL
    workers: int = 2
    max_seconds: float = 600
    timeout: float = 60  # per request; held requests wait for a restart (an engine start, ~30-60 s here)
    headers: dict = field(default_factory=dict)  # the deployment's API key (see auth())
    ok: int = 0
    failures: list = field(default_factory=list)
    versions: dict = field(default_factory=dict)
    latencies: list = field(default_factory=list)

    def __post_init__(self):
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(self.workers)]

    def start(self) -> Load:
        self._t0 = time.monotonic()
        for t in self._threads:
            t.start()
        return self

    def _one(self, client: httpx.Client, n: int) -> str:
        body = {"model": self.model, "messages": [{"role": "user", "content": f"hello {n}"}], "max_tokens": 4}
        if n % 3 == 2:
            body["stream"] = True
            with client.stream("POST", "/v1/chat/completions", json=body) as r:
                lines = [line for line in r.iter_lines() if line.startswith("data:")]
                if r.status_code != 200 or lines[-1:] != ["data: [DONE]"]:
                    raise AssertionError(f"stream {r.status_code}: {lines[-2:]}")
                return r.headers.get("x-served-version", "?")
        r = client.post("/v1/chat/completions", json=body)
        if r.status_code != 200 or not r.json().get("choices"):
            raise AssertionError(f"{r.status_code}: {r.text[:300]}")
        return r.headers.get("x-served-version", "?")

    def _run(self, k: int) -> None:
        n = k
        with httpx.Client(base_url=self.url, headers=self.headers, timeout=self.timeout) as client:
            while not self._stop.is_set() and time.monotonic() - self._t0 < self.max_seconds:
                t = time.perf_counter()
                try:
                    v = self._one(client, n)
                    with self._lock:
                        self.ok += 1
                        self.versions[v] = self.versions.get(v, 0) + 1
                        self.latencies.append((time.monotonic(), time.perf_counter() - t))
                except Exception as exc:  # counted, never swallowed
                    with self._lock:
                        self.failures.append(f"{type(exc).__name__}: {exc}")
                n += self.workers

    def stop(self) -> Load:
        self._stop.set()
        for t in self._threads:
            t.join(120)
        return self


def gateway_url(cli: Cli, name: str = MODEL) -> str:
    return cli.status(name)["gateway"]["url"]


def auth(status: dict) -> dict[str, str]:
    """The gateway's key, as a caller presents it: deployments are authenticated by default, and a
    generated key lives in the state folder."""
    key = (Path(status["state_dir"]) / "keys" / f"{status['deployment']}.key").read_text().strip()
    return {"Authorization": f"Bearer {key}"}


def load_on(cli: Cli, name: str = MODEL, **kw) -> Load:
    """Client load on the deployment's gateway, with its key."""
    st = cli.status(name, degraded=None)
    return Load(st["gateway"]["url"], headers=auth(st), **kw)


def kill_pid(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)
