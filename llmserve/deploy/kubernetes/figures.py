"""Live figures of a Kubernetes deployment's pods, for `llmserve status`: each pod's URL (pod IP and its
`http` container port), readiness, and the metrics scraped there. Pod IPs answer only where the cluster
network reaches; elsewhere each pod's figures carry the error (and the caller's hint)."""

from __future__ import annotations

from typing import Any

from llmserve.deploy.kubernetes.cluster import L_COLOR, L_VERSION
from llmserve.deploy.kubernetes.manifests import SERVER_PORT
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
    results: list[dict],
    pods_by_deployment: dict[str, list],
    interval: float,
    timeout: float,
    api_key: str | None,
    unreachable_hint: str = "",
) -> None:
    """Add `pods` (each with `metrics`) to every Deployment object of the Kubernetes status results.
    `pods_by_deployment`: the pods (kubernetes client V1Pod) of each llmserve deployment, by its name.
    `unreachable_hint` is appended to a scrape error other than a refused key."""
    urls: dict[tuple[str, str], str] = {}
    rows: dict[tuple[str, Any, Any], list[dict]] = {}
    for r in results:
        for pod in pods_by_deployment.get(r["deployment"], []):
            labels = pod.metadata.labels or {}
            key = (r["deployment"], labels.get(L_VERSION), labels.get(L_COLOR))
            url = pod_url(pod)
            row = {"pod": pod.metadata.name, "ip": pod.status.pod_ip, "url": url, "ready": pod_ready(pod)}
            rows.setdefault(key, []).append(row)
            if url:  # metrics: Triton's own port in executionMode standalone, else the HTTP port's /metrics
                urls[(r["deployment"], pod.metadata.name)] = pod_url(pod, "metrics") or url
    figures = snapshots(urls, interval, timeout, auth_headers(api_key))
    for r in results:
        for d in r["deployments"]:
            pods = rows.get((r["deployment"], str(d["version"]), d["color"]), [])
            for row in pods:
                m = figures.get((r["deployment"], row["pod"]))
                if m is None:
                    m = unknown(None, "the pod has no IP yet")
                elif m["error"] and not m["error"].startswith("unauthorized") and unreachable_hint:
                    m["error"] += f" ({unreachable_hint})"
                row["metrics"] = m
            d["pods"] = pods
