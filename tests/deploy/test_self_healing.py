"""Self-healing on the local target against small real HTTP backends (no engine, seconds per test):
process trees, the supervisor restarting a killed server while the gateway holds requests, the
watchdog restarting a killed gateway on the same socket, a stream cut by a dying server."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from llmserve.deploy import procs
from llmserve.deploy.local_target import LocalTarget, daemon_env, stop_recorded_processes
from llmserve.deploy.state import SERVING, Routes, StateStore

HERE = Path(__file__).parent
pytestmark = pytest.mark.timeout(180)


@pytest.fixture()
def deployment(store):
    target = LocalTarget(store)
    dep = target.ensure_gateway(store.create_deployment("m", "m", "127.0.0.1", procs.free_port(), {}))
    yield target, dep
    stop_recorded_processes(StateStore(store.root))  # a fresh handle: a test may have replaced the database


def serve_fake(store: StateStore, target: LocalTarget, version: int, weight: int = 100):
    """A fake backend started the way deploy starts servers (detached, own session, argv recorded)."""
    port = procs.free_port()
    inst = store.add_instance("m", version, f"/pkg{version}", None, {}, "red-black", port)
    argv = [sys.executable, str(HERE / "fake_backend.py"), str(port), str(version)]
    launched = procs.launch(argv, Path(inst.log), target.pid_file(inst), env=daemon_env(store.root, "m"))
    store.set_instance_process(inst.id, launched.pid, launched.start, launched.session, argv)
    wait_for(lambda: procs.health(inst.url) == 200, 20)
    store.set_instance_status(inst.id, SERVING)
    return store.instance(inst.id)


def wait_for(cond, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError(f"not true within {timeout} s")


class Traffic:
    """Requests on fresh connections, back to back, every result counted."""

    def __init__(self, url: str, workers: int = 3):
        self.url, self.ok, self.failures = url, 0, []
        self.stop_flag = threading.Event()
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(workers)]
        for t in self.threads:
            t.start()

    def _run(self) -> None:
        while not self.stop_flag.is_set():
            try:
                r = httpx.post(self.url + "/v1/chat/completions", json={"model": "m"}, timeout=60)
                if r.status_code == 200:
                    self.ok += 1
                else:
                    self.failures.append(f"{r.status_code} {r.text[:200]}")
            except httpx.HTTPError as exc:
                self.failures.append(repr(exc))

    def stop(self) -> Traffic:
        self.stop_flag.set()
        for t in self.threads:
            t.join(90)
        return self


def test_stopping_a_daemon_stops_its_whole_session(tmp_path):
    """A server killed with SIGKILL leaves its children (vLLM's engine core) running: the session finds them."""
    script = "import subprocess, time; subprocess.Popen(['sleep', '300']); time.sleep(300)"
    launched = procs.launch([sys.executable, "-c", script], tmp_path / "log", tmp_path / "pid")
    wait_for(lambda: len(procs.session_members(launched.session)) == 2, 10)
    assert procs.rss_bytes(launched.session) > procs.rss_bytes(None, launched.pid) > 0
    os.kill(launched.pid, signal.SIGKILL)
    wait_for(lambda: not procs.alive(launched.pid, launched.start), 10)
    orphans = procs.session_members(launched.session)
    assert len(orphans) == 1  # the child outlived its parent
    assert procs.kill_session(launched.session) == 1
    assert procs.session_members(launched.session) == []
    # our own session, and a session whose number belongs to a live process, are never touched
    assert procs.session_members(os.getsid(0)) == []
    assert procs.session_members(os.getpid()) == []


def test_killed_server_is_restarted_and_requests_are_held_not_failed(store, deployment):
    target, dep = deployment
    inst = serve_fake(store, target, 1)
    target.apply_routes(dep, Routes("m", [inst.member(100)], {1: [inst.member()]}))
    traffic = Traffic(dep.gateway_url)
    wait_for(lambda: traffic.ok > 20, 20)
    t0 = time.monotonic()
    os.kill(inst.pid, signal.SIGKILL)
    wait_for(lambda: store.instance(inst.id).restarts == 1 and store.instance(inst.id).down_since is None, 60)
    recovered_s = time.monotonic() - t0
    before = traffic.ok
    wait_for(lambda: traffic.ok > before + 20, 20)
    traffic.stop()
    # the fake server answers at once, so nothing was in flight on it worth failing: no failure at all
    assert traffic.failures == [], traffic.failures[:3]
    now = store.instance(inst.id)
    assert now.pid != inst.pid and procs.alive(now.pid, now.pid_start) and now.port == inst.port
    kinds = [e["kind"] for e in store.events("m", 50)]
    assert "instance-down" in kinds and "instance-restart" in kinds and "instance-recovered" in kinds
    assert recovered_s < 30
    health = httpx.get(dep.gateway_url + "/health").json()
    assert health["status"] == "ok" and health["down"] == []


def test_gateway_health_names_a_server_it_cannot_restart(store, deployment):
    target, dep = deployment
    a = serve_fake(store, target, 1, 50)
    b = serve_fake(store, target, 2, 50)
    target.apply_routes(dep, Routes("m", [a.member(50), b.member(50)], {1: [a.member()], 2: [b.member()]}))
    # b's launch record now points at a program that exits at once: every restart fails
    store.db.execute(
        "UPDATE instances SET argv=? WHERE id=?", (f'["{sys.executable}", "-c", "raise SystemExit(3)"]', b.id)
    )
    os.kill(b.pid, signal.SIGKILL)
    wait_for(lambda: httpx.get(dep.gateway_url + "/health").json()["down"] != [], 10)
    health = httpx.get(dep.gateway_url + "/health")
    assert health.status_code == 200  # v1 still serves the default pool
    assert health.json()["status"] == "degraded"
    assert health.json()["down"][0]["instance"] == b.id
    with httpx.Client(base_url=dep.gateway_url, timeout=10) as c:
        assert all(c.post("/v1/chat/completions", json={"model": "m"}).json()["version"] == "1" for _ in range(10))
    wait_for(lambda: store.instance(b.id).restarts >= 2, 20)  # backoff: the second attempt waits 1 s


def test_stream_cut_by_a_dying_server_ends_with_an_error_event(store, deployment):
    target, dep = deployment
    inst = serve_fake(store, target, 1)
    target.apply_routes(dep, Routes("m", [inst.member(100)], {1: [inst.member()]}))
    lines = []
    with httpx.stream(
        "POST",
        dep.gateway_url + "/v1/chat/completions",
        json={"model": "m", "stream": True},
        headers={"x-events": "200"},
        timeout=30,
    ) as r:
        for line in r.iter_lines():
            if line.startswith("data:"):
                lines.append(line)
                if len(lines) == 3:
                    os.kill(inst.pid, signal.SIGKILL)
    assert r.status_code == 200
    assert lines[-1].startswith('data: {"error"') and "stopped in the middle" in lines[-1], lines[-3:]
    assert "data: [DONE]" not in lines


def test_killed_gateway_is_restarted_on_the_same_socket(store, deployment):
    target, dep = deployment
    inst = serve_fake(store, target, 1)
    target.apply_routes(dep, Routes("m", [inst.member(100)], {1: [inst.member()]}))
    gateway = [int(p) for p in Path(f"/proc/{dep.gateway_pid}/task/{dep.gateway_pid}/children").read_text().split()]
    assert len(gateway) == 1
    traffic = Traffic(dep.gateway_url)
    wait_for(lambda: traffic.ok > 20, 20)
    os.kill(gateway[0], signal.SIGKILL)
    time.sleep(0.5)
    before = traffic.ok
    wait_for(lambda: traffic.ok > before + 20, 30)
    traffic.stop()
    # Connections that reached the dying gateway fail; new ones wait in the watchdog's backlog.
    assert len(traffic.failures) <= 3, traffic.failures
    children = Path(f"/proc/{dep.gateway_pid}/task/{dep.gateway_pid}/children").read_text().split()
    assert children and int(children[0]) != gateway[0]
    assert httpx.get(dep.gateway_url + "/-/routes").json()["default"][0]["instance"] == inst.id
    # stopping the deployment's gateway leaves no gateway process behind
    target.stop_gateway(store.require("m"))
    assert procs.session_members(dep.gateway_session) == []


def test_killed_watchdog_takes_its_gateway_with_it(store, deployment):
    target, dep = deployment
    gateway = int(Path(f"/proc/{dep.gateway_pid}/task/{dep.gateway_pid}/children").read_text().split()[0])
    os.kill(dep.gateway_pid, signal.SIGKILL)
    wait_for(lambda: procs.start_time(gateway) is None, 10)
    dep = target.ensure_gateway(store.require("m"))  # the next command starts both again
    assert httpx.get(dep.gateway_url + "/health").status_code == 503  # up, with nothing routed


def test_doctor_finds_and_stops_what_a_deleted_or_damaged_database_left(store, deployment):
    """Daemons carry their state folder in their environment: found without the database, stopped by --fix."""
    from support.cli import run_cli_json

    from llmserve.deploy import doctor
    from llmserve.deploy.errors import StateUnreadableError

    target, _dep = deployment
    inst = serve_fake(store, target, 1)
    assert {p.role for p in doctor.scan(store.root)} >= {"watchdog", "gateway"}
    assert doctor.diagnose(store.root).healthy  # every process is recorded
    # a server started the way deploy does, but never recorded: an orphan
    port = procs.free_port()
    env = {**os.environ, doctor.TAG_ENV: doctor.tag(store.root, "m")}
    stray = procs.launch(
        [sys.executable, str(HERE / "fake_backend.py"), str(port), "9"],
        store.root / "stray.log",
        store.root / "s.pid",
        env,
    )
    found = doctor.diagnose(store.root)
    assert not found.healthy and [p.pid for p in found.orphans] == [stray.pid]
    # damage the database: every command says so and names the doctor
    store.close()
    db = store.root / "state.db"
    data = bytearray(db.read_bytes())
    data[:16] = b"definitely-not-a"
    db.write_bytes(bytes(data))
    Path(str(db) + "-wal").unlink(missing_ok=True)
    with pytest.raises(StateUnreadableError) as err:
        StateStore(store.root)
    assert "deploy doctor" in (err.value.hint or "")
    rc, out, text = run_cli_json("deploy", "doctor", "--state-dir", str(store.root))
    assert rc == 7 and out["database"].startswith("unreadable") and len(out["orphans"]) >= 4, text
    rc, out, text = run_cli_json("deploy", "doctor", "--fix", "--state-dir", str(store.root))
    assert rc == 0 and any("moved state.db aside" in a for a in out["actions"]), text
    assert not procs.alive(stray.pid, stray.start) and not procs.alive(inst.pid, inst.pid_start)
    assert doctor.scan(store.root) == []
    assert list(store.root.glob("state.db.unreadable-*"))  # kept, not deleted
    rc, out, _ = run_cli_json("deploy", "doctor", "--state-dir", str(store.root))
    assert rc == 0 and out["healthy"]
