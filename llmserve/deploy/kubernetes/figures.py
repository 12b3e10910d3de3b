"""Live figures of a Kubernetes deployment's pods, for `llmserve status`: each pod's URL (pod IP and its
`http` container port), readiness, and the metrics scraped there. Pod IPs answer only where the cluster
network reaches; elsewhere each pod's figures carry the error (and the caller's hint)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from llmserve.deploy.kubernetes.cluster import L_COLOR, L_VERSION
from llmserve.deploy.kubernetes.manifests import SERVER_PORT
from llmserve.deploy.status import ClusterStatus, PodFigures
from llmserve.metrics.snapshot import auth_headers, snapshots, unknown


def pod_url(pod: Any, port_name: str = "http") -> str | None:
    """http://POD_IP:PORT of a pod's server (kubernetes client V1Pod) on its `port_name` container port (the
    `http` port where there is none of that name); None before it has an IP."""
    if not pod.status or not pod.status.pod_ip:
        return None
    port = SERVER_PORT
    for container in pod.spec.containers or []:
        named = {p.name: p.container_port for p in container.ports or []}
        port = named.get(port_name) or named.get("http") or port
    host = pod.status.pod_ip
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def pod_ready(pod: Any) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in (pod.status.conditions or []))


def attach_pod_figures(
    statuses: Sequence[ClusterStatus],
    pods_by_deployment: dict[str, list],
    interval: float,
    timeout: float,
    api_key: str | None,
    unreachable_hint: str = "",
) -> None:
    """Set `pods` (each with its figures) on every Deployment object of the statuses.
    `pods_by_deployment`: the pods (kubernetes client V1Pod) of each llmserve deployment, by its name.
    `unreachable_hint` is appended to a scrape error other than a refused key."""
    urls: dict[tuple[str, str], str] = {}
    found: dict[tuple[str, str | None, str | None], list[Any]] = {}
    for status in statuses:
        for pod in pods_by_deployment.get(status.deployment, []):
            labels = pod.metadata.labels or {}
            found.setdefault((status.deployment, labels.get(L_VERSION), labels.get(L_COLOR)), []).append(pod)
            url = pod_url(pod)
            if url:  # metrics: Triton's own port in executionMode standalone, else the HTTP port's /metrics
                urls[(status.deployment, pod.metadata.name)] = pod_url(pod, "metrics") or url
    figures = snapshots(urls, interval, timeout, auth_headers(api_key))
    for status in statuses:
        for d in status.deployments:
            d.pods = []
            for pod in found.get((status.deployment, str(d.version), d.color), []):
                m = figures.get((status.deployment, pod.metadata.name))
                if m is None:
                    m = unknown(None, "the pod has no IP yet")
                elif m["error"] and not m["error"].startswith("unauthorized") and unreachable_hint:
                    m["error"] += f" ({unreachable_hint})"
                d.pods.append(
                    PodFigures(
                        pod=pod.metadata.name, ip=pod.status.pod_ip, url=pod_url(pod), ready=pod_ready(pod), metrics=m
                    )
                )
