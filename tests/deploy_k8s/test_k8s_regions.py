"""Region-by-region rollouts (`llmserve deploy --contexts a,b`) on the real test control plane: two kubeconfig
contexts on the same cluster, each carrying its own namespace, stand in for two regions."""

from __future__ import annotations

import json
import signal
import time
import uuid
from pathlib import Path

import pytest
import yaml
from kubernetes import client
from support.cli import popen_cli, run_cli, run_cli_json
from support.waiting import wait_until

MODEL = "tiny-chat"
VERSION = "llmserve.dev/model-version"
FAST = ("--pause", "0.3", "--health-timeout", "30", "--drain-timeout", "1", "--steps", "100")


def _regions(kubeconfig, kube_api, namespace, tmp_path, names: str):
    """Contexts region-a (the test's namespace), region-b... (one more namespace each) in one kubeconfig."""
    core = client.CoreV1Api(kube_api)
    more = {n: f"t-{uuid.uuid4().hex[:8]}" for n in names[1:]}
    for ns in more.values():
        core.create_namespace({"metadata": {"name": ns}})
    spaces = {names[0]: namespace, **more}
    cfg = yaml.safe_load(Path(kubeconfig).read_text())
    base = cfg["contexts"][0]["context"]
    cfg["contexts"] = [{"name": f"region-{n}", "context": {**base, "namespace": ns}} for n, ns in spaces.items()]
    cfg["current-context"] = "region-a"
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(cfg))
    path.chmod(0o600)
    yield {"kubeconfig": str(path), **spaces}
    for ns in more.values():
        core.delete_namespace(ns)


@pytest.fixture
def regions(kubeconfig, kube_api, namespace, node_agent, tmp_path) -> dict:
    """Contexts region-a (the test's namespace) and region-b (a second namespace)."""
    yield from _regions(kubeconfig, kube_api, namespace, tmp_path, "ab")


@pytest.fixture
def three_regions(kubeconfig, kube_api, namespace, node_agent, tmp_path) -> dict:
    """Contexts region-a (the test's namespace), region-b and region-c."""
    yield from _regions(kubeconfig, kube_api, namespace, tmp_path, "abc")


def _cli(regions: dict, *args: str, timeout: float = 300) -> tuple[int, dict | None, str]:
    env = {"KUBECONFIG": regions["kubeconfig"], "PYTHONWARNINGS": "ignore"}
    return run_cli_json(*args, "--target", "kubernetes", env=env, timeout=timeout)


def _served(kube_api, ns: str) -> dict[str, tuple[int, int, str]]:
    apps = client.AppsV1Api(kube_api)
    return {
        d.metadata.name: (d.spec.replicas, d.status.ready_replicas or 0, d.metadata.labels[VERSION])
        for d in apps.list_namespaced_deployment(ns).items
    }


def test_failing_second_region_rolls_back_the_first(regions, kube_api, k8s_packages):
    both = ("--contexts", "region-a,region-b", "--region-pause", "1")
    t0 = time.monotonic()
    rc, out, text = _cli(regions, "deploy", str(k8s_packages["v1"]), *both, *FAST)
    assert rc == 0, text
    assert [(r["context"], r["namespace"], r["result"], r["version"]) for r in out["regions"]] == [
        ("region-a", regions["a"], "deployed", 1),
        ("region-b", regions["b"], "deployed", 1),
    ]
    assert all(r["gate"]["failed"] is None and r["gate"]["restarts"] == 0 for r in out["regions"])
    # the pods' IPs are not reachable from here (simulated pod network): the gate says so, and passes
    assert all(r["gate"]["errors"] is None and "unavailable" in r["gate"]["figures"] for r in out["regions"])
    print(f"v1 to two regions: {time.monotonic() - t0:.1f} s")

    # Region b cannot start the second pod a red-black step needs: a quota of one pod in its namespace.
    core = client.CoreV1Api(kube_api)
    _one_pod_quota(core, regions["b"])

    t0 = time.monotonic()
    rc, out, text = _cli(
        regions, "deploy", str(k8s_packages["v2"]), *both, *FAST[:2], "--health-timeout", "6", *FAST[4:]
    )
    print(f"v2, region b failing: {time.monotonic() - t0:.1f} s")
    assert rc == 7, text
    assert out["error"] == "regional-rollout-failed" and out["exit_code"] == 7
    a, b = out["regions"]
    assert a["context"] == "region-a" and a["result"] == "deployed" and a["version"] == 2
    assert a["gate"]["failed"] is None
    assert a["rollback"]["action"] == "rolled-back" and a["rollback"]["version"] == 1
    assert b["context"] == "region-b" and b["result"] == "failed" and "rollback" not in b
    assert "0/1 ready" in b["error"]
    assert "region 'region-b' failed" in out["message"] and "rolled back: region-a" in out["message"]

    # Both regions serve v1 again: only v1's Deployment, ready, and no open rollout.
    for ns in (regions["a"], regions["b"]):
        wait_until(lambda ns=ns: [v for (_, _, v) in _served(kube_api, ns).values()] == ["1"], what=f"only v1 in {ns}")
        rc, status, text = run_cli_json(
            "status", MODEL, "--target", "kubernetes", "--namespace", ns, "--no-metrics",
            env={"KUBECONFIG": regions["kubeconfig"], "PYTHONWARNINGS": "ignore"},
        )  # fmt: skip
        assert rc == 0, text
        assert [(d["version"], d["ready"], d["replicas"]) for d in status["deployments"]] == [(1, 1, 1)]
        assert status["open_rollout"] is None
        assert status["rollouts"][0]["status"] in ("done", "rolled-back")

    # `llmserve rollback --contexts`: with the quota gone, v2 everywhere, then both regions back to v1.
    core.delete_namespaced_resource_quota("one-pod", regions["b"])
    rc, out, text = _cli(regions, "deploy", str(k8s_packages["v2"]), *both, *FAST)
    assert rc == 0, text
    assert [r["version"] for r in out["regions"]] == [2, 2]
    rc, out, text = _cli(
        regions, "rollback", MODEL, "--contexts", "region-a,region-b", "--steps", "100", "--pause", "0.3"
    )
    assert rc == 0, text
    assert [(r["context"], r["result"], r["version"]) for r in out["regions"]] == [
        ("region-a", "rolled-back", 1),
        ("region-b", "rolled-back", 1),
    ]


def test_first_region_of_a_new_deployment_is_removed_when_the_next_fails(regions, kube_api, k8s_packages):
    """A region that had no deployment before is taken down (not left on the new package)."""
    core = client.CoreV1Api(kube_api)
    core.create_namespaced_resource_quota(
        regions["b"], {"metadata": {"name": "no-pod"}, "spec": {"hard": {"pods": "0"}}}
    )
    wait_until(
        lambda: (core.read_namespaced_resource_quota("no-pod", regions["b"]).status.hard or {}).get("pods") == "0",
        what="the quota's status",
    )
    rc, out, text = _cli(
        regions, "deploy", str(k8s_packages["v1"]), "--contexts", "region-a,region-b", "--region-pause", "0.5",
        *FAST[:2], "--health-timeout", "4", *FAST[4:],
    )  # fmt: skip
    assert rc == 7, text
    a, b = out["regions"]
    assert a["result"] == "deployed" and a["rollback"]["action"] == "removed"
    assert b["result"] == "failed"
    wait_until(lambda: not _served(kube_api, regions["a"]), what="region a emptied")
    assert f"{MODEL}-llmserve" not in {cm.metadata.name for cm in core.list_namespaced_config_map(regions["a"]).items}


def test_contexts_and_context_exclude_each_other(regions, k8s_packages):
    rc, out, text = _cli(
        regions, "deploy", str(k8s_packages["v1"]), "--contexts", "region-a,region-b", "--context", "region-a"
    )
    assert rc == 3, text
    assert "exclude each other" in out["message"]
    rc, out, text = _cli(regions, "deploy", str(k8s_packages["v1"]), "--contexts", "region-a,nowhere")
    assert rc == 3, text
    assert "no context 'nowhere'" in out["message"]


# -- the cross-region journal (llmserve.deploy.kubernetes.region_journal) ----------------------------

ABC = ("--contexts", "region-a,region-b,region-c")


def _journal(kube_api, ns: str) -> list[dict]:
    """The regional rollout records in ConfigMap tiny-chat-llmserve-regions, newest first."""
    core = client.CoreV1Api(kube_api)
    try:
        cm = core.read_namespaced_config_map(f"{MODEL}-llmserve-regions", ns)
    except client.exceptions.ApiException as exc:
        if exc.status == 404:
            return []
        raise
    return json.loads((cm.data or {}).get("records", "[]"))


def _rollouts(kube_api, ns: str) -> list[dict]:
    """A region's own journal (ConfigMap tiny-chat-llmserve), newest first."""
    cm = client.CoreV1Api(kube_api).read_namespaced_config_map(f"{MODEL}-llmserve", ns)
    return json.loads(cm.data["rollouts"])


def _kill_in_first_gate(regions: dict, kube_api, package: Path, tmp_path: Path) -> dict:
    """A regional deploy over a,b,c killed (SIGKILL) while region a's gate watches it, before region b starts.
    Returns the journal's record as the dead CLI left it."""
    env = {"KUBECONFIG": regions["kubeconfig"], "PYTHONWARNINGS": "ignore"}
    proc = popen_cli(
        "deploy", package, "--target", "kubernetes", *ABC, "--region-pause", "600", *FAST,
        log=tmp_path / "killed.log", env=env,
    )  # fmt: skip

    def first_moved():
        recs = _journal(kube_api, regions["a"])
        return bool(recs) and recs[0]["regions"][0]["phase"] == "moved" and recs[0]

    try:
        wait_until(first_moved, timeout=240, every=0.5, what="region a moved, its gate watching")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    rec = _journal(kube_api, regions["a"])[0]
    assert rec["status"] == "running"
    assert [(r["context"], r["phase"]) for r in rec["regions"]] == [
        ("region-a", "moved"),
        ("region-b", "pending"),
        ("region-c", "pending"),
    ]
    return rec


def test_a_regional_deploy_killed_between_regions_is_continued_by_the_same_deploy(
    three_regions, kube_api, k8s_packages, tmp_path
):
    regions = three_regions
    rec = _kill_in_first_gate(regions, kube_api, k8s_packages["v1"], tmp_path)
    a = rec["regions"][0]
    assert a["before"] == {"last_rollout": 0, "serving": []} and a["changed"] is True
    assert [v for (_, _, v) in _served(kube_api, regions["a"]).values()] == ["1"]
    assert not _served(kube_api, regions["b"]) and not _served(kube_api, regions["c"])

    rc, out, text = _cli(regions, "deploy", str(k8s_packages["v1"]), *ABC, "--region-pause", "1", *FAST)
    assert rc == 0, text
    # region a was moved by this rollout (it had nothing before), and is gated again: it never passed its gate
    assert [(r["context"], r["result"], r["version"]) for r in out["regions"]] == [
        ("region-a", "unchanged", 1),
        ("region-b", "deployed", 1),
        ("region-c", "deployed", 1),
    ]
    recs = _journal(kube_api, regions["a"])
    assert len(recs) == 1 and recs[0]["id"] == rec["id"] and recs[0]["status"] == "done"
    assert [(r["phase"], r["changed"]) for r in recs[0]["regions"]] == [("gated", True)] * 3
    assert recs[0]["regions"][0]["before"] == a["before"]  # the first run's, kept
    for ns in (regions["a"], regions["b"], regions["c"]):
        assert [(r, ready, v) for (r, ready, v) in _served(kube_api, ns).values()] == [(1, 1, "1")]
    # only region a's one rollout of v1: the re-run did not roll it out again
    assert [(r["version"], r["status"]) for r in _rollouts(kube_api, regions["a"])] == [(1, "done")]


def test_a_killed_regional_deploy_is_rolled_back_in_the_regions_it_moved_only(
    three_regions, kube_api, k8s_packages, tmp_path
):
    regions = three_regions
    # a serves v1; c has a history of its own (v1, then v2) that a plain `rollback` there would undo
    for ctx, pkgs in (("region-a", ("v1",)), ("region-c", ("v1", "v2"))):
        for key in pkgs:
            rc, _, text = _cli(regions, "deploy", str(k8s_packages[key]), "--context", ctx, *FAST)
            assert rc == 0, text
    c_history = _rollouts(kube_api, regions["c"])

    rec = _kill_in_first_gate(regions, kube_api, k8s_packages["v3"], tmp_path)
    before = rec["regions"][0]["before"]
    assert before["last_rollout"] == 1 and [(s["version"], s["package"]) for s in before["serving"]] == [
        (1, str(k8s_packages["v1"]))
    ]
    assert [v for (_, _, v) in _served(kube_api, regions["a"]).values()] == ["3"]

    # another package is refused while it is open, and nothing moves
    rc, out, text = _cli(regions, "deploy", str(k8s_packages["v2"]), *ABC, "--region-pause", "1", *FAST)
    assert rc == 8, text
    assert out["error"] == "regional-rollout-open"
    assert f"it rolls out {k8s_packages['v3']}" in out["message"]
    assert "llmserve rollback tiny-chat --target kubernetes --contexts region-a,region-b,region-c" in out["hint"]
    assert [v for (_, _, v) in _served(kube_api, regions["a"]).values()] == ["3"]
    assert not _served(kube_api, regions["b"])
    # `status` in the first context says so, with both ways out
    env = {"KUBECONFIG": regions["kubeconfig"], "PYTHONWARNINGS": "ignore"}
    p = run_cli("status", MODEL, "--target", "kubernetes", "--context", "region-a", "--no-metrics", env=env)
    assert p.returncode == 0, p.stderr
    said = " ".join(p.stdout.split())
    assert f"regional rollout #{rec['id']} of {k8s_packages['v3']} is running (region-a moved" in said
    assert "llmserve rollback tiny-chat --target kubernetes --contexts region-a,region-b,region-c" in said

    rc, out, text = _cli(regions, "rollback", MODEL, *ABC, "--steps", "100", "--pause", "0.3", "--health-timeout", "30")
    assert rc == 0, text
    assert [(r["context"], r["result"], r["version"]) for r in out["regions"]] == [
        ("region-a", "rolled-back", 1),
        ("region-b", "untouched", None),
        ("region-c", "untouched", None),
    ]
    wait_until(lambda: [v for (_, _, v) in _served(kube_api, regions["a"]).values()] == ["1"], what="a on v1 again")
    assert not _served(kube_api, regions["b"])
    assert [v for (_, _, v) in _served(kube_api, regions["c"]).values()] == ["2"]
    assert _rollouts(kube_api, regions["c"]) == c_history  # not one rollout more in c
    recs = _journal(kube_api, regions["a"])
    assert recs[0]["status"] == "rolled-back"
    assert [r["phase"] for r in recs[0]["regions"]] == ["rolled-back", "pending", "pending"]

    # closed: v2 may roll out now
    rc, out, text = _cli(regions, "deploy", str(k8s_packages["v2"]), *ABC, "--region-pause", "0.5", *FAST)
    assert rc == 0, text
    assert [r["result"] for r in out["regions"]] == ["deployed", "deployed", "unchanged"]


def test_a_regional_deploy_killed_inside_the_second_region_is_rolled_back_in_both(
    three_regions, kube_api, k8s_packages, tmp_path
):
    """Killed while region b's own rollout waits for its new pod (a quota of one pod holds it back): the
    rollback undoes that interrupted rollout (b's own journal) and then region a; region c, never reached,
    keeps its v1."""
    regions = three_regions
    rc, _, text = _cli(regions, "deploy", str(k8s_packages["v1"]), *ABC, "--region-pause", "0.3", *FAST)
    assert rc == 0, text
    core = client.CoreV1Api(kube_api)
    _one_pod_quota(core, regions["b"])
    env = {"KUBECONFIG": regions["kubeconfig"], "PYTHONWARNINGS": "ignore"}
    waits = ("--pause", "0.3", "--health-timeout", "900", "--drain-timeout", "1", "--steps", "100")
    proc = popen_cli(
        "deploy", k8s_packages["v2"], "--target", "kubernetes", *ABC, "--region-pause", "0.3", *waits,
        log=tmp_path / "killed.log", env=env,
    )  # fmt: skip

    def b_waiting():
        try:
            r = _rollouts(kube_api, regions["b"])[0]
        except (client.exceptions.ApiException, IndexError):
            return False
        return (
            r["version"] == 2
            and r["status"] == "running"
            and "2" in {v for (_, _, v) in _served(kube_api, regions["b"]).values()}
        )

    try:
        wait_until(b_waiting, timeout=300, every=0.5, what="region b's rollout waiting for its new pod")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    core.delete_namespaced_resource_quota("one-pod", regions["b"])
    rec = _journal(kube_api, regions["a"])[0]
    assert rec["id"] == 2 and rec["status"] == "running"
    assert [r["phase"] for r in rec["regions"]] == ["gated", "rolling", "pending"]
    assert sorted(v for (_, _, v) in _served(kube_api, regions["b"]).values()) == ["1", "2"]
    assert [v for (_, _, v) in _served(kube_api, regions["a"]).values()] == ["2"]

    rc, out, text = _cli(regions, "rollback", MODEL, *ABC, "--steps", "100", "--pause", "0.3", "--health-timeout", "30")
    assert rc == 0, text
    assert [(r["context"], r["result"], r["version"]) for r in out["regions"]] == [
        ("region-a", "rolled-back", 1),
        ("region-b", "rolled-back", 1),
        ("region-c", "untouched", None),
    ]
    for ns in (regions["a"], regions["b"], regions["c"]):
        wait_until(lambda ns=ns: [v for (_, _, v) in _served(kube_api, ns).values()] == ["1"], what=f"v1 in {ns}")
    assert [r["status"] for r in _rollouts(kube_api, regions["b"])][:2] == ["rolled-back", "done"]
    assert [(r["version"], r["status"]) for r in _rollouts(kube_api, regions["c"])] == [(1, "done")]
    assert _journal(kube_api, regions["a"])[0]["status"] == "rolled-back"


def _one_pod_quota(core: client.CoreV1Api, namespace: str) -> None:
    """A quota of one pod in `namespace`, in force: a red-black step there cannot start its second pod."""
    core.create_namespaced_resource_quota(namespace, {"metadata": {"name": "one-pod"}, "spec": {"hard": {"pods": "1"}}})
    wait_until(
        lambda: (core.read_namespaced_resource_quota("one-pod", namespace).status.used or {}).get("pods") == "1",
        what="the quota's usage computed by the resourcequota controller",
    )
