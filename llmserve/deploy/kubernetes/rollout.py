"""The Kubernetes target: the strategies of llmserve.deploy.strategy carried out on a Kubernetes API
(ClusterRollouts), and deploy / rollback / down / status for one namespace (KubernetesDeployer).

red-black: two colors, Deployments <name>-red and <name>-black, behind one Service <name> that selects
  every red-black pod of the deployment; traffic follows *ready* replicas, like server groups behind a
  load balancer. Step k of --steps puts ceil(N * pct / 100) replicas on the new color (scaled up and
  waited ready first: capacity never drops below N ready) and N minus that on the old one. The health
  gate of a step is the ready-replica count of both colors after --pause. Any failure -> atomic
  rollback: the old color is scaled back to its journaled count, the new Deployment is deleted.
  Refused when the interface changes (llmserve.deploy.interface).
versioned: per version a Deployment and a Service <name>-v<N>; the Service <name> selects the default
  version (the first one, or one deployed with --promote). Versions superseded longer than the idle
  timeout are deleted (never the newest, never the default).

State (journal, history) lives in the cluster (llmserve.deploy.kubernetes.state), so the next
command, from any machine, resumes or undoes a rollout whose CLI was killed.
"""

from __future__ import annotations

import math
import time
from dataclasses import replace
from pathlib import Path
from typing import TypeVar

from llmserve.deploy import interface as iface
from llmserve.deploy.errors import DeployInputError, HealthCheckFailedError
from llmserve.deploy.kubernetes import autoscale, manifests
from llmserve.deploy.kubernetes.api_key import ApiKeyOptions, ApiKeys
from llmserve.deploy.kubernetes.cluster import (
    L_COLOR,
    L_DEPLOYMENT,
    L_STRATEGY,
    L_VERSION,
    Cluster,
    KubernetesAPIError,
    api_call,
    dns_name,
)
from llmserve.deploy.kubernetes.state import DONE, ROLLED_BACK, RUNNING, ClusterRollout, ClusterState, LeaseLock
from llmserve.deploy.options import LOCK_WAIT_S, DeployOptions, rollback_options
from llmserve.deploy.source import PackageSource, is_reference, open_source
from llmserve.deploy.status import (
    ClusterDeploymentStatus,
    ClusterRolloutRecord,
    ClusterStatus,
    ClusterTeardown,
    HistoryEvent,
    OpenClusterRollout,
    Outcome,
    Recovery,
    ServiceStatus,
)
from llmserve.deploy.strategy import (
    RED_BLACK,
    RETIRE,
    VERSIONED,
    LiveVersion,
    NewVersion,
    Rollouts,
    Step,
    idle_versions,
)

RecordT = TypeVar("RecordT", bound=ClusterRolloutRecord)


def replica_plan(steps: list[int], replicas: int) -> list[dict]:
    """Per step: percent, replicas of the new version (ceil, at least 1), replicas left on the old one.
    Steps that give the same split are merged (with 2 replicas, 10% and 25% are the same step)."""
    plan: list[dict] = []
    for pct in steps:
        new = replicas if pct >= 100 else min(replicas, max(1, math.ceil(replicas * pct / 100)))
        if plan and plan[-1]["new"] == new:
            plan[-1]["percent"] = pct
            continue
        plan.append({"percent": pct, "new": new, "old": replicas - new})
    return plan


class KubernetesDeployer:
    """deploy / rollback / down / status for one namespace of one cluster."""

    def __init__(
        self,
        cluster: Cluster,
        report=None,
        pod_spec: manifests.PodSpec | None = None,
        replicas: int | None = None,
        api_key: ApiKeyOptions | None = None,
    ):
        self.c = cluster
        self.report = report or (lambda msg, **kw: None)
        self.spec = pod_spec or manifests.PodSpec()
        self.replicas = replicas
        self.keys = ApiKeys(cluster, api_key or ApiKeyOptions(), self.report)
        self.autoscale: autoscale.Autoscale | None = None  # this command's --autoscale (None: keep the recorded)

    def use_api_key(self, options: ApiKeyOptions) -> KubernetesDeployer:
        """Where the pods' API key comes from on the next deploy (llmserve.deploy.kubernetes.api_key)."""
        self.keys = ApiKeys(self.c, options, self.report)
        return self

    # -- small API helpers --------------------------------------------------------------------
    @property
    def ns(self) -> str:
        return self.c.namespace

    def _deployments(self, name: str, strategy: str | None = None) -> list:
        sel = f"{L_DEPLOYMENT}={name}" + (f",{L_STRATEGY}={strategy}" if strategy else "")
        items = api_call("list Deployments", self.c.apps.list_namespaced_deployment, self.ns, label_selector=sel).items
        return sorted(items, key=lambda d: d.metadata.name)

    def _get_dep(self, obj: str):
        return api_call(
            f"read Deployment {obj}", self.c.apps.read_namespaced_deployment, obj, self.ns, not_found_ok=True
        )

    def _scale(self, obj: str, n: int) -> None:
        api_call(
            f"scale Deployment {obj} to {n}",
            self.c.apps.patch_namespaced_deployment,
            obj,
            self.ns,
            {"spec": {"replicas": int(n)}},
        )

    def _ready(self, obj: str) -> int | None:
        d = self._get_dep(obj)
        if d is None:
            return None
        if (d.status.observed_generation or 0) < (d.metadata.generation or 0):
            return -1  # the controller has not seen the last change yet
        return d.status.ready_replicas or 0

    def _pods(self, name: str, extra: str = "") -> list:
        sel = f"{L_DEPLOYMENT}={name}" + (f",{extra}" if extra else "")
        return api_call("list Pods", self.c.core.list_namespaced_pod, self.ns, label_selector=sel).items

    def _pod_report(self, name: str, version: int) -> str:
        lines = []
        for p in self._pods(name, f"{L_VERSION}={version}")[:5]:
            conds = {c.type: c for c in (p.status.conditions or [])}
            ready = conds.get("Ready")
            why = (
                f"Ready={ready.status}" + (f" ({ready.reason})" if ready and ready.reason else "")
                if ready
                else "not scheduled"
            )
            lines.append(f"  pod {p.metadata.name}: phase {p.status.phase}, {why}, node {p.spec.node_name or '-'}")
            lines += _init_problems(p)
        return "\n".join(lines) or "  no pods were created (check quotas and `kubectl get events`)"

    def _wait_ready(self, obj: str, name: str, version: int, n: int, timeout: float, what: str = "") -> float:
        t0 = time.monotonic()
        last_note = t0
        while True:
            ready = self._ready(obj)
            if ready is None:
                raise HealthCheckFailedError(f"Deployment {obj} disappeared while waiting for it to be ready")
            if ready >= n:
                return time.monotonic() - t0
            if time.monotonic() - t0 >= timeout:
                raise HealthCheckFailedError(
                    f"v{version} ({obj}) has {max(ready, 0)}/{n} ready replicas after {timeout:g} s{what}; "
                    f"readiness probe GET /health:\n{self._pod_report(name, version)}",
                    hint=f"Raise --health-timeout or look at `kubectl -n {self.ns} describe deployment {obj}`",
                )
            if time.monotonic() - last_note > 10:
                last_note = time.monotonic()
                self.report(f"waiting for {obj}: {max(ready, 0)}/{n} ready ({time.monotonic() - t0:.0f} s)")
            time.sleep(0.25)

    def _wait_endpoints(self, name: str, version: int, n: int, timeout: float) -> None:
        """Wait until the Service <name> lists n ready endpoints of this version (the load balancer has
        registered the new pods) before the old color gives up replicas."""
        deadline = time.monotonic() + timeout
        while True:
            pods = self._pods(name, f"{L_VERSION}={version}")
            ips = {p.status.pod_ip for p in pods if p.status.pod_ip and p.metadata.deletion_timestamp is None}
            ep = api_call("read Endpoints", self.c.core.read_namespaced_endpoints, name, self.ns, not_found_ok=True)
            have = sum(1 for sub in (ep.subsets or []) if ep for a in (sub.addresses or []) if a.ip in ips) if ep else 0
            if have >= n:
                return
            if time.monotonic() > deadline:
                raise HealthCheckFailedError(
                    f"Service {name} lists {have}/{n} ready endpoints of v{version} after {timeout:g} s"
                )
            time.sleep(0.2)

    def _delete_dep(self, obj: str, wait_s: float = 0.0, name: str | None = None, version: int | None = None) -> None:
        api_call(
            f"delete Deployment {obj}",
            self.c.apps.delete_namespaced_deployment,
            obj,
            self.ns,
            propagation_policy="Background",
            not_found_ok=True,
            _preload_content=False,
        )
        if wait_s and name is not None:
            deadline = time.monotonic() + wait_s
            sel = f"{L_VERSION}={version}" if version is not None else ""
            while time.monotonic() < deadline:
                pods = [
                    p
                    for p in self._pods(name, sel)
                    if p.metadata.labels.get(L_COLOR) == obj.rsplit("-", 1)[-1]
                    or p.metadata.labels.get(L_STRATEGY) == VERSIONED
                ]
                if self._get_dep(obj) is None and not pods:
                    return
                time.sleep(0.25)

    def _apply_service(self, body: dict) -> None:
        name = body["metadata"]["name"]
        cur = api_call(f"read Service {name}", self.c.core.read_namespaced_service, name, self.ns, not_found_ok=True)
        if cur is None:
            api_call(f"create Service {name}", self.c.core.create_namespaced_service, self.ns, body)
        elif (cur.spec.selector or {}) != body["spec"]["selector"]:
            api_call(
                f"point Service {name}",
                self.c.core.patch_namespaced_service,
                name,
                self.ns,
                {"spec": {"selector": body["spec"]["selector"]}},
            )

    def _delete_service(self, svc: str) -> None:
        api_call(
            f"delete Service {svc}",
            self.c.core.delete_namespaced_service,
            svc,
            self.ns,
            not_found_ok=True,
            _preload_content=False,
        )  # servers answer a Status or the object, by version

    def _main_service(self, name: str, strategy: str, version: int | None = None) -> dict:
        sel = {L_DEPLOYMENT: name, L_STRATEGY: strategy}
        if strategy == VERSIONED:
            sel[L_VERSION] = str(version)
        return manifests.service(
            namespace=self.ns, object_name=name, name=name, strategy=strategy, selector=sel, spec=self.spec
        )

    def _render_dep(self, name: str, obj: str, rec: ClusterRollout, replicas: int, opts: DeployOptions) -> dict:
        return manifests.deployment(
            namespace=self.ns,
            object_name=obj,
            name=name,
            strategy=rec.strategy,
            version=rec.version,
            color=(rec.to or {}).get("color"),
            replicas=replicas,
            spec=self.spec,
            package=rec.package,
            digest=rec.digest,
            interface=rec.interface,
            model_id=rec.model_id,
            rollout=rec.id,
            drain_timeout_s=opts.drain_timeout_s,
            health_timeout_s=opts.health_timeout_s,
            store_ref=rec.store_ref,
            api_key_secret=_ref(rec.api_key_secret),
            host=manifests.Hosting.parse(rec.host, rec.openai),
        )

    def _create_dep(self, body: dict) -> None:
        api_call(
            f"create Deployment {body['metadata']['name']}", self.c.apps.create_namespaced_deployment, self.ns, body
        )

    # -- entry points -------------------------------------------------------------------------

    # -- entry points -------------------------------------------------------------------------
    def deploy(self, opts: DeployOptions) -> Outcome:
        # A store reference is pulled here first (to check the package and its interface) and fails the
        # command before anything in the cluster changes; the pods then pull it by digest themselves.
        with open_source(
            opts.package, cache_dir=opts.cache_dir, store_options=opts.store, digest_hint=opts.digest_hint,
            report=self.report,
        ) as src:  # fmt: skip
            if src.from_store and self.spec.store_secret is None:
                self.report(
                    "no --store-secret: the pods' pull uses the image's own AWS configuration (or the node's role)",
                    warning=True,
                )
            return self._deploy(opts, src)

    def _rollouts(self, name: str, opts: DeployOptions, base: ClusterRollout | None = None) -> Rollouts[ClusterRollout]:
        return Rollouts(ClusterRollouts(self, name, opts, base), self.report)

    def _deploy(self, opts: DeployOptions, src: PackageSource) -> Outcome:
        from llmserve.packaging.opened import open_package

        package = src.reference
        opened = open_package(src.path)
        m = opened.manifest
        name = dns_name(opts.name or m.modelId)
        new = NewVersion(m.modelId, m.modelVersion, opened.digest, package, iface.fingerprint(opened))
        state = ClusterState(self.c, name)
        with LeaseLock(self.c, name, LOCK_WAIT_S):
            if state.exists():
                st = state.load()
                if st["deployment"].get("model_id") != m.modelId:
                    raise DeployInputError(
                        f"deployment '{name}' serves model '{st['deployment'].get('model_id')}', not '{m.modelId}'",
                        hint="Give this model its own deployment with --name.",
                    )
                recovered = self.recover(name, resume_package=package, opts=opts)
                if isinstance(recovered, Outcome):  # resumed: that rollout's result is this deploy's
                    return recovered
                other = RED_BLACK if opts.strategy == VERSIONED else VERSIONED
                if self._deployments(name, other):
                    raise DeployInputError(
                        f"deployment '{name}' runs {other} in namespace '{self.ns}'; it cannot switch to {opts.strategy}",
                        hint=f"Use another --name, or remove it first with `llmserve deploy down {name} --target kubernetes`.",
                    )
                state.update(lambda s: s["deployment"].update(strategy=opts.strategy))
            else:
                state.create(m.modelId, opts.strategy, {})
                recovered = None
            if opts.idle_timeout_s is not None:
                state.set_config(idle_timeout_s=opts.idle_timeout_s)
            autoscale.configure(self, state, self.autoscale)
            live = max(self._deployments(name), key=lambda d: (d.spec.replicas or 0, d.metadata.creation_timestamp), default=None)  # fmt: skip
            host = manifests.Hosting.of(m)
            if host.standalone and not self.keys.stays_open(live is not None, _key_of(live)):
                raise DeployInputError(
                    f"{m.modelId} v{m.modelVersion} has executionMode standalone: Triton's own endpoints would be "
                    "the pods' ports, and they take no API key, so the deployment's key would not be enforced",
                    hint="Package it with `executionMode: embedded` (llmserve's frontends, with the key, in front of "
                    "Triton), or deploy with --no-api-key where authentication is done in front of the Service.",
                )
            key_ref = self.keys.resolve(name, live is not None, _key_of(live))
            # What every rollout record of this package carries (the pods are rendered from it).
            base = ClusterRollout(
                id=0,
                strategy=opts.strategy,
                package=package,
                version=m.modelVersion,
                model_id=m.modelId,
                digest=opened.digest,
                interface=new.interface,
                store_ref=src.serve_ref if src.from_store else None,
                api_key_secret=list(key_ref) if key_ref else None,
                host=str(host),
                openai=host.openai,
            )
            rollouts = self._rollouts(name, opts, base)
            try:
                if opts.strategy == VERSIONED:
                    result = rollouts.versioned(new, opts.promote)
                else:
                    result = rollouts.red_black(new, opts.steps)
            finally:
                self._prune_keys(name, state)
                autoscale.follow(self, name)  # the HPA back on (or onto) the serving Deployment
            if isinstance(recovered, Recovery):
                result.recovered = recovered
            return result

    def recover(self, name: str, *, resume_package: str | None, opts: DeployOptions) -> Recovery | Outcome | None:
        """Finish or undo a rollout whose CLI died (llmserve.deploy.strategy.Rollouts.recover)."""
        return self._rollouts(name, opts).recover(resume_package)

    def _prune_keys(self, name: str, state: ClusterState) -> None:
        """Delete the key Secrets llmserve created that no Deployment and no open rollout reads any more
        (a rotated-out key, the key of a rollout that was undone): an old key must not linger as a secret."""
        try:
            keep = {ref[0] for d in self._deployments(name) if (ref := _key_of(d))}
            if state.exists():
                keep |= {str(r.api_key_secret[0]) for r in state.rollouts() if r.status == RUNNING and r.api_key_secret}
            gone = self.keys.remove_created(name, keep)
        except KubernetesAPIError as exc:  # best effort: never hide the rollout's own outcome
            self.report(f"unused API key Secrets not removed: {exc.message}", warning=True)
            return
        for obj in gone:
            self.report(f"removed {obj} (its key is no longer used)")

    def rollback(self, name: str, to_version: int | None = None, opts: DeployOptions | None = None) -> Outcome:
        opts = opts or DeployOptions(package=Path("."))
        name = dns_name(name)
        state = ClusterState(self.c, name)
        with LeaseLock(self.c, name, LOCK_WAIT_S):
            state.load()  # not found -> clear error
            recovered = self.recover(name, resume_package=None, opts=opts)
            if isinstance(recovered, Recovery):  # never an Outcome: there is no package to resume
                return Outcome.undid(name, recovered)
            done = [r for r in state.rollouts() if r.status == DONE and r.strategy in (RED_BLACK, VERSIONED)]
            if not done:
                raise DeployInputError(
                    f"deployment '{name}' has no finished rollout to roll back",
                    hint=f"See its history with `llmserve status {name} --target kubernetes`.",
                )
            last = done[0]
            if last.strategy == VERSIONED and to_version is None:
                return self._rollouts(name, opts).retire(last)
            target_pkg = target_digest = None
            if to_version is None:
                target_pkg = (last.from_ or {}).get("package")
                target_digest = (last.from_ or {}).get("digest")
            else:
                earlier = next((r for r in done if r.version == to_version), None)
                target_pkg, target_digest = (earlier.package, earlier.digest) if earlier else (None, None)
            if not target_pkg or not (is_reference(target_pkg) or Path(target_pkg).exists()):
                raise DeployInputError(
                    f"no earlier package of '{name}' to roll back to"
                    + (f" (version {to_version})" if to_version else "")
                    + (f": {target_pkg} is gone" if target_pkg else ""),
                    hint="Deploy the package you want with `llmserve deploy PKG --target kubernetes`.",
                )
        self.report(f"rolling back '{name}' to {target_pkg} (red-black)")
        ropts = rollback_options(opts, name, target_pkg, target_digest)
        result = self.deploy(ropts)
        result.action = "rolled-back"
        return result

    def down(self, name: str, drain_timeout_s: float = 30.0) -> ClusterTeardown:
        name = dns_name(name)
        state = ClusterState(self.c, name)
        with LeaseLock(self.c, name, LOCK_WAIT_S):
            state.load()  # not found -> clear error
            removed = []
            for d in self._deployments(name):
                self._delete_dep(d.metadata.name)
                removed.append(d.metadata.name)
            sel = f"{L_DEPLOYMENT}={name}"
            for svc in api_call(
                "list Services", self.c.core.list_namespaced_service, self.ns, label_selector=sel
            ).items:
                self._delete_service(svc.metadata.name)
                removed.append(f"service/{svc.metadata.name}")
            removed += self.keys.remove_created(name)
            removed += [f"horizontalpodautoscaler/{name}"] if autoscale.remove(self.c, name) else []
            state.delete()
        self.report(f"deployment '{name}' removed from namespace '{self.ns}' ({len(removed)} object(s))")
        return ClusterTeardown(deployment=name, removed=removed, namespace=self.ns)

    def _cleanup_idle(self, name: str, state: ClusterState) -> list[int]:
        """Delete versions superseded longer than the idle timeout (llmserve.deploy.strategy.idle_versions)."""
        idle = state.load()["deployment"].get("config", {}).get("idle_timeout_s")
        if idle is None:
            return []
        default = state.load()["deployment"].get("default_version")
        deps = {int(d.metadata.labels.get(L_VERSION, 0)): d for d in self._deployments(name, VERSIONED)}
        superseded = {
            v: float(since)
            for v, d in deps.items()
            if (since := (d.metadata.annotations or {}).get(manifests.A_SUPERSEDED)) is not None
        }
        now = time.time()
        removed = []
        for v in idle_versions(set(deps), superseded, {default} if default is not None else set(), idle, now):
            self._delete_dep(deps[v].metadata.name)
            self._delete_service(deps[v].metadata.name)
            state.event(
                "idle-retired", f"v{v} retired: superseded {now - superseded[v]:.0f} s ago (idle timeout {idle:g} s)"
            )
            self.report(f"v{v} retired (idle for more than {idle:g} s)")
            removed.append(v)
        return removed

    # -- status -------------------------------------------------------------------------------
    def status(self, name: str, events: int = 15) -> ClusterStatus:
        name = dns_name(name)
        state = ClusterState(self.c, name)
        st = state.load()
        pods = self._pods(name)
        ip_version = {p.status.pod_ip: p.metadata.labels.get(L_VERSION) for p in pods if p.status.pod_ip}
        deployments = []
        for d in self._deployments(name):
            ann = d.metadata.annotations or {}
            deployments.append(
                ClusterDeploymentStatus(
                    object=d.metadata.name,
                    strategy=d.metadata.labels.get(L_STRATEGY),
                    color=d.metadata.labels.get(L_COLOR),
                    version=int(d.metadata.labels.get(L_VERSION, 0)),
                    replicas=d.spec.replicas or 0,
                    ready=d.status.ready_replicas or 0,
                    digest=ann.get(manifests.A_DIGEST),
                    package=ann.get(manifests.A_PACKAGE),
                    package_uri=ann.get(manifests.A_PACKAGE_URI),
                    rollout=ann.get(manifests.A_ROLLOUT),
                    superseded_at=float(ann[manifests.A_SUPERSEDED]) if manifests.A_SUPERSEDED in ann else None,
                )
            )
        services = []
        sel = f"{L_DEPLOYMENT}={name}"
        for svc in api_call("list Services", self.c.core.list_namespaced_service, self.ns, label_selector=sel).items:
            ep = api_call(
                "read Endpoints", self.c.core.read_namespaced_endpoints, svc.metadata.name, self.ns, not_found_ok=True
            )
            ready: dict[str, int] = {}
            not_ready = 0
            for sub in (ep.subsets or []) if ep else []:
                for a in sub.addresses or []:
                    v = ip_version.get(a.ip, "?")
                    ready[v] = ready.get(v, 0) + 1
                not_ready += len(sub.not_ready_addresses or [])
            services.append(
                ServiceStatus(
                    service=svc.metadata.name,
                    selector=svc.spec.selector,
                    cluster_ip=svc.spec.cluster_ip,
                    ready_endpoints_by_version=ready,
                    not_ready_endpoints=not_ready,
                )
            )
        open_r = state.open_rollout(st)
        holder, alive = LeaseLock(self.c, name).holder_state()
        return ClusterStatus(
            deployment=name,
            namespace=self.ns,
            context=self.c.context,
            server=self.c.server,
            model_id=st["deployment"].get("model_id"),
            strategy=st["deployment"].get("strategy"),
            default_version=st["deployment"].get("default_version"),
            config=st["deployment"].get("config", {}),
            deployments=deployments,
            services=services,
            open_rollout=_rollout_record(OpenClusterRollout, open_r, interrupted=not alive, holder=holder)
            if open_r
            else None,
            rollouts=[_rollout_record(ClusterRolloutRecord, r) for r in state.rollouts(st)[:10]],
            history=[HistoryEvent.of(e) for e in st["history"][-events:]],
            autoscaler=autoscale.describe(self, name),
        )


def _ref(value) -> tuple[str, str] | None:
    return (str(value[0]), str(value[1])) if value else None


def _key_of(dep) -> tuple[str, str] | None:
    """The Secret (name, key) a live Deployment's pods read their API key from; None: it runs open."""
    text = ((dep.metadata.annotations or {}).get(manifests.A_API_KEY) if dep is not None else None) or ""
    name, _, key = text.rpartition(":")
    return (name, key) if name else None


def _json(text: str | None) -> dict:
    import json

    try:
        return json.loads(text or "{}")
    except ValueError:
        return {}


def _rollout_record(cls: type[RecordT], r: ClusterRollout, **extra) -> RecordT:
    return cls(
        id=r.id,
        strategy=r.strategy,
        status=r.status,
        phase=r.phase,
        package=r.package,
        version=r.version,
        steps=r.steps,
        plan=r.plan,
        replicas=r.replicas,
        message=r.message,
        started=r.started,
        updated=r.updated,
        step=r.step_index + 1,
        from_=(r.from_ or {}).get("object"),
        to=(r.to or {}).get("object"),
        **extra,
    )


def _init_problems(pod) -> list[str]:
    """Lines for the init containers (the store pull) of a pod that failed or are still running."""
    out = []
    for c in pod.status.init_container_statuses or []:
        st = c.state
        if st is None:
            continue
        if st.terminated is not None and st.terminated.exit_code != 0:
            msg = (st.terminated.message or "").strip().splitlines()
            line = next((m for m in msg if m.startswith("error")), msg[-1] if msg else "")
            out.append(
                f"    init container {c.name} failed (exit {st.terminated.exit_code}, {st.terminated.reason or 'Error'})"
                + (f": {line}" if line else "")
            )
        elif st.waiting is not None and st.waiting.reason:
            out.append(f"    init container {c.name} waiting: {st.waiting.reason}")
        elif st.running is not None:
            out.append(f"    init container {c.name} running (pulling the package)")
    return out


class ClusterRollouts:
    """The Kubernetes side of the strategies (llmserve.deploy.strategy.Target): versions are Deployments,
    traffic is the ratio of ready replicas behind the Service <name> (red-black) or the Service's selector
    (versioned), the journal is the deployment's ConfigMap. One object serves one command."""

    def __init__(self, k: KubernetesDeployer, name: str, opts: DeployOptions, base: ClusterRollout | None):
        self.k = k
        self.name = name
        self.opts = opts
        self.base = base  # what the package being deployed puts in its records (None: rollback, recovery)
        self.state = ClusterState(k.c, name)
        self._main = None  # the live red-black Deployment
        self._replicas = 1

    # -- journal ------------------------------------------------------------------------------
    def begin(
        self, strategy: str, new: NewVersion, live: LiveVersion | None, steps: list[int], promote: bool | None = None
    ) -> ClusterRollout:
        assert self.base is not None  # only a deploy begins a rollout of a package
        if strategy == VERSIONED:
            self._replicas = self.k.replicas or 1
            return self.state.begin(
                replace(
                    self.base,
                    strategy=VERSIONED,
                    to={"object": f"{self.name}-v{new.version}"},
                    replicas=self._replicas,
                    promote=promote,
                )
            )
        main = self._main if live is not None else None
        old_n = (main.spec.replicas or 0) if main is not None else 0
        n = self.k.replicas or (old_n if old_n > 0 else 1)
        color = "black" if main is not None and main.metadata.labels.get(L_COLOR) == "red" else "red"
        frm = None
        if main is not None:
            ann = main.metadata.annotations or {}
            frm = {
                "object": main.metadata.name,
                "replicas": old_n,
                "version": int(main.metadata.labels.get(L_VERSION, 0)),
                "package": ann.get(manifests.A_PACKAGE),
                "digest": ann.get(manifests.A_DIGEST),
            }
        self._replicas = n
        autoscale.pause(self.k, self.name)  # the HPA out of the way of the ratio steps (follow() brings it back)
        return self.state.begin(
            replace(
                self.base,
                strategy=RED_BLACK,
                from_=frm,
                to={"object": f"{self.name}-{color}", "color": color},
                steps=steps,
                plan=replica_plan(steps, n),
                replicas=n,
            )
        )

    def journal(self, r: ClusterRollout, event: str | None = None, **changes) -> ClusterRollout:
        return self.state.journal(r.id, event=event, **changes)

    def event(self, kind: str, message: str, rollout: int | None = None) -> None:
        self.state.event(kind, message, rollout)

    def open_rollout(self) -> ClusterRollout | None:
        return self.state.open_rollout()

    def version_of(self, r: ClusterRollout) -> int:
        return r.version

    def summary(self, r: ClusterRollout | None, action: str) -> Outcome:
        # The engine adds its own fields to this (llmserve.deploy.strategy).
        status = self.k.status(self.name)
        rollout = None
        if r is not None:
            rollout = _rollout_record(ClusterRolloutRecord, r, seconds=round(r.updated - r.started, 2))
        return Outcome(deployment=status.deployment, action=action, status=status, rollout=rollout)

    def where(self) -> str:
        return f"on '{self.name}' in namespace '{self.k.ns}' ({self._replicas} replica(s))"

    def status_hint(self) -> str:
        return f"llmserve status {self.name} --target kubernetes"

    def _obj(self, r: ClusterRollout) -> str:
        return str((r.to or {}).get("object") or "")

    def _create(self, r: ClusterRollout, replicas: int) -> None:
        self.k._create_dep(self.k._render_dep(self.name, self._obj(r), r, replicas, self.opts))

    # -- red-black ----------------------------------------------------------------------------
    def live(self) -> LiveVersion | None:
        """The red-black Deployment with the most replicas (the Service <name> is made sure of first)."""
        k = self.k
        k._apply_service(k._main_service(self.name, RED_BLACK))
        lives = list(k._deployments(self.name, RED_BLACK))
        main = max(lives, key=lambda d: (d.spec.replicas or 0, d.metadata.creation_timestamp), default=None)
        for d in lives:
            if d is not main:  # a leftover of a rollout that never journaled (cannot happen after recover)
                k.report(f"removing leftover Deployment {d.metadata.name}", warning=True)
                k._delete_dep(d.metadata.name, self.opts.drain_timeout_s + 30, self.name)
        self._main = main
        if main is None:
            self._replicas = self.k.replicas or 1
            return None
        self._replicas = self.k.replicas or (main.spec.replicas or 1)
        ann = main.metadata.annotations or {}
        return LiveVersion(
            int(main.metadata.labels.get(L_VERSION, 0)),
            ann.get(manifests.A_DIGEST),
            _json(ann.get(manifests.A_INTERFACE)),
        )

    def unchanged(self, live: LiveVersion, new: NewVersion) -> bool:
        assert self._main is not None and self.base is not None
        return (
            live.digest == new.digest
            and live.version == new.version
            and (self.k.replicas is None or self.k.replicas == self._main.spec.replicas)
            and _key_of(self._main) == _ref(self.base.api_key_secret)
        )

    def steps(self, r: ClusterRollout) -> list[Step]:
        return [Step(p["percent"], f" ({p['new']}/{p['new'] + p['old']} replicas)") for p in r.plan]

    def start_new(self, r: ClusterRollout, new: NewVersion) -> float:
        obj, first = self._obj(r), r.plan[0]["new"]
        if self.k._get_dep(obj) is not None:
            self.k._delete_dep(obj, self.opts.drain_timeout_s + 30, self.name)
        self._create(r, first)
        self.journal(
            r, phase="health-check", event=f"Deployment {obj} created ({first} replica(s)); waiting for readiness"
        )
        return self.k._wait_ready(obj, self.name, r.version, first, self.opts.health_timeout_s)

    def shift(self, r: ClusterRollout, index: int) -> float:
        """The new color scaled up and its pods registered behind the Service, then the old one scaled down:
        capacity never drops below the replica count."""
        k, p, obj = self.k, r.plan[index], self._obj(r)
        k._scale(obj, p["new"])
        t0 = time.monotonic()
        k._wait_ready(obj, self.name, r.version, p["new"], self.opts.health_timeout_s)
        k._wait_endpoints(self.name, r.version, p["new"], self.opts.health_timeout_s)
        if r.from_:
            k._scale(r.from_["object"], p["old"])
        return t0

    def gate(self, r: ClusterRollout, index: int, t0: float) -> str | None:
        """Pause, watching the new color; then both colors must have their ready replicas."""
        k, p, obj = self.k, r.plan[index], self._obj(r)
        pause = self.opts.pause_s
        while True:
            ready = k._ready(obj)
            if ready is None:
                return f"Deployment {obj} disappeared"
            if 0 <= ready < p["new"]:
                return f"{obj} dropped to {ready}/{p['new']} ready replicas"
            if time.monotonic() - t0 >= pause:
                break
            time.sleep(min(0.25, max(pause, 0.01)))
        if r.from_ and p["old"] > 0:
            deadline = time.monotonic() + 10
            while True:
                old_ready = k._ready(r.from_["object"])
                if old_ready is None:
                    return f"the old Deployment {r.from_['object']} disappeared"
                if old_ready >= p["old"]:
                    break
                if time.monotonic() > deadline:
                    return f"old {r.from_['object']} has {max(old_ready, 0)}/{p['old']} ready replicas"
                time.sleep(0.25)
        return None

    def step_passed(self, r: ClusterRollout, index: int) -> None:
        """Nothing to record: the journaled plan and step say what each color has."""

    def finish_record(self, r: ClusterRollout) -> dict:
        return {}

    def finish(self, r: ClusterRollout) -> None:
        obj = self._obj(r)
        self.k._scale(obj, r.replicas)
        if r.from_ and r.from_["object"] != obj:
            self.k._delete_dep(r.from_["object"], self.opts.drain_timeout_s + 30, self.name)
        autoscale.follow(self.k, self.name)

    def old_dead_new_healthy(self, r: ClusterRollout) -> bool:
        """Never: the Deployment controller replaces dead pods of the old color, so going back stays possible."""
        return False

    def undo(self, r: ClusterRollout, reason: str) -> None:
        """The old color back to its journaled replica count (waited ready), then the new one deleted."""
        k, obj, frm = self.k, self._obj(r), r.from_
        if r.strategy == RED_BLACK and frm and frm["object"] != obj and k._get_dep(frm["object"]) is not None:
            k._scale(frm["object"], frm["replicas"])
            try:
                k._wait_ready(frm["object"], self.name, frm["version"], frm["replicas"], self.opts.health_timeout_s)
            except HealthCheckFailedError as exc:
                k.report(
                    f"warning: the old version is not fully ready again: {exc.message.splitlines()[0]}",
                    warning=True,
                )
        if obj:
            k._delete_dep(obj, self.opts.drain_timeout_s + 30, self.name, r.version)
            if r.strategy == VERSIONED:
                k._delete_service(obj)
        autoscale.follow(k, self.name)

    # -- versioned ----------------------------------------------------------------------------
    def existing(self, new: NewVersion) -> str | None:
        d = self.k._get_dep(f"{self.name}-v{new.version}")
        return None if d is None else ((d.metadata.annotations or {}).get(manifests.A_DIGEST) or "")

    def overlap(self, new: NewVersion) -> tuple[list[str], str] | None:
        serving = self.k._deployments(self.name, VERSIONED)
        if not serving:
            return None
        spec = self.k.spec
        pods = sum(d.spec.replicas or 0 for d in serving)
        req = [f"{spec.cpu} CPU", spec.memory] + ([f"{spec.gpus} GPU"] if spec.gpus else [])
        return [f"v{d.metadata.labels.get(L_VERSION, '?')}" for d in serving], (
            f"{pods} pod(s) now, each requesting {' + '.join(req)}"
        )

    def start_version(self, r: ClusterRollout, new: NewVersion) -> float:
        obj = self._obj(r)
        self._create(r, r.replicas)
        self.k._apply_service(
            manifests.service(
                namespace=self.k.ns,
                object_name=obj,
                name=self.name,
                strategy=VERSIONED,
                version=r.version,
                selector={L_DEPLOYMENT: self.name, L_STRATEGY: VERSIONED, L_VERSION: str(r.version)},
                spec=self.k.spec,
            )
        )
        self.journal(
            r,
            phase="health-check",
            event=f"Deployment and Service {obj} created; waiting for {r.replicas} ready replica(s)",
        )
        return self.k._wait_ready(obj, self.name, r.version, r.replicas, self.opts.health_timeout_s)

    def _default_version(self) -> int | None:
        return self.state.load()["deployment"].get("default_version")

    def promote_by_default(self, r: ClusterRollout) -> bool:
        if r.promote is not None:
            return r.promote
        default = self._default_version()
        return default is None or self.k._get_dep(f"{self.name}-v{default}") is None

    def _make_default(self, version: int) -> None:
        self.k._apply_service(self.k._main_service(self.name, VERSIONED, version))
        self.state.update(lambda s: s["deployment"].update(default_version=version))

    def publish(self, r: ClusterRollout, promote: bool) -> None:
        """The Service <name> points at it when promoted; older versions are marked superseded (the idle
        clock starts)."""
        if promote:
            self._make_default(r.version)
        now = str(time.time())
        for d in self.k._deployments(self.name, VERSIONED):
            if int(d.metadata.labels.get(L_VERSION, 0)) < r.version and manifests.A_SUPERSEDED not in (
                d.metadata.annotations or {}
            ):
                api_call(
                    "annotate",
                    self.k.c.apps.patch_namespaced_deployment,
                    d.metadata.name,
                    self.k.ns,
                    {"metadata": {"annotations": {manifests.A_SUPERSEDED: now}}},
                )
        autoscale.follow(self.k, self.name)

    def published_note(self, r: ClusterRollout) -> str:
        return (
            f"v{r.version} serving behind Service {self.name}-v{r.version}; "
            f"Service {self.name} goes to v{self._default_version()}"
        )

    def retire_idle(self) -> None:
        self.k._cleanup_idle(self.name, self.state)

    def retire_version(self, last: ClusterRollout, drain: bool) -> tuple[ClusterRollout, int]:
        obj = f"{self.name}-v{last.version}"
        if not [d for d in self.k._deployments(self.name, VERSIONED) if d.metadata.name != obj]:
            raise DeployInputError(
                f"v{last.version} is the only serving version of '{self.name}'",
                hint=f"Tear it down with `llmserve deploy down {self.name} --target kubernetes`.",
            )
        r = self.state.begin(
            ClusterRollout(
                id=0,
                strategy=RETIRE,
                package=last.package,
                version=last.version,
                model_id=last.model_id,
                digest=last.digest,
            )
        )
        self.complete_retire(r)
        return r, last.version

    # -- recovery -----------------------------------------------------------------------------
    def adopt_new(self, r: ClusterRollout) -> tuple[ClusterRollout, bool]:
        obj = self._obj(r)
        return r, bool(obj) and self.k._get_dep(obj) is not None

    def wait_new_ready(self, r: ClusterRollout) -> None:
        need = r.plan[max(r.step_index, 0)]["new"] if r.strategy == RED_BLACK else r.replicas
        self.k._wait_ready(self._obj(r), self.name, r.version, need, self.opts.health_timeout_s)

    def complete_retire(self, r: ClusterRollout) -> None:
        """The Service <name> moved to the newest other version if it pointed at this one, then the version's
        Deployment and Service deleted."""
        obj = f"{self.name}-v{r.version}"
        others = sorted(
            int(d.metadata.labels.get(L_VERSION, 0))
            for d in self.k._deployments(self.name, VERSIONED)
            if d.metadata.name != obj
        )
        if others and self._default_version() == r.version:
            self._make_default(others[-1])
        self.k._delete_dep(obj, self.opts.drain_timeout_s + 30, self.name, r.version)
        self.k._delete_service(obj)
        autoscale.follow(self.k, self.name)

    def close_rolled_back(self, last: ClusterRollout, by: ClusterRollout) -> None:
        self.state.journal(last.id, status=ROLLED_BACK, message=f"rolled back by #{by.id}")
