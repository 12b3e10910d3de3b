"""Rollouts on the local target with real `llmserve serve` processes, under continuous client load.

In file order the tests walk one deployment (a few servers at a time on a 2-core machine):
first version -> red-black v2 -> refused interface change -> v3 fails its health check (rollback)
-> versioned v4 beside v2 (+ idle cleanup of v2) -> CLI killed mid red-black, rerun resumes
-> CLI killed again, `llmserve rollback` undoes -> teardown. Each test first brings the deployment
to the state it starts from (`Cli.start_from`, a no-op in file order), so any test also runs alone.
"""

from __future__ import annotations

import time

import httpx
import pytest
from deploy_helpers import MODEL, Load, gateway_url, kill_pid

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
    r = httpx.post(
        data["gateway"]["url"] + "/v1/chat/completions",
        json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3},
        timeout=60,
    )
    assert r.status_code == 200 and r.headers["x-served-version"] == "1"


def test_red_black_under_load_zero_failures(cli, deploy_packages):
    cli.start_from(deploy_packages["v1"], 1)
    load = Load(gateway_url(cli)).start()
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
    load = Load(gateway_url(cli)).start()
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
    url = gateway_url(cli)
    load = Load(url).start()
    rc, data, text = cli.run(
        "deploy", str(deploy_packages["v4"]), "--strategy", "versioned", "--promote", "--idle-timeout", "8"
    )
    assert rc == 0, text
    assert "warning" in text and "memory" in text  # the overlap's extra cost
    assert serving(data) == {2: 0, 4: 100}
    # both versions answer when asked by name, header or KServe path-style version
    with httpx.Client(base_url=url, timeout=60) as c:
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


def _kill_at_step(cli, package, step: int, tmp_path):
    """Start a red-black deploy, SIGKILL the CLI once the journal says it is at `step` (1-based)."""
    from llmserve.deploy import StateStore

    proc = cli.popen("deploy", str(package), "--steps", "10,50,100", "--pause", "4", log=tmp_path / "cli.log")
    store = StateStore(cli.state_dir)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        r = store.open_rollout(MODEL)
        if r is not None and r.phase == "shifting" and r.step_index + 1 >= step:
            break
        assert proc.poll() is None, (tmp_path / "cli.log").read_text()
        time.sleep(0.1)
    time.sleep(1)
    kill_pid(proc.pid)
    proc.wait()
    store.close()


def test_killed_cli_then_rerun_resumes(cli, deploy_packages, tmp_path):
    cli.start_from(deploy_packages["v4"], 4)
    load = Load(gateway_url(cli)).start()
    _kill_at_step(cli, deploy_packages["v5"], 2, tmp_path)
    st = cli.status()
    assert st["open_rollout"]["interrupted"] is True
    assert serving(st) == {4: 50, 5: 50}  # half-switched, and the record says so
    rc, data, text = cli.run("deploy", str(deploy_packages["v5"]), "--steps", "10,50,100", "--pause", "1")
    time.sleep(1)
    load.stop()
    assert rc == 0, text
    assert "resuming rollout" in text
    assert serving(data) == {5: 100}
    assert cli.status()["open_rollout"] is None
    assert_clean(load)


def test_killed_cli_then_rollback_undoes(cli, deploy_packages, tmp_path):
    cli.start_from(deploy_packages["v5"], 5)
    load = Load(gateway_url(cli)).start()
    _kill_at_step(cli, deploy_packages["v6"], 1, tmp_path)
    rc, data, text = cli.run("rollback", MODEL)
    time.sleep(1)
    load.stop()
    assert rc == 0, text
    assert data["recovered"] == "rolled-back"
    st = cli.status()
    assert serving(st) == {5: 100} and st["open_rollout"] is None
    assert_clean(load)


def test_down(cli, deploy_packages):
    cli.start_from(deploy_packages["v5"], 5)
    rc, data, text = cli.run("deploy", "down", MODEL)
    assert rc == 0, text
    rc, data, text = cli.run("status")
    assert rc == 0 and data == {"deployments": []}
