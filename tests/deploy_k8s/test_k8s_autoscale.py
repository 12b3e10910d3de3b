"""`llmserve deploy --target kubernetes --autoscale MIN:MAX --queue-target N` on the real test control plane
(kube-apiserver 1.20, whose kube-controller-manager runs the HPA controller: scripts/k8s-test-cluster).

What this verifies: the HorizontalPodAutoscaler is accepted by the API server, scales the serving color, is out
of the way while a red-black rollout moves replicas, follows the serving color after a rollout and a
rollback, and goes with `--autoscale off` and `deploy down`; and the HPA controller scales the Deployment on
the queue metric: up when the pods' waiting requests are above the target, back down when they fall, and not
at all while the pods report no value.

The metric reaches the controller as in a cluster with prometheus-adapter: through the custom metrics API
(custom.metrics.k8s.io/v1beta1) that the API server's aggregation layer proxies to a registered server
(custom_metrics_server.py, fixture `custom_metrics`). The values it serves are set by the test per namespace
(every running pod of the deployment reports the same number of waiting requests); they are not read from
the pods' /metrics, because the node agent runs no engine for these pods (no Prometheus scrapes them)."""

from __future__ import annotations

import threading
import time

from kubernetes import client
from support.cli import run_cli
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


def _condition(kube_api, ns: str, kind: str, status: str) -> dict | None:
    """The HPA's condition `kind` when it has `status`."""
    conds = ((_hpa(kube_api, ns) or {}).get("status") or {}).get("conditions") or []
    return next((c for c in conds if c["type"] == kind and c["status"] == status), None)


def _current(kube_api, ns: str) -> str | None:
    """The per-pod average of the queue metric the HPA controller last read (its status.currentMetrics)."""
    for m in ((_hpa(kube_api, ns) or {}).get("status") or {}).get("currentMetrics") or []:
        if m["type"] == "Pods" and m["pods"]["metric"]["name"] == "vllm_num_requests_waiting":
            return m["pods"]["current"]["averageValue"]
    return None


def test_queue_depth_hpa_follows_the_serving_color(kcli, kube_api, k8s_packages, custom_metrics):
    ns = kcli.namespace
    custom_metrics.set_waiting(ns, 1)  # below the target of 3: the controller keeps MIN
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
    wait_until(lambda: _deployments(kube_api, ns).get(f"{MODEL}-red") == 2, 180, "the HPA controller to scale to MIN")
    # ...and reads the queue metric through the custom metrics API (1 waiting per pod: no more than MIN)
    conds = wait_until(lambda: _condition(kube_api, ns, "ScalingActive", "True"), 180, "ScalingActive=True")
    assert conds["reason"] == "ValidMetricFound", conds
    wait_until(lambda: _current(kube_api, ns) == "1", 180, "the HPA's current metric value 1")
    assert _deployments(kube_api, ns)[f"{MODEL}-red"] == 2
    status = kcli.status()
    assert status["autoscaler"]["target"] == f"{MODEL}-red" and status["autoscaler"]["min_replicas"] == 2
    assert status["autoscaler"]["current_value"] == "1", status["autoscaler"]

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


def test_the_hpa_scales_on_the_waiting_queue(kcli, kube_api, k8s_packages, custom_metrics):
    """MIN 1, MAX 3, target 3 waiting per pod: no value -> no scaling; 9 per pod -> 3 replicas; 0 -> back to 1."""
    ns, red = kcli.namespace, f"{MODEL}-red"
    rc, _, text = kcli.run("deploy", str(k8s_packages["v1"]), "--autoscale", "1:3", "--queue-target", "3", *FAST)
    assert rc == 0, text

    # The pods report no value yet (as pods Prometheus has not scraped): the controller cannot read the metric
    # from the API and leaves the Deployment alone.
    cond = wait_until(lambda: _condition(kube_api, ns, "ScalingActive", "False"), 180, "ScalingActive=False")
    assert cond["reason"] == "FailedGetPodsMetric", cond
    assert _deployments(kube_api, ns)[red] == 1

    # 9 waiting per pod against a target of 3: ceil(1 x 9/3) = 3 replicas, MAX
    custom_metrics.set_waiting(ns, 9)
    wait_until(lambda: _deployments(kube_api, ns)[red] == 3, 180, "the HPA controller to scale up to 3")
    wait_until(lambda: _current(kube_api, ns) == "9", 180, "the HPA's current metric value 9")
    assert _condition(kube_api, ns, "ScalingActive", "True")["reason"] == "ValidMetricFound"
    # 3 pods at 9 would want 9 replicas: held at MAX
    limited = wait_until(lambda: _condition(kube_api, ns, "ScalingLimited", "True"), 180, "ScalingLimited=True")
    assert limited["reason"] == "TooManyReplicas", limited
    status = kcli.status()["autoscaler"]
    assert (status["current_value"], status["current_replicas"]) == ("9", 3), status
    shown = run_cli(*kcli.args("status", MODEL, "--no-metrics"), env=kcli.env(), timeout=120)
    assert "vllm_num_requests_waiting target 3 per pod, last read 9; now 3" in shown.stdout, shown.stdout + shown.stderr

    # It was the controller that asked, through the aggregator (which names the caller in X-Remote-User), for
    # the pods of the serving Deployment.
    selector = client.AppsV1Api(kube_api).read_namespaced_deployment(red, ns).spec.selector.match_labels
    asked = [
        r for r in list(custom_metrics.requests)
        if r["path"] == f"/apis/custom.metrics.k8s.io/v1beta1/namespaces/{ns}/pods/*/vllm_num_requests_waiting"
    ]  # fmt: skip
    assert asked and all(r["user"] for r in asked), asked
    assert set(asked[-1]["labelSelector"].split(",")) == {f"{k}={v}" for k, v in selector.items()}, asked[-1]

    # Back down. The HPA llmserve renders waits 5 minutes below target before it removes pods (an LLM pod is
    # slow to start again); the test shortens that window on the HPA itself, leaving the metric path as is.
    client.CustomObjectsApi(kube_api).patch_namespaced_custom_object(
        "autoscaling", HPA_API, ns, "horizontalpodautoscalers", MODEL,
        {"spec": {"behavior": {"scaleDown": {"stabilizationWindowSeconds": 0, "selectPolicy": "Max",
                                             "policies": [{"type": "Percent", "value": 100, "periodSeconds": 15}]}}}},
    )  # fmt: skip
    custom_metrics.set_waiting(ns, 0)
    wait_until(lambda: _deployments(kube_api, ns)[red] == 1, 180, "the HPA controller to scale down to MIN (1)")
    wait_until(lambda: _current(kube_api, ns) == "0", 180, "the HPA's current metric value 0")
    assert _hpa(kube_api, ns)["spec"]["scaleTargetRef"]["name"] == red
