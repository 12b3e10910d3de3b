"""A stand-in for a kubelet (what kwok does): registers a Node and makes scheduled pods Running/Ready.

By default no container runs: a pod bound to our node gets phase Running, a pod IP and Ready=True,
unless its model version is in `unready` (its readiness probe "fails": Ready=False), which tests use
to make a version fail its health check. Pods being deleted are removed at once (a kubelet would stop
the containers, then confirm). The Node's Ready condition is renewed so the control plane keeps it.

In the namespaces listed in `run` the containers really run, as local processes (PodRunner): the
image's entry point is the `llmserve` of this environment; the init containers run first, one at a
time in order, and the first that fails keeps the pod Pending (Initialized=False, its status
terminated with the exit code and the tail of its output as the message, as `Init:Error`); then the
main container starts and the pod is Ready while its readiness probe (GET on the probe's path)
answers 200. The pod network is simulated: the pod IP in the API is a 10.244.x.y address as for any
pod (the endpoints controller refuses loopback addresses), and the pod's processes get a loopback
address 127.0.x.y of their own, which "0.0.0.0" in their arguments becomes; `address_of(pod_ip)` is
that address, where a client on this machine reaches the pod (as a CNI would route the pod IP). Volumes are folders: an emptyDir per pod, a PersistentVolumeClaim
per (namespace, claim) shared by the pods that mount it; a mount path in arguments or environment
values is rewritten to the folder. env (value, secretKeyRef) and envFrom (secretRef, configMapRef) are honoured,
Secrets read through the API as a kubelet does; the host's AWS_* variables are not passed on, so
what a container knows of the store comes from its pod spec.
"""

from __future__ import annotations

import base64
import copy
import datetime as dt
import ipaddress
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
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
        self.run: set[str] = set()  # namespaces whose pods' containers really run (PodRunner)
        self.runners: dict[str, PodRunner] = {}  # pod uid -> its runner
        self.root = Path(tempfile.mkdtemp(prefix="llmserve-node-"))
        self._loop_ips = (f"127.0.{(i >> 8) & 255}.{i & 255}" for i in range(2 + 256 * 10, 256 * 250))

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
        for runner in list(self.runners.values()):
            runner.kill()
        self.runners.clear()
        shutil.rmtree(self.root, ignore_errors=True)

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

    def address_of(self, pod_ip: str) -> str:
        """Where a client on this machine reaches a running pod's processes (its loopback address)."""
        return next(r.address for r in list(self.runners.values()) if r.ip == pod_ip)

    def _run_pod(self, p) -> bool:
        """Pods whose containers run (namespaces in `run`): one step of its runner; True if it is one."""
        runner = self.runners.get(p.metadata.uid)
        if runner is None and p.metadata.namespace in self.run and p.metadata.deletion_timestamp is None:
            ip = self._assigned.setdefault(p.metadata.uid, next(self._ips))
            runner = self.runners[p.metadata.uid] = PodRunner(self, p, ip, next(self._loop_ips))
        if runner is None:
            return False
        if p.metadata.deletion_timestamp is not None:
            runner.kill()  # then deleted below, as any other pod
            self.runners.pop(p.metadata.uid, None)
            return False
        runner.step(p)
        return True

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
            if self._run_pod(p):
                continue
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


LLMSERVE = str(Path(sys.executable).parent / "llmserve")  # the image's entry point, here


class PodRunner:
    """One pod whose containers run as local processes: init containers in order, then the first container."""

    def __init__(self, agent: NodeAgent, pod, ip: str, address: str):
        self.agent = agent
        self.core = agent.core
        self.ns, self.name, self.uid = pod.metadata.namespace, pod.metadata.name, pod.metadata.uid
        self.ip = ip  # the pod IP in the API
        self.address = address  # where its processes listen
        self.dir = agent.root / "pods" / self.uid
        self.dir.mkdir(parents=True)
        self.volumes: dict[str, Path] = {}
        for v in pod.spec.volumes or []:
            if v.persistent_volume_claim is not None:
                path = agent.root / "pvc" / self.ns / v.persistent_volume_claim.claim_name
            else:  # emptyDir (and anything else) is a fresh folder of this pod
                path = self.dir / "volumes" / v.name
            path.mkdir(parents=True, exist_ok=True)
            self.volumes[v.name] = path
        self.inits = list(pod.spec.init_containers or [])
        self.main = pod.spec.containers[0]
        self.index = 0  # the init container running or next; len(inits): the main container
        self.proc: subprocess.Popen | None = None
        self.init_status: list[dict] = []
        self.failed: dict | None = None
        self.main_exit: int | None = None
        self.ready = False
        self.started = _now()
        self._last_probe = 0.0
        self._last_patch: dict | None = None

    # -- a container as a process --------------------------------------------------------------
    def _mounts(self, c) -> list[tuple[str, str]]:
        out = [(m.mount_path.rstrip("/"), str(self.volumes[m.name])) for m in c.volume_mounts or []]
        return sorted(out, key=lambda m: -len(m[0]))

    def _map(self, value: str, mounts: list[tuple[str, str]]) -> str:
        if value == "0.0.0.0":
            return self.address
        for mount, host in mounts:
            if value == mount or value.startswith(mount + "/"):
                return host + value[len(mount) :]
        return value

    def _env(self, c, mounts) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        env["HOME"] = str(self.dir / "home")
        for src in c.env_from or []:
            if src.secret_ref is not None:
                secret = self.core.read_namespaced_secret(src.secret_ref.name, self.ns)
                env.update({k: base64.b64decode(v).decode() for k, v in (secret.data or {}).items()})
            elif src.config_map_ref is not None:
                cm = self.core.read_namespaced_config_map(src.config_map_ref.name, self.ns)
                env.update(cm.data or {})
        for e in c.env or []:
            if e.value is not None:
                env[e.name] = self._map(e.value, mounts)
            elif e.value_from is not None and getattr(e.value_from.field_ref, "field_path", "") == "status.podIP":
                env[e.name] = self.ip
            elif e.value_from is not None and e.value_from.secret_key_ref is not None:
                ref = e.value_from.secret_key_ref
                data = self.core.read_namespaced_secret(ref.name, self.ns).data or {}
                env[e.name] = base64.b64decode(data[ref.key]).decode()
        return env

    def _start(self, c) -> None:
        mounts = self._mounts(c)
        command = list(c.command or ["llmserve"])
        # The image's entry point is this host's llmserve, outside every mount: never mapped (a checkout
        # under /tmp would otherwise be sent into the pod's /tmp scratch volume).
        head = LLMSERVE if command[0] == "llmserve" else self._map(command[0], mounts)
        argv = [head, *(self._map(a, mounts) for a in [*command[1:], *(c.args or [])])]
        log = self.dir / f"{c.name}.log"
        (self.dir / "home").mkdir(exist_ok=True)
        self.proc = subprocess.Popen(
            argv,
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
            env=self._env(c, mounts),
            cwd=self.dir,
            start_new_session=True,
        )

    def log_of(self, name: str) -> str:
        try:
            return (self.dir / f"{name}.log").read_text(errors="replace")
        except OSError:
            return ""

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()

    # -- the pod's lifecycle, one step per sync --------------------------------------------------
    def step(self, pod) -> None:
        if self.failed is None and self.index < len(self.inits):
            c = self.inits[self.index]
            if self.proc is None:
                self._start(c)
                self.init_status.append({"name": c.name, "state": {"running": {"startedAt": _now()}}})
            rc = self.proc.poll()
            if rc is not None:
                self.proc = None
                done = {"exitCode": rc, "reason": "Completed" if rc == 0 else "Error", "finishedAt": _now()}
                if rc != 0:
                    done["message"] = self.log_of(c.name)[-1500:]
                    self.failed = {"name": c.name, "exitCode": rc}
                self.init_status[-1]["state"] = {"terminated": {**done, "startedAt": self.started}}
                self.index += 1 if rc == 0 else 0
                if rc == 0 and self.index == len(self.inits):
                    self._start(self.main)
        elif self.failed is None and self.proc is None and self.main_exit is None:
            self._start(self.main)
        if self.proc is not None and self.index >= len(self.inits):
            rc = self.proc.poll()
            if rc is not None:
                self.main_exit, self.proc, self.ready = rc, None, False
            elif time.monotonic() - self._last_probe > 0.5:
                self._last_probe = time.monotonic()
                self.ready = self._probe()
        self._patch(pod)

    def _probe(self) -> bool:
        probe = self.main.readiness_probe
        path = probe.http_get.path if probe is not None and probe.http_get is not None else "/health"
        port = next((p.container_port for p in self.main.ports or []), 8000)
        try:
            return httpx.get(f"http://{self.address}:{port}{path}", timeout=1.0).status_code == 200
        except httpx.HTTPError:
            return False

    def _patch(self, pod) -> None:
        now = _now()
        initialized = self.failed is None and self.index >= len(self.inits)
        running = initialized and self.main_exit is None
        flag = "True" if self.ready else "False"
        if not initialized:
            main_state = {"waiting": {"reason": "PodInitializing"}}
        elif self.main_exit is not None:
            main_state = {"terminated": {"exitCode": self.main_exit, "reason": "Error", "finishedAt": now}}
        else:
            main_state = {"running": {"startedAt": self.started}}
        init_statuses = [
            {"name": c.name, "image": c.image, "imageID": "", "ready": i < self.index, "restartCount": 0,
             "state": self.init_status[i]["state"] if i < len(self.init_status) else {"waiting": {"reason": "PodInitializing"}}}
            for i, c in enumerate(self.inits)
        ]  # fmt: skip
        init_reason = f"Init:{'Error' if self.failed else f'{self.index}/{len(self.inits)}'}"
        status = {
            "phase": ("Failed" if self.main_exit is not None else "Running") if initialized else "Pending",
            "hostIP": "127.0.0.1",
            "podIP": self.ip,
            "podIPs": [{"ip": self.ip}],
            "startTime": self.started,
            "conditions": [  # reason None: the merge patch removes a reason that no longer holds
                {"type": "PodScheduled", "status": "True"},
                {"type": "Initialized", "status": "True" if initialized else "False",
                 "reason": None if initialized else "ContainersNotInitialized",
                 "message": None if initialized else init_reason},
                {"type": "ContainersReady", "status": flag, "reason": None if self.ready else "ContainersNotReady"},
                {"type": "Ready", "status": flag,
                 "reason": None if self.ready else (init_reason if not initialized else "ContainersNotReady")},
            ],
            "initContainerStatuses": init_statuses,
            "containerStatuses": [
                {"name": self.main.name, "image": self.main.image, "imageID": "", "ready": self.ready,
                 "restartCount": 0, "started": running, "state": main_state}
            ],
        }  # fmt: skip
        if status == self._last_patch:
            return
        body = copy.deepcopy(status)
        for cond in body["conditions"]:
            cond["lastTransitionTime"] = now
        try:
            self.core.patch_namespaced_pod_status(self.name, self.ns, {"status": body})
            self._last_patch = status
        except ApiException as exc:
            if exc.status not in (404, 409):
                raise
