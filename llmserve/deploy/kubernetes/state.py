"""State of a deployment on Kubernetes, kept in the cluster so any machine's CLI sees the truth.

    ConfigMap <name>-llmserve   data.deployment  {name, model_id, strategy, config}
                                data.rollouts    the journal: the newest rollouts, newest first; the
                                                 open one (status running) says what the CLI is about
                                                 to do (phase, step, replica plan, what to restore)
                                data.history     one line per thing that happened (the newest 200)
    Lease <name>-llmserve-lock  held by the one command changing the deployment; renewed every few
                                seconds. An expired lease (its holder died), or one held by a dead process
                                on this host, is taken over; then a `running` rollout means "interrupted".
    Deployment annotations      llmserve.dev/package, digest, interface, rollout (what each one runs)

Writes use the ConfigMap's resourceVersion (optimistic concurrency) on top of the lease.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field, fields

from llmserve.deploy.errors import DeploymentBusyError, DeploymentNotFoundError
from llmserve.deploy.kubernetes.cluster import L_DEPLOYMENT, L_MANAGED, Cluster, KubernetesAPIError, api_call

RUNNING, DONE, ROLLED_BACK = "running", "done", "rolled-back"
HISTORY_MAX, ROLLOUTS_MAX = 200, 30
LEASE_S = 15


@dataclass
class ClusterRollout:
    """One journal entry, as the ConfigMap holds it (JSON, key "from" for from_)."""

    id: int
    strategy: str  # red-black, versioned, retire
    package: str
    version: int
    status: str = RUNNING
    phase: str = "starting"
    step_index: int = -1
    message: str | None = None
    cli: str | None = None  # host:pid of the command that wrote it last
    started: float = 0.0
    updated: float = 0.0
    model_id: str = ""
    digest: str | None = None
    interface: dict = field(default_factory=dict)
    store_ref: str | None = None
    api_key_secret: list[str] | None = None  # [Secret name, key]
    host: str | None = None  # manifests.Hosting, as text
    openai: bool = True
    from_: dict | None = None  # the replaced Deployment: object, replicas, version, package, digest
    to: dict | None = None  # the new Deployment: object (and color)
    steps: list[int] = field(default_factory=list)
    plan: list[dict] = field(default_factory=list)  # per step: percent, new, old replicas
    replicas: int = 0
    promote: bool | None = None

    @classmethod
    def from_dict(cls, data: dict) -> ClusterRollout:
        known = {f.name for f in fields(cls)}
        values = {("from_" if k == "from" else k): v for k, v in data.items()}
        return cls(**{k: v for k, v in values.items() if k in known})

    def to_dict(self) -> dict:
        return {("from" if f.name == "from_" else f.name): getattr(self, f.name) for f in fields(self)}


def state_name(name: str) -> str:
    return f"{name}-llmserve"


def raise_(exc: BaseException) -> None:
    """For api_call(what, raise_, exc): an ApiException caught by hand, translated like any other call's."""
    raise exc


class ClusterState:
    def __init__(self, cluster: Cluster, name: str):
        self.c = cluster
        self.name = name
        self.cm_name = state_name(name)

    # -- raw ConfigMap ------------------------------------------------------------------------
    def _get(self):
        return api_call(
            f"read ConfigMap {self.cm_name}",
            self.c.core.read_namespaced_config_map,
            self.cm_name,
            self.c.namespace,
            not_found_ok=True,
        )

    def exists(self) -> bool:
        return self._get() is not None

    def load(self) -> dict:
        cm = self._get()
        if cm is None:
            raise DeploymentNotFoundError(
                f"no deployment named '{self.name}' in namespace '{self.c.namespace}' (no ConfigMap {self.cm_name})"
            )
        return self._decode(cm)

    @staticmethod
    def _decode(cm) -> dict:
        data = cm.data or {}
        return {
            "deployment": json.loads(data.get("deployment", "{}")),
            "rollouts": json.loads(data.get("rollouts", "[]")),
            "history": json.loads(data.get("history", "[]")),
            "_rv": cm.metadata.resource_version,
        }

    def create(self, model_id: str, strategy: str, config: dict) -> dict:
        body = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": self.cm_name,
                "namespace": self.c.namespace,
                "labels": {L_DEPLOYMENT: self.name, L_MANAGED: "llmserve"},
            },
            "data": {
                "deployment": json.dumps(
                    {
                        "name": self.name,
                        "model_id": model_id,
                        "strategy": strategy,
                        "config": config,
                        "created": time.time(),
                    }
                ),
                "rollouts": "[]",
                "history": json.dumps(
                    [_event(None, "created", f"deployment '{self.name}' for model '{model_id}' ({strategy})")]
                ),
            },
        }
        api_call(f"create ConfigMap {self.cm_name}", self.c.core.create_namespaced_config_map, self.c.namespace, body)
        return self.load()

    def update(self, mutate) -> dict:
        """Read, mutate(state) in place, write back with the read resourceVersion; retry on conflict."""
        from kubernetes.client.exceptions import ApiException

        for _ in range(10):
            st = self.load()
            mutate(st)
            st["rollouts"] = st["rollouts"][:ROLLOUTS_MAX]
            st["history"] = st["history"][-HISTORY_MAX:]
            body = {
                "metadata": {
                    "name": self.cm_name,
                    "resourceVersion": st["_rv"],
                    "labels": {L_DEPLOYMENT: self.name, L_MANAGED: "llmserve"},
                },
                "data": {
                    "deployment": json.dumps(st["deployment"]),
                    "rollouts": json.dumps(st["rollouts"]),
                    "history": json.dumps(st["history"]),
                },
            }
            try:
                self.c.core.replace_namespaced_config_map(self.cm_name, self.c.namespace, body)
                return st
            except ApiException as exc:
                if exc.status != 409:
                    api_call("write the deployment state", raise_, exc)  # translated into KubernetesAPIError
            time.sleep(0.05)
        raise KubernetesAPIError(f"could not write ConfigMap {self.cm_name}: conflicting writers")

    def delete(self) -> None:
        api_call(
            f"delete ConfigMap {self.cm_name}",
            self.c.core.delete_namespaced_config_map,
            self.cm_name,
            self.c.namespace,
            not_found_ok=True,
            _preload_content=False,
        )

    # -- journal ------------------------------------------------------------------------------
    def event(self, kind: str, message: str, rollout: int | None = None) -> None:
        self.update(lambda st: st["history"].append(_event(rollout, kind, message)))

    def rollouts(self, st: dict | None = None) -> list[ClusterRollout]:
        """The journal, newest first."""
        return [ClusterRollout.from_dict(r) for r in (st or self.load())["rollouts"]]

    def open_rollout(self, st: dict | None = None) -> ClusterRollout | None:
        return next((r for r in self.rollouts(st) if r.status == RUNNING), None)

    def begin(self, record: ClusterRollout) -> ClusterRollout:
        """Journal a new rollout (its id and times are given here)."""
        out: list[ClusterRollout] = []

        def m(st):
            now = time.time()
            rid = max([r["id"] for r in st["rollouts"]] or [0]) + 1
            rec = ClusterRollout.from_dict(
                record.to_dict()
                | {"id": rid, "status": RUNNING, "cli": holder_host_pid(), "started": now, "updated": now}
            )
            st["rollouts"].insert(0, rec.to_dict())
            st["history"].append(_event(rid, "rollout-begin", f"{rec.strategy} rollout #{rid} of {rec.package}"))
            out.append(rec)

        self.update(m)
        return out[-1]

    def journal(self, rid: int, event: str | None = None, **changes) -> ClusterRollout:
        """Change fields of rollout rid (ClusterRollout's names), with an optional history line."""
        known = {f.name for f in fields(ClusterRollout)}
        unknown = set(changes) - known
        if unknown:
            raise TypeError(f"not fields of a rollout: {sorted(unknown)}")
        out: list[ClusterRollout] = []

        def m(st):
            rec = next(r for r in st["rollouts"] if r["id"] == rid)
            rec.update({("from" if k == "from_" else k): v for k, v in changes.items()})
            rec["updated"] = time.time()
            rec["cli"] = holder_host_pid()
            if event:
                st["history"].append(_event(rid, changes.get("phase") or changes.get("status") or "rollout", event))
            out.append(ClusterRollout.from_dict(rec))

        self.update(m)
        return out[-1]

    def set_config(self, **config) -> None:
        def m(st):
            st["deployment"].setdefault("config", {}).update({k: v for k, v in config.items() if v is not None})

        self.update(m)


def _event(rollout: int | None, kind: str, message: str) -> dict:
    return {"ts": time.time(), "rollout": rollout, "kind": kind, "message": message}


def holder_host_pid() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _now_micro() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaseLock:
    """One holder at a time per deployment (coordination.k8s.io/v1 Lease), renewed by a thread."""

    def __init__(self, cluster: Cluster, name: str, wait_s: float = 0.0, lease_s: int = LEASE_S):
        self.c = cluster
        self.name = name
        self.lease_name = f"{name}-llmserve-lock"
        self.wait_s = wait_s
        self.lease_s = lease_s
        self.identity = f"{holder_host_pid()}:{uuid.uuid4().hex[:8]}"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.lost = False

    def _read(self):
        return api_call(
            f"read Lease {self.lease_name}",
            self.c.coord.read_namespaced_lease,
            self.lease_name,
            self.c.namespace,
            not_found_ok=True,
        )

    def holder_state(self) -> tuple[str | None, bool]:
        """(holder, alive): alive is False when the lease expired or its holder is a dead local process."""
        lease = self._read()
        if lease is None or not lease.spec.holder_identity:
            return None, False
        return lease.spec.holder_identity, _alive(lease)

    def _body(self, rv: str | None) -> dict:
        meta = {
            "name": self.lease_name,
            "namespace": self.c.namespace,
            "labels": {L_DEPLOYMENT: self.name, L_MANAGED: "llmserve"},
        }
        if rv:
            meta["resourceVersion"] = rv
        now = _now_micro()
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": meta,
            "spec": {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": self.lease_s,
                "acquireTime": now,
                "renewTime": now,
            },
        }

    def acquire(self) -> bool:
        from kubernetes.client.exceptions import ApiException

        deadline = time.monotonic() + self.wait_s
        while True:
            lease = self._read()
            try:
                if lease is None:
                    self.c.coord.create_namespaced_lease(self.c.namespace, self._body(None))
                    return True
                if not lease.spec.holder_identity or not _alive(lease):
                    self.c.coord.replace_namespaced_lease(
                        self.lease_name, self.c.namespace, self._body(lease.metadata.resource_version)
                    )
                    return True
            except ApiException as exc:
                if exc.status not in (409, 422):
                    api_call("take the deployment lease", raise_, exc)  # translated into KubernetesAPIError
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.5)

    def _renew(self) -> None:
        from kubernetes.client.exceptions import ApiException

        while not self._stop.wait(max(1.0, self.lease_s / 3)):
            try:
                lease = self._read()
                if lease is None or lease.spec.holder_identity != self.identity:
                    self.lost = True
                    return
                body = self._body(lease.metadata.resource_version)
                body["spec"]["acquireTime"] = _fmt(lease.spec.acquire_time)
                self.c.coord.replace_namespaced_lease(self.lease_name, self.c.namespace, body)
            except (ApiException, KubernetesAPIError, OSError):
                continue

    def release(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=10)
        try:
            lease = self._read()
            if lease is not None and lease.spec.holder_identity == self.identity:
                api_call(
                    "release the deployment lease",
                    self.c.coord.delete_namespaced_lease,
                    self.lease_name,
                    self.c.namespace,
                    not_found_ok=True,
                    _preload_content=False,
                )
        except KubernetesAPIError:
            pass  # it expires by itself

    def __enter__(self) -> LeaseLock:
        if not self.acquire():
            holder, _ = self.holder_state()
            raise DeploymentBusyError(
                f"deployment '{self.name}' is being changed by {holder} "
                f"(waited {self.wait_s:g} s for Lease {self.lease_name})"
            )
        self._thread = threading.Thread(target=self._renew, name="lease-renew", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def _fmt(value) -> str | None:
    if value is None:
        return None
    if isinstance(value, str):
        return value
    return value.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _alive(lease) -> bool:
    holder = lease.spec.holder_identity or ""
    parts = holder.split(":")
    if len(parts) >= 2 and parts[0] == socket.gethostname() and parts[1].isdigit():
        try:
            os.kill(int(parts[1]), 0)
        except ProcessLookupError:
            return False  # its process on this host is gone: no need to wait for the lease to expire
        except PermissionError:
            pass
    renew = lease.spec.renew_time or lease.spec.acquire_time
    if renew is None:
        return False
    if isinstance(renew, str):
        renew = dt.datetime.fromisoformat(renew.replace("Z", "+00:00"))
    age = (dt.datetime.now(dt.UTC) - renew).total_seconds()
    return age < (lease.spec.lease_duration_seconds or LEASE_S)
