"""`llmserve status --target kubernetes` scrapes each pod of a version at its pod IP and `http` container port
(status_figures.attach_kubernetes). Here the pods are the Kubernetes client's own objects, as the API returns them,
whose IPs are loopback servers: one with a metrics page, one where nothing listens, one without an IP yet. (The
whole CLI path against the test control plane, whose node agent gives pods IPs nothing answers on, was run by hand:
each pod says it could not be scraped and why.)"""

from __future__ import annotations

from kubernetes import client
from test_snapshot import page  # noqa: F401 (the fixture)

from llmserve.cli.status_figures import POD_NETWORK_HINT, attach_kubernetes
from llmserve.deploy.kubernetes.cluster import L_COLOR, L_DEPLOYMENT, L_VERSION
from llmserve.deploy.status import ClusterDeploymentStatus, ClusterStatus


def _pod(name: str, version: int, color: str | None, ip: str | None, port: int) -> client.V1Pod:
    labels = {L_DEPLOYMENT: "tiny-chat", L_VERSION: str(version)}
    if color:
        labels[L_COLOR] = color
    container = client.V1Container(
        name="server",
        ports=[
            client.V1ContainerPort(name="grpc", container_port=1),
            client.V1ContainerPort(name="http", container_port=port),
        ],
    )
    ready = client.V1PodCondition(type="Ready", status="True")
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, labels=labels),
        spec=client.V1PodSpec(containers=[container]),
        status=client.V1PodStatus(pod_ip=ip, conditions=[ready] if ip else []),
    )


def test_each_pod_of_each_version_gets_its_figures_or_says_why_not(page, dead_address):  # noqa: F811
    host, port = page.rsplit(":", 1)[0].split("//")[1], int(page.rsplit(":", 1)[1])
    dead_port = int(dead_address.rsplit(":", 1)[1])
    results = [_status("tiny-chat", [_object("tiny-chat-v1", 1), _object("tiny-chat-v2", 2)])]
    pods = {
        "tiny-chat": [
            _pod("v1-a", 1, None, host, port),
            _pod("v1-b", 1, None, host, dead_port),
            _pod("v2-a", 2, None, None, port),
        ]
    }
    attach_kubernetes(results, pods, interval=0.2, timeout=2, api_key=None)
    v1, v2 = results[0].deployments
    by_pod = {p.pod: p for p in v1.pods or []}
    assert set(by_pod) == {"v1-a", "v1-b"}
    up = by_pod["v1-a"]
    assert up.url == page and up.ready is True
    assert up.metrics["error"] is None and up.metrics["tokens_out_per_s"] > 0
    down = by_pod["v1-b"].metrics
    assert down["error"].startswith("unreachable: ") and down["error"].endswith(f"({POD_NETWORK_HINT})")
    assert down["tokens_out_per_s"] is None
    [pending] = v2.pods or []
    assert pending.url is None and pending.metrics["error"] == "the pod has no IP yet"
    assert pending.metrics["url"] is None and pending.metrics["tokens_out_per_s"] is None
    # the JSON of `status --output json`: each Deployment object carries its pods and their figures
    [pod_json] = results[0].to_json()["deployments"][1]["pods"]
    assert list(pod_json) == ["pod", "ip", "url", "ready", "metrics"] and pod_json["metrics"]["url"] is None


def _object(name: str, version: int) -> ClusterDeploymentStatus:
    return ClusterDeploymentStatus(
        object=name, strategy="versioned", color=None, version=version, replicas=1, ready=1, digest=None,
        package=None, package_uri=None, rollout=None, superseded_at=None,
    )  # fmt: skip


def _status(name: str, objects: list[ClusterDeploymentStatus]) -> ClusterStatus:
    return ClusterStatus(
        deployment=name, namespace="models", context=None, server="https://127.0.0.1:6443", model_id=name,
        strategy="versioned", default_version=None, config={}, deployments=objects, services=[],
        open_rollout=None, rollouts=[], history=[], autoscaler=None,
    )  # fmt: skip
