"""`llmserve deploy --target kubernetes --autoscale MIN:MAX --queue-target N` on the real test control plane
(kube-apiserver 1.20, whose kube-controller-manager runs the HPA controller: scripts/k8s-test-cluster).

What this verifies: the HorizontalPodAutoscaler is accepted by the API server, scales the serving color, is out
of the way while a red-black rollout moves replicas, follows the serving color after a rollout and a
rollback, and goes with `--autoscale off` and `deploy down`; the HPA controller acts on it (it raises the
target to MIN) and reports the queue metric unavailable. What it does not: scaling on the metric itself (the
test cluster serves no custom metrics API: no Prometheus, no prometheus-adapter)."""

from __future__ import annotations

import threading
import time

from kubernetes import client
from support.waiting import wait_until

MODEL = "tiny-chat"
FAST = ("--pause", "1", "--health-timeout", "30", "--drain-timeout", "1")
HPA_API = "v2beta2"  # what kube-apiserver 1.20 serves (autoscaling/v2 arrived in 1.23)


def _hpa(kube_api, ns: str) -> dict | None:
    from kubernetes.client.exceptions import ApiException

    try:
        return client.CustomObjectsApi(kube_api).get_namespaced_custom_object(
            "autoscaling", HPA_API, ns, "horizontalpodautoscalers", MODEL
        )
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def _target(kube_api, ns: str) -> str | None:
    hpa = _hpa(kube_api, ns)
    return hpa["spec"]["scaleTargetRef"]["name"] if hpa else None


def _deployments(kube_api, ns) -> dict[str, int]:
    return {d.metadata.name: d.spec.replicas for d in client.AppsV1Api(kube_api).list_namespaced_deployment(ns).items}


def test_queue_depth_hpa_follows_the_serving_color(kcli, kube_api, k8s_packages):
    ns = kcli.namespace
    rc, out, text = kcli.run("deploy", str(k8s_packages["v1"]), "--autoscale", "2:4", "--queue-target", "3", *FAST)
    assert rc == 0, text
    hpa = _hpa(kube_api, ns)
    assert hpa is not None, text
    spec = hpa["spec"]
    assert spec["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": f"{MODEL}-red"}
    assert (spec["minReplicas"], spec["maxReplicas"]) == (2, 4)
    assert spec["metrics"] == [
        {
            "type": "Pods",
            "pods": {"metric": {"name": "vllm_num_requests_waiting"}, "target": {"type": "AverageValue", "averageValue": "3"}},
        }
    ]  # fmt: skip
    # The HPA controller acts on it: the Deployment (1 replica) is raised to MIN...
    wait_until(lambda: _deployments(kube_api, ns).get(f"{MODEL}-red") == 2, 90, "the HPA controller to scale to MIN")
    # ...and, with no custom metrics API here, it cannot read the queue metric (so no metric-driven scaling)
    conds = wait_until(
        lambda: [
            c
            for c in ((_hpa(kube_api, ns) or {}).get("status") or {}).get("conditions") or []
            if c["type"] == "ScalingActive" and c["status"] == "False"
        ],
        90,
        "the HPA controller's ScalingActive=False condition",
    )
    assert "vllm_num_requests_waiting" in conds[0]["message"] or conds[0]["reason"].startswith("FailedGet"), conds
    status = kcli.status()
    assert status["autoscaler"]["target"] == f"{MODEL}-red" and status["autoscaler"]["min_replicas"] == 2

    # A red-black rollout: no HPA while both colors run; afterwards it is on the new color, which started
    # with the replica count the HPA had reached.
    samples: list[tuple[set[str], str | None]] = []
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            try:
                samples.append((set(_deployments(kube_api, ns)), _target(kube_api, ns)))
            except Exception:
                pass
            time.sleep(0.1)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    rc, out, text = kcli.run("deploy", str(k8s_packages["v2"]), "--steps", "50,100", *FAST)
    stop.set()
    t.join()
    assert rc == 0, text
    both = [hpa for deps, hpa in samples if deps == {f"{MODEL}-red", f"{MODEL}-black"}]
    assert both and None in both, samples  # paused while the ratio steps ran
    assert _target(kube_api, ns) == f"{MODEL}-black"
    assert _deployments(kube_api, ns) == {f"{MODEL}-black": 2}
    assert "autoscaler tiny-chat paused" in text and "autoscaler tiny-chat: tiny-chat-black" in text

    # rollback: back on the old color
    rc, out, text = kcli.run("rollback", MODEL, "--steps", "100", "--pause", "0.5")
    assert rc == 0, text
    assert _target(kube_api, ns) == f"{MODEL}-red"

    # --autoscale off removes it (an unchanged deploy), a later --autoscale brings it back, down deletes it
    rc, out, text = kcli.run("deploy", str(k8s_packages["v1"]), "--autoscale", "off", *FAST)
    assert rc == 0 and out["action"] == "unchanged", text
    assert _hpa(kube_api, ns) is None
    rc, out, text = kcli.run("deploy", str(k8s_packages["v1"]), "--autoscale", "1:3", *FAST)
    assert rc == 0, text
    assert _target(kube_api, ns) == f"{MODEL}-red" and _hpa(kube_api, ns)["spec"]["maxReplicas"] == 3
    rc, out, text = kcli.run("deploy", "down", MODEL)
    assert rc == 0, text
    assert f"horizontalpodautoscaler/{MODEL}" in out["removed"] and _hpa(kube_api, ns) is None


def test_autoscale_is_refused_on_the_local_target(tmp_path, k8s_packages):
    from support.cli import run_cli_json

    rc, out, text = run_cli_json(
        "deploy", str(k8s_packages["v1"]), "--autoscale", "1:2", "--state-dir", str(tmp_path), timeout=60
    )
    assert rc == 3, text
    assert "--autoscale" in out["message"]


def test_versioned_hpa_follows_the_default_version(kcli, kube_api, k8s_packages):
    ns = kcli.namespace
    versioned = ("--strategy", "versioned", *FAST)
    rc, _, text = kcli.run("deploy", str(k8s_packages["v1"]), "--autoscale", "1:2", *versioned)
    assert rc == 0, text
    assert _target(kube_api, ns) == f"{MODEL}-v1"
    rc, _, text = kcli.run("deploy", str(k8s_packages["v2"]), "--no-promote", *versioned)
    assert rc == 0, text
    assert _target(kube_api, ns) == f"{MODEL}-v1"  # v2 serves by version only: the default is still v1
    rc, _, text = kcli.run("deploy", str(k8s_packages["v3"]), "--promote", *versioned)
    assert rc == 0, text
    assert _target(kube_api, ns) == f"{MODEL}-v3"
    rc, _, text = kcli.run("rollback", MODEL)  # v3 retired: the default goes back to the newest other
    assert rc == 0, text
    assert _target(kube_api, ns) == f"{MODEL}-v2"
