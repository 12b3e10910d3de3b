"""Rollouts on the local target with real `llmserve serve` processes, under continuous client load.

In file order the tests walk one deployment (a few servers at a time on a 2-core machine):
first version -> red-black v2 -> refused interface change -> v3 fails its health check (rollback)
-> versioned v4 beside v2 (+ idle cleanup of v2) -> CLI killed mid red-black, rerun resumes
-> CLI killed again, `llmserve rollback` undoes -> teardown. Each test first brings the deployment
to the state it starts from (`Cli.start_from`, a no-op in file order), so any test also runs alone.
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest
from deploy_helpers import MODEL, Load, auth, kill_pid, load_on

pytestmark = pytest.mark.timeout(900)


def serving(status: dict) -> dict[int, int]:
    """{version: weight} of the live servers."""
    return {i["version"]: i["weight"] for i in status["instances"] if i["status"] == "serving"}


def assert_clean(load: Load) -> None:
    assert load.failures == [], load.failures[:5]
    assert load.ok > 0


def test_first_version(cli, deploy_packages):
    cli.start_from(None)
    rc, data, text = cli.run("deploy", str(deploy_packages["v1"]), "--pause", "0")
    assert rc == 0, text
    assert serving(data) == {1: 100}
    assert "authenticated: its API key was generated into" in text and data["auth"] == "api-key"
    url, body = (
        data["gateway"]["url"],
        {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3},
    )
    r = httpx.post(url + "/v1/chat/completions", json=body, headers=auth(data), timeout=60)
    assert r.status_code == 200 and r.headers["x-served-version"] == "1"
    # without the key, or with another, every route but /health says 401 (KServe v2 in its own error shape)
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"X-API-Key": "wrong"}):
        r = httpx.post(url + "/v1/chat/completions", json=body, headers=headers, timeout=60)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key", r.text
    r = httpx.get(url + "/v2/models/" + MODEL, timeout=60)
    assert r.status_code == 401 and isinstance(r.json()["error"], str)
    assert httpx.get(url + "/-/routes", timeout=10).status_code == 401
    assert httpx.get(url + "/health", timeout=10).status_code == 200
    # the server behind the gateway does not take the caller's key either: it has its own
    server = data["instances"][0]["url"]
    assert httpx.post(server + "/v1/chat/completions", json=body, headers=auth(data), timeout=60).status_code == 401
    # the key is in no process's arguments
    for inst in data["instances"]:
        argv = Path(f"/proc/{inst['pid']}/cmdline").read_bytes().split(b"\0")
        key = auth(data)["Authorization"].split()[1].encode()
        assert key not in b" ".join(argv) and b"--api-key-file" in argv


def test_a_rollout_cannot_change_the_key_silently(cli, deploy_packages, tmp_path):
    cli.start_from(deploy_packages["v1"], 1)
    key_file = tmp_path / "key"
    key_file.write_text("another-key\n")
    key_file.chmod(0o600)
    rc, _, text = cli.run("deploy", str(deploy_packages["v2"]), "--api-key-file", str(key_file), "--pause", "0")
    assert rc == 3 and "would change the API key" in text and "--rotate-api-key" in text, text
    assert serving(cli.status()) == {1: 100}  # nothing changed
    rc, _, text = cli.run("deploy", str(deploy_packages["v2"]), "--no-api-key", "--pause", "0")
    assert rc == 3 and "no key (open)" in text, text


def test_red_black_under_load_zero_failures(cli, deploy_packages):
    cli.start_from(deploy_packages["v1"], 1)
    load = load_on(cli).start()
    time.sleep(2)
    rc, data, text = cli.run("deploy", str(deploy_packages["v2"]), "--steps", "10,25,50,100", "--pause", "2")
    time.sleep(1)
    load.stop()
    assert rc == 0, text
    assert_clean(load)
    assert load.versions.get("1", 0) > 0 and load.versions.get("2", 0) > 0, load.versions
    assert serving(data) == {2: 100}
    old = [i for i in data["instances"] if i["version"] == 1]
    assert old == []  # drained and removed
    for pct in (10, 25, 50, 100):
        assert f"{pct}% of traffic on v2" in text
    assert data["rollout"]["status"] == "done" and data["rollout"]["steps"] == [10, 25, 50, 100]


def test_red_black_refuses_interface_change(cli, deploy_packages):
    cli.start_from(deploy_packages["v2"], 2)
    rc, data, text = cli.run("deploy", str(deploy_packages["v4"]))
    assert rc == 6, text
    assert data["error"] == "interface-changed" and "chat_template" in data["message"]
    assert "--strategy versioned" in data["hint"]
    assert serving(cli.status()) == {2: 100}


def test_failed_health_check_rolls_back_with_zero_failures(cli, deploy_packages):
    cli.start_from(deploy_packages["v2"], 2)
    load = load_on(cli).start()
    rc, data, text = cli.run("deploy", str(deploy_packages["bad"]), "--pause", "1")
    time.sleep(1)
    load.stop()
    assert rc == 7, text
    assert data["error"] == "rollout-failed" and "max_num_seqs" in data["message"]
    assert_clean(load)
    assert set(load.versions) == {"2"}
    st = cli.status()
    assert serving(st) == {2: 100}
    assert st["rollouts"][0]["status"] == "rolled-back"
    assert st["open_rollout"] is None


def test_versioned_side_by_side_and_idle_cleanup(cli, deploy_packages):
    cli.start_from(deploy_packages["v2"], 2)
    st = cli.status()
    url = st["gateway"]["url"]
    load = load_on(cli).start()
    rc, data, text = cli.run(
        "deploy", str(deploy_packages["v4"]), "--strategy", "versioned", "--promote", "--idle-timeout", "8"
    )
    assert rc == 0, text
    assert "warning" in text and "memory" in text  # the overlap's extra cost
    assert serving(data) == {2: 0, 4: 100}
    # both versions answer when asked by name, header or KServe path-style version
    with httpx.Client(base_url=url, headers=auth(st), timeout=60) as c:
        msg = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
        assert c.post("/v1/chat/completions", json={"model": f"{MODEL}:2", **msg}).headers["x-served-version"] == "2"
        assert (
            c.post("/v1/chat/completions", json={"model": MODEL, **msg}, headers={"X-Model-Version": "4"}).headers[
                "x-served-version"
            ]
            == "4"
        )
        ids = [m["id"] for m in c.get("/v1/models").json()["data"]]
        assert f"{MODEL}:2" in ids and f"{MODEL}:4" in ids
    # v2 is no longer the default and nobody asks for it: the gateway retires it; v4 (newest) stays.
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and 2 in serving(cli.status()):
        time.sleep(1)
    load.stop()
    assert_clean(load)
    st = cli.status()
    assert serving(st) == {4: 100}
    assert any("idle" in e["message"] for e in st["history"])


STEPS = (10, 50, 100)


def _kill_at_step(cli, package, step: int, tmp_path):
    """Start a red-black deploy, SIGKILL the CLI once the journal says it is at `step` (1-based) and that
    step's weights are in the routes (the journal is written before each traffic move), during its pause."""
    from llmserve.deploy import StateStore

    proc = cli.popen(
        "deploy", str(package), "--steps", ",".join(map(str, STEPS)), "--pause", "4", log=tmp_path / "cli.log"
    )
    store = StateStore(cli.state_dir)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        r = store.open_rollout(MODEL)
        at_step = r is not None and r.phase == "shifting" and r.step_index + 1 >= step
        if at_step and store.routes(MODEL)[1].weights().get(r.to_instance, 0) == STEPS[step - 1]:
            break
        assert proc.poll() is None, (tmp_path / "cli.log").read_text()
        time.sleep(0.1)
    kill_pid(proc.pid)
    proc.wait()
    store.close()


def test_killed_cli_then_rerun_resumes(cli, deploy_packages, tmp_path):
    cli.start_from(deploy_packages["v4"], 4)
    load = load_on(cli).start()
    _kill_at_step(cli, deploy_packages["v5"], 2, tmp_path)
    st = cli.status()
    assert st["open_rollout"]["interrupted"] is True
    assert serving(st) == {4: 50, 5: 50}  # half-switched, and the record says so
    rc, data, text = cli.run("deploy", str(deploy_packages["v5"]), "--steps", ",".join(map(str, STEPS)), "--pause", "1")
    time.sleep(1)
    load.stop()
    assert rc == 0, text
    assert "resuming rollout" in text
    assert serving(data) == {5: 100}
    assert cli.status()["open_rollout"] is None
    assert_clean(load)


def test_killed_cli_then_rollback_undoes(cli, deploy_packages, tmp_path):
    cli.start_from(deploy_packages["v5"], 5)
    load = load_on(cli).start()
    _kill_at_step(cli, deploy_packages["v6"], 1, tmp_path)
    rc, data, text = cli.run("rollback", MODEL)
    time.sleep(1)
    load.stop()
    assert rc == 0, text
    assert data["recovered"] == "rolled-back"
    st = cli.status()
    assert serving(st) == {5: 100} and st["open_rollout"] is None
    assert_clean(load)


def _instance(cli, version: int) -> dict:
    return next(
        i for i in cli.status(degraded=None)["instances"] if i["version"] == version and i["status"] == "serving"
    )


def _engine_tree(pid: int) -> list[int]:
    from llmserve.deploy import procs

    return procs.session_members(procs.session_of(pid))


def test_killed_live_server_is_restarted_under_load(cli, deploy_packages):
    """kill -9 of the only live server: the gateway holds requests while its supervisor restarts it."""
    cli.start_from(deploy_packages["v5"], 5)
    before = _instance(cli, 5)
    tree = _engine_tree(before["pid"])
    assert len(tree) >= 2  # the API server and vLLM's engine core
    load = load_on(cli, timeout=300).start()
    time.sleep(3)
    t0 = time.monotonic()
    kill_pid(before["pid"])
    deadline = time.monotonic() + 300
    degraded_seen = False
    while time.monotonic() < deadline:
        rc, data, _ = cli.run("status", MODEL, "--no-metrics")
        degraded_seen |= rc == 7 and bool(data["degraded"])
        inst = next(i for i in data["instances"] if i["instance"] == before["instance"])
        if rc == 0 and inst["restarts"] == 1 and inst["health"] == 200:
            break
        time.sleep(0.5)
    recovered_s = time.monotonic() - t0
    time.sleep(3)
    load.stop()
    print(f"recovered in {recovered_s:.1f} s; {load.ok} ok, {len(load.failures)} failed: {load.failures[:3]}")
    assert rc == 0 and inst["restarts"] == 1, data
    assert degraded_seen
    # Only requests in flight on the killed server may fail (2 clients); the rest were held.
    assert len(load.failures) <= load.workers, load.failures
    assert not any(p for p in tree if _alive(p)), "the killed server's engine core was left running"
    assert inst["pid"] != before["pid"]


def _alive(pid: int) -> bool:
    from llmserve.deploy import procs

    return procs.start_time(pid) is not None


def test_killed_gateway_recovers_under_load(cli, deploy_packages):
    cli.start_from(deploy_packages["v5"], 5)
    watchdog = cli.status()["gateway"]["pid"]
    children = Path(f"/proc/{watchdog}/task/{watchdog}/children").read_text().split()
    load = load_on(cli).start()
    time.sleep(3)
    kill_pid(int(children[0]))
    time.sleep(6)
    load.stop()
    assert load.ok > 0
    assert len(load.failures) <= load.workers, load.failures  # only what the killed gateway held
    assert cli.status()["gateway"]["alive"]


def test_old_version_killed_mid_rollout_rolls_forward(cli, deploy_packages, tmp_path):
    """The version being replaced dies during a red-black rollout: going back would route to a dead
    server, so the rollout finishes on the healthy new version instead."""
    from llmserve.deploy import StateStore

    cli.start_from(deploy_packages["v5"], 5)
    old = _instance(cli, 5)
    load = load_on(cli).start()
    proc = cli.popen(
        "deploy", str(deploy_packages["v6"]), "--steps", "10,50,100", "--pause", "4", log=tmp_path / "cli.log"
    )
    store = StateStore(cli.state_dir)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        r = store.open_rollout(MODEL)
        if r is not None and r.phase == "shifting":
            break
        assert proc.poll() is None, (tmp_path / "cli.log").read_text()
        time.sleep(0.1)
    kill_pid(old["pid"])
    assert proc.wait(300) == 0, (tmp_path / "cli.log").read_text()
    time.sleep(1)
    load.stop()
    text = (tmp_path / "cli.log").read_text()
    assert "rolling forward" in text, text
    st = cli.status()
    assert serving(st) == {6: 100}
    assert len(load.failures) <= load.workers, load.failures
    store.close()


def test_down(cli, deploy_packages):
    cli.start_from(deploy_packages["v6"], 6)
    rc, data, text = cli.run("deploy", "down", MODEL)
    assert rc == 0, text
    rc, data, text = cli.run("status")
    assert rc == 0 and data == {"deployments": []}
