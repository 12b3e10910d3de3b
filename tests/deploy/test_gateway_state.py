"""State, journal, lock and gateway behaviour against small real HTTP backends (no engine)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from llmserve.deploy import procs
from llmserve.deploy.local_target import LocalTarget, without
from llmserve.deploy.state import DeploymentLock, Member, Routes

HERE = Path(__file__).parent


@pytest.fixture()
def backends():
    started = []

    def start(version: str):
        port = procs.free_port()
        p = subprocess.Popen([sys.executable, str(HERE / "fake_backend.py"), str(port), version])
        url = f"http://127.0.0.1:{port}"
        for _ in range(100):
            if procs.health(url) == 200:
                break
            time.sleep(0.1)
        started.append(p)
        return port, url, p

    yield start
    for p in started:
        p.terminate()
        p.wait(10)


@pytest.fixture()
def gateway(store):
    target = LocalTarget(store)
    dep = store.create_deployment("m", "m", "127.0.0.1", procs.free_port(), {})
    dep = target.ensure_gateway(dep)
    yield target, dep
    target.stop_gateway(store.require("m"))


def test_lock_is_exclusive_and_freed_when_holder_dies(store):
    code = (
        f"import sys,time; sys.path.insert(0, {str(Path(__file__).parents[2])!r}); from llmserve.deploy.state import StateStore, DeploymentLock;"
        f"l=DeploymentLock(StateStore({str(store.root)!r}),'d'); assert l.acquire(); print('held', flush=True); time.sleep(60)"
    )
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "held"
    assert not DeploymentLock(store, "d").acquire()
    p.kill()
    p.wait()
    lock = DeploymentLock(store, "d")
    assert lock.acquire(wait_s=5)
    lock.release()


def test_gateway_weights_versions_streaming_and_drain(store, gateway, backends):
    target, dep = gateway
    _, url1, _p1 = backends("1")
    _, url2, _p2 = backends("2")
    a = store.add_instance("m", 1, "/a", None, {}, "versioned", 0)
    b = store.add_instance("m", 2, "/b", None, {}, "versioned", 0)
    m1, m2 = Member(a.id, 1, url1), Member(b.id, 2, url2)
    target.apply_routes(dep, Routes("m", [Member(a.id, 1, url1, 90), Member(b.id, 2, url2, 10)], {1: [m1], 2: [m2]}))
    gw = dep.gateway_url
    with httpx.Client(base_url=gw, timeout=10) as c:
        served = [
            c.post("/v1/chat/completions", json={"model": "m", "messages": []}).json()["version"] for _ in range(20)
        ]
        assert served.count("2") == 2 and served.count("1") == 18  # smooth weighted round robin: exact shares
        r = c.post("/v1/chat/completions", json={"model": "m:2", "messages": []})
        assert r.json() == {"version": "2", "model": "m"} and r.headers["x-served-version"] == "2"
        assert (
            c.post("/v1/chat/completions", json={"model": "m"}, headers={"X-Model-Version": "1"}).json()["version"]
            == "1"
        )
        assert c.post("/v2/models/m/versions/2/infer", json={}).json()["version"] == "2"
        # the path and query reach the backend byte for byte (nothing decoded, no dot segment resolved)
        raw = "/v2/models/m/versions/2/a%3Fb/%2E%2E/c%2Fd/../e?q=%23x&r=%3F"
        with socket.create_connection(("127.0.0.1", dep.gateway_port)) as s:
            s.sendall(f"GET {raw} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
            reply = b"".join(iter(lambda: s.recv(65536), b""))
        assert json.loads(reply.split(b"\r\n\r\n", 1)[1])["raw"] == raw, reply
        r = c.post("/v1/chat/completions", json={"model": "m:7"})
        assert r.status_code == 404 and "serving versions: [1, 2]" in r.json()["error"]["message"]
        ids = [e["id"] for e in c.get("/v1/models").json()["data"]]
        assert ids == ["m", "m:1", "m:2"]
        # SSE passes through chunk by chunk
        with c.stream("POST", "/v1/chat/completions", json={"model": "m:1", "stream": True}) as s:
            assert s.headers["content-type"].startswith("text/event-stream")
            events = [line for line in s.iter_lines() if line.startswith("data:")]
        assert len(events) == 6 and events[-1] == "data: [DONE]"
        # in-flight accounting: a slow request holds its backend until it finishes
        done = {}
        t = threading.Thread(
            target=lambda: done.setdefault(
                "r", c.post("/v1/chat/completions", json={"model": "m:1"}, headers={"x-delay": "3.0"}).status_code
            )
        )
        t.start()
        # polled, not slept: on a loaded machine the request can take a while to reach the gateway
        deadline = time.monotonic() + 5
        while target.stats(dep)["inflight"].get(str(a.id)) != 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert target.stats(dep)["inflight"][str(a.id)] == 1
        target.apply_routes(dep, without(store.routes("m")[1], {a.id}))
        assert c.post("/v1/chat/completions", json={"model": "m"}).json()["version"] == "2"
        assert not target.wait_drained(dep, [a.id], 0.2)
        assert target.wait_drained(dep, [a.id], 5)
        t.join()
        assert done["r"] == 200


def test_gateway_retries_a_dead_backend_and_restarts_from_state(store, gateway, backends):
    target, dep = gateway
    _, url1, _p1 = backends("1")
    a = store.add_instance("m", 1, "/a", None, {}, "red-black", 0)
    dead = store.add_instance("m", 2, "/b", None, {}, "red-black", 0)
    dead_url = f"http://127.0.0.1:{procs.free_port()}"  # nothing listens there
    target.apply_routes(dep, Routes("m", [Member(a.id, 1, url1, 50), Member(dead.id, 2, dead_url, 50)], {}))
    with httpx.Client(base_url=dep.gateway_url, timeout=10) as c:
        assert all(c.post("/v1/chat/completions", json={}).status_code == 200 for _ in range(10))
    assert target.stats(dep)["counts"][str(dead.id)]["error"] >= 4
    # The gateway is a daemon recorded in the state: kill it, the next apply restarts it on the same table.
    dep = store.require("m")
    procs.terminate(dep.gateway_pid, dep.gateway_start, 10)
    target.apply_routes(dep, Routes("m", [Member(a.id, 1, url1, 100)], {}))
    dep2 = store.require("m")
    assert dep2.gateway_pid != dep.gateway_pid
    assert httpx.post(dep2.gateway_url + "/v1/chat/completions", json={}).json()["version"] == "1"


@pytest.mark.parametrize("name", ["../x", "a/b", "..", ".hidden", "x" * 64, "a b", "a\nb", ""])
def test_deployment_names_cannot_escape_the_state_folder(store, name):
    from llmserve.deploy.errors import DeployInputError

    with pytest.raises(DeployInputError, match="not a valid deployment name"):
        store.create_deployment(name, "m", "127.0.0.1", 1, {})
    with pytest.raises(DeployInputError):
        DeploymentLock(store, name)
    assert store.deployments() == []


def test_gateway_wants_the_key_and_forwards_with_the_servers_key(store, backends):
    from llmserve.deploy import local_keys

    local_keys.settle(store.root, "k", None, local_keys.KeyRequest("caller-key", "test"), lambda *a, **k: None)
    target = LocalTarget(store)
    dep = target.ensure_gateway(store.create_deployment("k", "k", "127.0.0.1", procs.free_port(), {}))
    try:
        _, url, _p = backends("1")
        a = store.add_instance("k", 1, "/a", None, {}, "red-black", 0)
        target.apply_routes(dep, Routes("k", [Member(a.id, 1, url, 100)], {1: [Member(a.id, 1, url)]}))
        gw = dep.gateway_url
        assert httpx.post(gw + "/v2/models/k/infer", json={}).status_code == 401
        assert httpx.get(gw + "/-/stats").status_code == 401  # admin routes too
        assert httpx.get(gw + "/health").status_code == 200
        r = httpx.post(gw + "/v2/models/k/infer", json={}, headers={"X-API-Key": "caller-key"})
        backend_key = local_keys.key_files(store.root, "k").backend_key()
        assert r.status_code == 200 and r.json()["auth"] == f"Bearer {backend_key}" != "Bearer caller-key"
        # a rotation (a new key file) is taken by the running gateway without a restart
        local_keys.settle(
            store.root, "k", local_keys.fingerprint("caller-key"), local_keys.KeyRequest("new", "t", rotate=True), print
        )
        target.apply_routes(dep, Routes("k", [Member(a.id, 1, url, 100)], {}))
        assert httpx.post(gw + "/v2/models/k/infer", json={}, headers={"X-API-Key": "caller-key"}).status_code == 401
        assert (
            httpx.post(gw + "/v2/models/k/infer", json={}, headers={"Authorization": "Bearer new"}).status_code == 200
        )
    finally:
        target.stop_gateway(store.require("k"))


def _watchdog(store, name: str, host: str, port: int) -> subprocess.Popen:
    """The deployment's watchdog (which runs its gateway) on host:port, as `llmserve deploy` starts it."""
    argv = [sys.executable, "-m", "llmserve.deploy.watchdog", "--state-dir", str(store.root), "--deployment", name]
    return subprocess.Popen([*argv, "--host", host, "--port", str(port)])


def _wait_health(url: str, watchdog: subprocess.Popen) -> None:
    for _ in range(300):
        assert watchdog.poll() is None, f"the watchdog exited with {watchdog.returncode}"
        if procs.health(url) is not None:
            return
        time.sleep(0.1)
    raise AssertionError(f"no gateway answered on {url}")


@pytest.mark.parametrize("host", ["::1", "::"])
def test_a_gateway_on_ipv6_is_watched_and_reached(store, backends, host):
    """IPv6 hosts: the watchdog binds an IPv6 socket (`::` dual stack: IPv4 clients too), the gateway serves on it,
    routes reload and traffic flows over [::1], and a killed gateway is restarted on the same socket."""
    import psutil

    port = procs.free_port(host)
    assert procs.port_free(host, port)
    _, url, _p = backends("1")
    store.create_deployment("m6", "m6", host, port, {})
    watchdog = _watchdog(store, "m6", host, port)
    try:
        gw = procs.http_url("::1", port)
        assert gw == f"http://[::1]:{port}"
        _wait_health(gw, watchdog)
        assert not procs.port_free(host, port)  # taken, and seen as taken in its own family
        a = store.add_instance("m6", 1, "/a", None, {}, "red-black", 0)
        gen = store.set_routes("m6", Routes("m6", [Member(a.id, 1, url, 100)], {}))
        assert httpx.post(gw + "/-/reload", timeout=10).json()["generation"] >= gen  # admin: loopback ::1 is local
        assert httpx.post(gw + "/v1/chat/completions", json={}, timeout=10).json()["version"] == "1"
        if host == "::" and socket.has_dualstack_ipv6():
            r = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json={}, timeout=10)
            assert r.json()["version"] == "1"
        (gateway,) = psutil.Process(watchdog.pid).children()
        gateway.kill()
        gateway.wait(10)
        time.sleep(0.5)
        assert watchdog.poll() is None
        # the next gateway serves on the socket the watchdog kept, and reads its routes from the state
        assert httpx.post(gw + "/v1/chat/completions", json={}, timeout=30).json()["version"] == "1"
    finally:
        watchdog.terminate()
        assert watchdog.wait(60) == 0
