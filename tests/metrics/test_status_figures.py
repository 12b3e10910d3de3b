"""`llmserve status` shows each server's headline figures: a real local deploy of the tiny model (deployed with
LLMSERVE_API_KEY: the gateway wants that key, the servers the deployment's own server key, which status uses),
traffic through the gateway while status scrapes, a status with a wrong --api-key, one with --no-metrics, and one
after the server was killed. The tests run in file order (the last kills the server)."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from support.cli import cli_argv, cli_env, run_cli, run_cli_json

from llmserve.metrics.snapshot import FIGURES

pytestmark = pytest.mark.engine

MODEL = "tiny-chat"
KEY = "status-figures-test-key"
WITH_KEY = {"LLMSERVE_API_KEY": KEY}
WITHOUT_KEY = {"LLMSERVE_API_KEY": ""}


@pytest.fixture(scope="module")
def state_dir(tmp_path_factory, tiny_vllm_package) -> Iterator[Path]:
    """The tiny model deployed (local target) in a state folder of its own; torn down after the module."""
    state = tmp_path_factory.mktemp("status-state")
    rc, _, text = run_cli_json(
        "deploy", tiny_vllm_package, "--pause", "0", "--state-dir", state, env=WITH_KEY, timeout=900
    )
    assert rc == 0, text[-4000:]
    try:
        yield state
    finally:
        subprocess.run(
            cli_argv("deploy", "down", MODEL, "--state-dir", state), capture_output=True, env=cli_env(), timeout=180
        )
        from llmserve.deploy import StateStore
        from llmserve.deploy.local_target import stop_recorded_processes

        store = StateStore(state)
        stop_recorded_processes(store)


DEGRADED = 7  # status's exit code while a routed server is down


def status(state: Path, *args: str, env: dict[str, str] = WITH_KEY, rc: tuple[int, ...] = (0,)) -> dict:
    code, data, text = run_cli_json("status", MODEL, "--state-dir", state, *args, env=env, timeout=120)
    assert code in rc and data is not None, text[-3000:]
    return data


def server(data: dict) -> dict:
    serving = [i for i in data["instances"] if i["status"] == "serving"]
    assert len(serving) == 1, data["instances"]
    return serving[0]


class Traffic:
    """Chat requests through the gateway (with the key) on a thread until stopped; every answer checked."""

    def __init__(self, url: str):
        self.url, self.ok, self.failures = url, 0, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        headers = {"Authorization": f"Bearer {KEY}"}
        with httpx.Client(base_url=self.url, headers=headers, timeout=120) as client:
            n = 0
            while not self._stop.is_set():
                body = {"model": MODEL, "messages": [{"role": "user", "content": f"hello {n}"}], "max_tokens": 8}
                r = client.post("/v1/chat/completions", json=body)
                if r.status_code == 200 and r.json().get("choices"):
                    self.ok += 1
                else:
                    self.failures.append(f"{r.status_code}: {r.text[:200]}")
                n += 1

    def __enter__(self) -> Traffic:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(180)


def test_status_shows_the_figures_of_a_server_under_traffic(state_dir):
    st = status(state_dir, "--no-metrics")
    url = server(st)["url"]  # what status scrapes; the traffic goes through the gateway
    with Traffic(st["gateway"]["url"]) as traffic:
        while traffic.ok < 2 and not traffic.failures:  # the window below must see tokens, not a cold start
            time.sleep(0.2)
        data = status(state_dir, "--interval", "3")
    assert traffic.ok >= 2 and not traffic.failures, traffic.failures[:3]
    m = server(data)["metrics"]
    assert m["error"] is None, m
    assert m["url"] == url + "/metrics"
    assert m["interval_s"] >= 3
    assert m["tokens_out_per_s"] > 0 and m["tokens_in_per_s"] > 0, m
    assert m["requests_running"] >= 0 and m["requests_waiting"] >= 0, m
    assert 0 <= m["kv_cache_usage"] <= 1, m
    assert m["ttft_seconds"]["count"] > 0 and m["ttft_seconds"]["p50"] > 0, m
    assert m["tpot_seconds"] is not None, m
    chat = {e["endpoint"]: e for e in m["endpoints"]}
    assert any(e == "chat" and row["requests_per_s"] > 0 for e, row in chat.items()), m["endpoints"]
    assert all(row["error_rate"] in (0, None) for row in chat.values()), m["endpoints"]
    # the text view: the deployment's table, then the figures of v1
    p = run_cli("status", MODEL, "--state-dir", state_dir, "--interval", "0.5", env=WITH_KEY, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "metrics (last" in p.stdout and "TTFT p50/p99" in p.stdout and "v1" in p.stdout, p.stdout


def test_status_with_a_wrong_key_says_unauthorized_per_server(state_dir):
    """A state folder without the servers' key (one written by an older llmserve) falls back to --api-key."""
    backend = state_dir / "keys" / f"{MODEL}.backend.key"
    aside = backend.with_name("aside")
    backend.rename(aside)
    try:
        data = status(state_dir, "--interval", "0.2", "--api-key", "not-the-key", env=WITHOUT_KEY)
    finally:
        aside.rename(backend)
    m = server(data)["metrics"]
    assert m["error"].startswith("unauthorized: HTTP 401"), m
    assert all(m[k] is None for k in FIGURES)


def test_no_metrics_leaves_the_state_alone(state_dir):
    t0 = time.monotonic()
    data = status(state_dir, "--no-metrics", "--interval", "30")
    assert time.monotonic() - t0 < 30
    assert "metrics" not in server(data)
    all_deps = run_cli_json("status", "--state-dir", state_dir, "--no-metrics", env=WITH_KEY, timeout=120)[1]
    assert all_deps is not None and all("metrics" not in i for d in all_deps["deployments"] for i in d["instances"])


def test_a_killed_server_is_reported_unreachable_and_the_deployment_degraded(state_dir):
    """Its supervisor restarts it (tests/deploy covers that); meanwhile status exits 7 and says why."""
    before = server(status(state_dir, "--no-metrics"))
    os.kill(before["pid"], signal.SIGKILL)
    deadline = time.monotonic() + 30
    while server(status(state_dir, "--no-metrics", rc=(0, DEGRADED)))["health"] == 200 and time.monotonic() < deadline:
        time.sleep(0.2)
    rc, data, text = run_cli_json("status", MODEL, "--state-dir", state_dir, "--interval", "0.2", env=WITH_KEY)
    assert rc == DEGRADED and data is not None and data["degraded"], text[-3000:]
    i = server(data)
    assert i["health"] != 200
    # down (nothing listens) or starting again (its /health says 503): no figures either way
    assert i["metrics"]["error"], i["metrics"]
    assert all(i["metrics"][k] is None for k in FIGURES)
    p = run_cli("status", MODEL, "--state-dir", state_dir, "--interval", "0.2", env=WITH_KEY, timeout=120)
    assert p.returncode == DEGRADED, p.stderr
    assert f"degraded: v{i['version']} (instance {i['instance']}" in p.stdout.replace("#", ""), p.stdout
