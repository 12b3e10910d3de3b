"""`llmserve deploy --target kubernetes` against a real kube-apiserver (+ controller-manager, scheduler),
with a node agent marking pods Running/Ready. Each test works in its own namespace."""

from __future__ import annotations

import json
import signal
import threading
import time

import pytest
from kubernetes import client
from support.waiting import wait_until

from llmserve.deploy.kubernetes import replica_plan

MODEL = "tiny-chat"
VERSION = "llmserve.dev/model-version"
FAST = ("--pause", "0.5", "--health-timeout", "30", "--drain-timeout", "1")


def _apis(kube_api):
    return client.AppsV1Api(kube_api), client.CoreV1Api(kube_api)


def _deployments(kube_api, ns) -> dict[str, tuple[int, int, str]]:
    apps, _ = _apis(kube_api)
    return {
        d.metadata.name: (d.spec.replicas, d.status.ready_replicas or 0, d.metadata.labels[VERSION])
        for d in apps.list_namespaced_deployment(ns).items
    }


def _endpoint_versions(kube_api, ns, service) -> list[str]:
    """The model versions of the ready endpoints a Service selects now (sorted)."""
    _, core = _apis(kube_api)
    pods = {
        p.status.pod_ip: p.metadata.labels.get(VERSION) for p in core.list_namespaced_pod(ns).items if p.status.pod_ip
    }
    ep = core.read_namespaced_endpoints(service, ns)
    return sorted(pods.get(a.ip, "?") for s in (ep.subsets or []) for a in (s.addresses or []))


def _state(kube_api, ns, name=MODEL) -> dict:
    _, core = _apis(kube_api)
    cm = core.read_namespaced_config_map(f"{name}-llmserve", ns)
    return {k: json.loads(v) for k, v in cm.data.items()}


def test_replica_plan_scales_in_ratio():
    assert replica_plan([10, 25, 50, 100], 4) == [
        {"percent": 25, "new": 1, "old": 3},
        {"percent": 50, "new": 2, "old": 2},
        {"percent": 100, "new": 4, "old": 0},
    ]
    assert replica_plan([10, 50, 100], 1) == [{"percent": 100, "new": 1, "old": 0}]
    assert [p["new"] + p["old"] for p in replica_plan([5, 33, 66, 100], 10)] == [10] * 4


def test_manifests_render_probe_and_gpus():
    from llmserve.deploy.kubernetes import manifests

    body = manifests.deployment(
        namespace="ns",
        object_name="m-red",
        name="m",
        strategy="red-black",
        version=2,
        color="red",
        replicas=3,
        spec=manifests.PodSpec(image="img:1", gpus=2),
        package="/p/m-2.llmpkg",
        digest="sha256:x",
        interface={"io": "a"},
        model_id="m",
        rollout=1,
        drain_timeout_s=5,
        health_timeout_s=60,
    )
    c = body["spec"]["template"]["spec"]["containers"][0]
    assert c["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert c["resources"]["requests"]["nvidia.com/gpu"] == "2" and c["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert c["args"][:2] == ["serve", "/models/m-2.llmpkg"] and body["spec"]["replicas"] == 3
    assert body["spec"]["selector"]["matchLabels"]["llmserve.dev/color"] == "red"


def test_red_black_rollout_completes(kcli, kube_api, k8s_packages):
    ns = kcli.namespace
    rc, out, text = kcli.run("deploy", str(k8s_packages["v1"]), "--replicas", "3", *FAST)
    assert rc == 0, text
    assert _deployments(kube_api, ns) == {f"{MODEL}-red": (3, 3, "1")}
    assert _endpoint_versions(kube_api, ns, MODEL) == ["1"] * 3

    # Watch the Service's ready endpoints during the shift: never fewer than 3, never empty.
    samples: list[list[str]] = []
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            try:
                samples.append(_endpoint_versions(kube_api, ns, MODEL))
            except Exception:
                pass
            time.sleep(0.1)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    rc, out, text = kcli.run("deploy", str(k8s_packages["v2"]), "--steps", "10,50,100", *FAST)
    stop.set()
    t.join()
    assert rc == 0, text
    assert out["action"] == "deployed" and out["rollout"]["status"] == "done"
    # new ready, old removed, the Service selects only the new version
    wait_until(lambda: _deployments(kube_api, ns) == {f"{MODEL}-black": (3, 3, "2")}, what="only the new color")
    wait_until(lambda: _endpoint_versions(kube_api, ns, MODEL) == ["2"] * 3, what="endpoints of v2 only")
    _, core = _apis(kube_api)
    wait_until(lambda: not core.list_namespaced_pod(ns, label_selector=f"{VERSION}=1").items, what="v1 pods gone")
    assert min(len(s) for s in samples) >= 3, samples
    assert any("1" in s and "2" in s for s in samples)  # both served during the shift
    st = _state(kube_api, ns)
    assert st["rollouts"][0]["status"] == "done" and st["rollouts"][0]["plan"] == replica_plan([10, 50, 100], 3)

    # an interface change is refused for red-black, and nothing moves
    rc, out, text = kcli.run("deploy", str(k8s_packages["v4"]), *FAST)
    assert rc == 6, text
    assert "versioned" in text
    assert _deployments(kube_api, ns) == {f"{MODEL}-black": (3, 3, "2")}

    # rollback: red-black back to v1 (its package is still there)
    rc, out, text = kcli.run("rollback", MODEL, "--steps", "100", "--pause", "0.2")
    assert rc == 0, text
    wait_until(lambda: _deployments(kube_api, ns) == {f"{MODEL}-red": (3, 3, "1")}, what="rolled back to v1")
    status = kcli.status()
    assert status["open_rollout"] is None and [d["version"] for d in status["deployments"]] == [1]


def test_unready_version_rolls_back(kcli, kube_api, k8s_packages, node_agent):
    ns = kcli.namespace
    rc, _out, text = kcli.run("deploy", str(k8s_packages["v1"]), "--replicas", "2", *FAST)
    assert rc == 0, text

    # v2 never gets ready: the health check fails, the old version keeps its replicas
    node_agent.unready.add("2")
    rc, _out, text = kcli.run("deploy", str(k8s_packages["v2"]), "--pause", "0.5", "--health-timeout", "4")
    assert rc == 7, text
    assert "rolled back" in text and "ready replicas" in text
    wait_until(lambda: _deployments(kube_api, ns) == {f"{MODEL}-red": (2, 2, "1")}, what="old version only")
    assert _endpoint_versions(kube_api, ns, MODEL) == ["1", "1"]
    assert _state(kube_api, ns)["rollouts"][0]["status"] == "rolled-back"

    # v2 gets only one pod ready: step 1 (1 new / 1 old) passes, step 2 fails -> the old count is restored
    node_agent.unready.clear()
    node_agent.max_ready["2"] = 1
    rc, _out, text = kcli.run(
        "deploy", str(k8s_packages["v2"]), "--steps", "50,100", "--pause", "0.5", "--health-timeout", "4"
    )
    assert rc == 7, text
    assert "step 2" in text
    wait_until(lambda: _deployments(kube_api, ns) == {f"{MODEL}-red": (2, 2, "1")}, what="old replicas restored")
    wait_until(lambda: _endpoint_versions(kube_api, ns, MODEL) == ["1", "1"], what="endpoints of v1 only")
    events = [e["message"] for e in _state(kube_api, ns)["history"]]
    assert any("step 1/2" in m for m in events) and any("rolled back" in m for m in events)


def test_versioned_deployment_and_service_per_version(kcli, kube_api, k8s_packages):
    ns = kcli.namespace
    for key in ("v1", "v2"):
        rc, out, text = kcli.run("deploy", str(k8s_packages[key]), "--strategy", "versioned", *FAST)
        assert rc == 0, text
    assert "runs beside 1 serving version" in text  # the overlap-cost warning
    assert _deployments(kube_api, ns) == {f"{MODEL}-v1": (1, 1, "1"), f"{MODEL}-v2": (1, 1, "2")}
    wait_until(lambda: _endpoint_versions(kube_api, ns, f"{MODEL}-v1") == ["1"], what="v1 service")
    wait_until(lambda: _endpoint_versions(kube_api, ns, f"{MODEL}-v2") == ["2"], what="v2 service")
    assert _endpoint_versions(kube_api, ns, MODEL) == ["1"]  # the default stays on the first version

    # a new interface is fine side by side; idle versions go (never the default v1, never the newest v4)
    rc, out, text = kcli.run("deploy", str(k8s_packages["v4"]), "--strategy", "versioned", "--idle-timeout", "0", *FAST)
    assert rc == 0, text
    wait_until(lambda: set(_deployments(kube_api, ns)) == {f"{MODEL}-v1", f"{MODEL}-v4"}, what="v2 retired as idle")
    _, core = _apis(kube_api)
    assert {s.metadata.name for s in core.list_namespaced_service(ns).items} == {MODEL, f"{MODEL}-v1", f"{MODEL}-v4"}

    # rollback of a versioned rollout retires that version
    rc, out, text = kcli.run("rollback", MODEL)
    assert rc == 0, text
    assert out["retired_version"] == 4
    wait_until(lambda: set(_deployments(kube_api, ns)) == {f"{MODEL}-v1"}, what="v4 retired")

    rc, out, text = kcli.run("deploy", "down", MODEL)
    assert rc == 0, text
    wait_until(lambda: not _deployments(kube_api, ns), what="all removed")
    assert not core.list_namespaced_config_map(ns, label_selector="llmserve.dev/deployment").items


@pytest.mark.parametrize("then", ["rerun", "rollback"])
def test_killed_cli_mid_rollout_ends_consistent(kcli, kube_api, k8s_packages, tmp_path, then):
    ns = kcli.namespace
    rc, out, text = kcli.run("deploy", str(k8s_packages["v1"]), "--replicas", "4", *FAST)
    assert rc == 0, text
    args = ("deploy", str(k8s_packages["v2"]), "--steps", "25,50,75,100", "--pause", "3", "--health-timeout", "30")
    proc = kcli.popen(*args, log=tmp_path / "cli.log")

    def mid():
        try:
            r = _state(kube_api, ns)["rollouts"][0]
        except Exception:
            return False
        return r["status"] == "running" and r["phase"] == "shifting" and r["step_index"] >= 1

    wait_until(mid, timeout=60, what="the rollout in its second step")
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    status = kcli.status()
    assert status["open_rollout"]["interrupted"] is True, status["open_rollout"]
    # half-switched, with a record of it
    deps = _deployments(kube_api, ns)
    assert set(deps) == {f"{MODEL}-red", f"{MODEL}-black"}

    if then == "rerun":
        rc, out, text = kcli.run(*args)
        assert rc == 0, text
        assert out["recovered"] == "resumed"
        final = {f"{MODEL}-black": (4, 4, "2")}
        versions = ["2"] * 4
    else:
        rc, out, text = kcli.run("rollback", MODEL, "--health-timeout", "30")
        assert rc == 0, text
        assert out["recovered"] == "rolled-back"
        final = {f"{MODEL}-red": (4, 4, "1")}
        versions = ["1"] * 4
    wait_until(lambda: _deployments(kube_api, ns) == final, what=f"consistent after {then}")
    wait_until(lambda: _endpoint_versions(kube_api, ns, MODEL) == versions, what="endpoints of one version")
    st = _state(kube_api, ns)
    assert not [r for r in st["rollouts"] if r["status"] == "running"]
    assert kcli.status()["open_rollout"] is None
