"""A stand-in for a kubelet (what kwok does): registers a Node and makes scheduled pods Running/Ready.

No container runs: a pod bound to our node gets phase Running, a pod IP and Ready=True, unless its
model version is in `unready` (its readiness probe "fails": Ready=False), which tests use to make a
version fail its health check. Pods being deleted are removed at once (a kubelet would stop the
containers, then confirm). The Node's Ready condition is renewed so the control plane keeps it.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import threading
import time

from kubernetes import client
from kubernetes.client.exceptions import ApiException

VERSION_LABEL = "llmserve.dev/model-version"


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class NodeAgent:
    def __init__(self, api: client.ApiClient, node: str = "llmserve-test-node", gpus: int = 8):
        self.core = client.CoreV1Api(api)
        self.node = node
        self.gpus = gpus
        self.unready: set[str] = set()  # model versions whose pods stay unready
        self.max_ready: dict[str, int] = {}  # model version -> at most this many of its pods become ready
        self._ips = (str(ipaddress.ip_address("10.244.0.2") + i) for i in range(60000))
        self._assigned: dict[str, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="node-agent", daemon=True)
        self.errors: list[str] = []

    def start(self) -> NodeAgent:
        capacity = {"cpu": "64", "memory": "512Gi", "pods": "250", "nvidia.com/gpu": str(self.gpus)}
        body = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": self.node, "labels": {"kubernetes.io/hostname": self.node, "type": "llmserve-test"}},
            "spec": {},
        }
        try:
            self.core.create_node(body)
        except ApiException as exc:
            if exc.status != 409:
                raise
        self._node_status(capacity)
        # The TaintNodesByCondition admission plugin taints a new Node not-ready; the node lifecycle
        # controller (not run here) would lift it once the Node reports Ready. Lift it ourselves.
        self.core.patch_node(self.node, {"spec": {"taints": None}})
        self._thread.start()
        return self

    def _node_status(self, capacity: dict | None = None) -> None:
        now = _now()
        status = {
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "llmserve test node agent",
                    "lastHeartbeatTime": now,
                    "lastTransitionTime": now,
                }
            ],
            "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
            "nodeInfo": {
                "machineID": "",
                "systemUUID": "",
                "bootID": "",
                "kernelVersion": "",
                "osImage": "",
                "containerRuntimeVersion": "fake://0",
                "kubeletVersion": "v1.20.2",
                "kubeProxyVersion": "v1.20.2",
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
        }
        if capacity:
            status["capacity"] = capacity
            status["allocatable"] = capacity
        self.core.patch_node_status(self.node, {"status": status})

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        last_beat = 0.0
        while not self._stop.is_set():
            try:
                if time.monotonic() - last_beat > 10:
                    self._node_status()
                    last_beat = time.monotonic()
                self._sync()
            except Exception as exc:  # keep going; tests read self.errors
                self.errors.append(repr(exc))
            self._stop.wait(0.2)

    def _sync(self) -> None:
        pods = self.core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={self.node}").items
        ready_by_version: dict[str, int] = {}
        for p in pods:
            if p.metadata.deletion_timestamp is None and any(
                c.type == "Ready" and c.status == "True" for c in (p.status.conditions or [])
            ):
                v = (p.metadata.labels or {}).get(VERSION_LABEL)
                ready_by_version[v] = ready_by_version.get(v, 0) + 1
        for p in pods:
            ns, name = p.metadata.namespace, p.metadata.name
            if p.metadata.deletion_timestamp is not None:
                try:
                    self.core.delete_namespaced_pod(name, ns, grace_period_seconds=0)
                except ApiException as exc:
                    if exc.status != 404:
                        raise
                self._assigned.pop(p.metadata.uid, None)
                continue
            version = (p.metadata.labels or {}).get(VERSION_LABEL)
            ready_now = any(c.type == "Ready" and c.status == "True" for c in (p.status.conditions or []))
            want_ready = version not in self.unready
            if want_ready and not ready_now and version in self.max_ready:
                want_ready = ready_by_version.get(version, 0) < self.max_ready[version]
            if ready_now and version in self.max_ready and version not in self.unready:
                want_ready = True  # never take a ready pod back (only new pods are held)
            if p.status.phase == "Running" and ready_now == want_ready:
                continue
            if want_ready and not ready_now:
                ready_by_version[version] = ready_by_version.get(version, 0) + 1
            ip = self._assigned.setdefault(p.metadata.uid, next(self._ips))
            now = _now()
            flag = "True" if want_ready else "False"
            status = {
                "phase": "Running",
                "hostIP": "127.0.0.1",
                "podIP": ip,
                "podIPs": [{"ip": ip}],
                "startTime": p.status.start_time.strftime("%Y-%m-%dT%H:%M:%SZ") if p.status.start_time else now,
                "conditions": [
                    {"type": "Initialized", "status": "True", "lastTransitionTime": now},
                    {"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
                    {
                        "type": "ContainersReady",
                        "status": flag,
                        "lastTransitionTime": now,
                        **({} if want_ready else {"reason": "ContainersNotReady"}),
                    },
                    {
                        "type": "Ready",
                        "status": flag,
                        "lastTransitionTime": now,
                        **(
                            {}
                            if want_ready
                            else {
                                "reason": "ContainersNotReady",
                                "message": "readiness probe GET /health: 503 (kept unready by the test)",
                            }
                        ),
                    },
                ],
                "containerStatuses": [
                    {
                        "name": c.name,
                        "image": c.image,
                        "imageID": "",
                        "ready": want_ready,
                        "restartCount": 0,
                        "started": True,
                        "state": {"running": {"startedAt": now}},
                    }
                    for c in p.spec.containers
                ],
            }
            try:
                self.core.patch_namespaced_pod_status(name, ns, {"status": status})
            except ApiException as exc:
                if exc.status not in (404, 409):
                    raise
