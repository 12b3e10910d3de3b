"""Red-black and versioned rollouts on a Kubernetes API.

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
from pathlib import Path

from llmserve.deploy import interface as iface
from llmserve.deploy.errors import DeployInputError, HealthCheckFailedError, InterfaceChangedError, RolloutFailedError
from llmserve.deploy.kubernetes import manifests
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
from llmserve.deploy.kubernetes.state import DONE, ROLLED_BACK, RUNNING, ClusterState, LeaseLock
from llmserve.deploy.rollout import RED_BLACK, VERSIONED, DeployOptions
from llmserve.deploy.source import PackageSource, is_reference, open_source

LOCK_WAIT_S = 120.0
RETIRE = "retire"


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

    def _render_dep(
        self, name: str, obj: str, strategy: str, rec: dict, color: str | None, replicas: int, opts: DeployOptions
    ) -> dict:
        return manifests.deployment(
            namespace=self.ns,
            object_name=obj,
            name=name,
            strategy=strategy,
            version=rec["version"],
            color=color,
            replicas=replicas,
            spec=self.spec,
            package=rec["package"],
            digest=rec["digest"],
            interface=rec["interface"],
            model_id=rec["model_id"],
            rollout=rec["id"],
            drain_timeout_s=opts.drain_timeout_s,
            health_timeout_s=opts.health_timeout_s,
            store_ref=rec.get("store_ref"),
            api_key_secret=_ref(rec.get("api_key_secret")),
            host=manifests.Hosting.parse(rec.get("host"), rec.get("openai", True)),
        )

    def _create_dep(self, body: dict) -> None:
        api_call(
            f"create Deployment {body['metadata']['name']}", self.c.apps.create_namespaced_deployment, self.ns, body
        )

    # -- entry points -------------------------------------------------------------------------
    def deploy(self, opts: DeployOptions) -> dict:
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

    def _deploy(self, opts: DeployOptions, src: PackageSource) -> dict:
        from llmserve.packaging.opened import open_package

        package = src.reference
        opened = open_package(src.path)
        m = opened.manifest
        name = dns_name(opts.name or m.modelId)
        new_iface = iface.fingerprint(opened)
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
                if recovered and recovered.get("resumed"):
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
            base = {
                "package": package,
                "store_ref": src.serve_ref if src.from_store else None,
                "digest": opened.digest,
                "version": m.modelVersion,
                "interface": new_iface,
                "model_id": m.modelId,
                "api_key_secret": list(key_ref) if key_ref else None,
                "host": str(host),
                "openai": host.openai,
            }
            try:
                if opts.strategy == VERSIONED:
                    result = self._versioned(name, state, opts, base)
                else:
                    result = self._red_black(name, state, opts, base)
            finally:
                self._prune_keys(name, state)
            if recovered:
                result["recovered"] = recovered
            return result

    def _prune_keys(self, name: str, state: ClusterState) -> None:
        """Delete the key Secrets llmserve created that no Deployment and no open rollout reads any more
        (a rotated-out key, the key of a rollout that was undone): an old key must not linger as a secret."""
        try:
            keep = {ref[0] for d in self._deployments(name) if (ref := _key_of(d))}
            if state.exists():
                open_ = [r for r in state.load()["rollouts"] if r["status"] == RUNNING]
                keep |= {str(r["api_key_secret"][0]) for r in open_ if r.get("api_key_secret")}
            gone = self.keys.remove_created(name, keep)
        except KubernetesAPIError as exc:  # best effort: never hide the rollout's own outcome
            self.report(f"unused API key Secrets not removed: {exc.message}", warning=True)
            return
        for obj in gone:
            self.report(f"removed {obj} (its key is no longer used)")

    def rollback(self, name: str, to_version: int | None = None, opts: DeployOptions | None = None) -> dict:
        opts = opts or DeployOptions(package=Path("."))
        name = dns_name(name)
        state = ClusterState(self.c, name)
        with LeaseLock(self.c, name, LOCK_WAIT_S):
            st = state.load()
            recovered = self.recover(name, resume_package=None, opts=opts)
            if recovered:
                return {"deployment": name, "action": "undid-interrupted-rollout", **recovered}
            done = [
                r for r in state.load()["rollouts"] if r["status"] == DONE and r["strategy"] in (RED_BLACK, VERSIONED)
            ]
            if not done:
                raise DeployInputError(
                    f"deployment '{name}' has no finished rollout to roll back",
                    hint=f"See its history with `llmserve status {name} --target kubernetes`.",
                )
            last = done[0]
            if last["strategy"] == VERSIONED and to_version is None:
                return self._retire(name, state, last, opts)
            target_pkg = target_digest = None
            if to_version is None:
                target_pkg = (last.get("from") or {}).get("package")
                target_digest = (last.get("from") or {}).get("digest")
            else:
                earlier = next((r for r in done if r["version"] == to_version), None)
                target_pkg, target_digest = (earlier["package"], earlier["digest"]) if earlier else (None, None)
            if not target_pkg or not (is_reference(target_pkg) or Path(target_pkg).exists()):
                raise DeployInputError(
                    f"no earlier package of '{name}' to roll back to"
                    + (f" (version {to_version})" if to_version else "")
                    + (f": {target_pkg} is gone" if target_pkg else ""),
                    hint="Deploy the package you want with `llmserve deploy PKG --target kubernetes`.",
                )
            del st
        self.report(f"rolling back '{name}' to {target_pkg} (red-black)")
        ropts = DeployOptions(
            package=target_pkg if is_reference(target_pkg) else Path(target_pkg),
            cache_dir=opts.cache_dir,
            store=opts.store,
            digest_hint=target_digest if is_reference(target_pkg) else None,
            strategy=RED_BLACK,
            name=name,
            steps=opts.steps,
            pause_s=opts.pause_s,
            health_timeout_s=opts.health_timeout_s,
            drain_timeout_s=opts.drain_timeout_s,
            serve_args=opts.serve_args,
        )
        result = self.deploy(ropts)
        result["action"] = "rolled-back"
        return result

    def down(self, name: str, drain_timeout_s: float = 30.0) -> dict:
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
            state.delete()
        self.report(f"deployment '{name}' removed from namespace '{self.ns}' ({len(removed)} object(s))")
        return {"deployment": name, "action": "removed", "removed": removed, "namespace": self.ns}

    # -- red-black ----------------------------------------------------------------------------
    def _red_black(self, name: str, state: ClusterState, opts: DeployOptions, base: dict) -> dict:
        self._apply_service(self._main_service(name, RED_BLACK))
        lives = [d for d in self._deployments(name, RED_BLACK)]
        main = max(lives, key=lambda d: (d.spec.replicas or 0, d.metadata.creation_timestamp), default=None)
        for d in lives:
            if d is not main:  # a leftover of a rollout that never journaled (cannot happen after recover)
                self.report(f"removing leftover Deployment {d.metadata.name}", warning=True)
                self._delete_dep(d.metadata.name, opts.drain_timeout_s + 30, name)
        if main is not None:
            ann = main.metadata.annotations or {}
            live_iface = _json(ann.get(manifests.A_INTERFACE))
            live_version = int(main.metadata.labels.get(L_VERSION, 0))
            diff = iface.differences(live_iface, base["interface"])
            if diff:
                raise InterfaceChangedError(
                    f"the interface of {base['model_id']} v{base['version']} differs from the live v{live_version} "
                    f"({', '.join(r[0] for r in diff)}): red-black would mix two interfaces behind one Service",
                    details=[iface.difference_detail(diff)],
                )
            if (
                ann.get(manifests.A_DIGEST) == base["digest"]
                and live_version == base["version"]
                and (self.replicas is None or self.replicas == main.spec.replicas)
                and _key_of(main) == _ref(base.get("api_key_secret"))
            ):
                self.report(f"v{base['version']} with this digest already serves '{name}': nothing to do")
                return self._summary(name, None, "unchanged")
        old_n = (main.spec.replicas or 0) if main is not None else 0
        n = self.replicas or (old_n if old_n > 0 else 1)
        steps = opts.steps if main is not None else [100]
        plan = replica_plan(steps, n)
        color = "black" if main is not None and main.metadata.labels.get(L_COLOR) == "red" else "red"
        obj = f"{name}-{color}"
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
        rec = state.begin(
            {
                "strategy": RED_BLACK,
                **base,
                "from": frm,
                "to": {"object": obj, "color": color},
                "steps": steps,
                "plan": plan,
                "replicas": n,
            }
        )
        self.report(
            f"rollout #{rec['id']}: {base['model_id']} v{base['version']} red-black on '{name}' in namespace "
            f"'{self.ns}': {n} replica(s), "
            + ", ".join(f"{p['percent']}%={p['new']}/{p['new'] + p['old']}" for p in plan)
        )
        try:
            if self._get_dep(obj) is not None:
                self._delete_dep(obj, opts.drain_timeout_s + 30, name)
            self._create_dep(self._render_dep(name, obj, RED_BLACK, rec, color, plan[0]["new"], opts))
            rec = state.journal(
                rec["id"],
                phase="health-check",
                event=f"Deployment {obj} created ({plan[0]['new']} replica(s)); waiting for readiness",
            )
            took = self._wait_ready(obj, name, base["version"], plan[0]["new"], opts.health_timeout_s)
        except HealthCheckFailedError as exc:
            self._undo(
                name, state, state.journal(rec["id"]), f"health check failed: {exc.message.splitlines()[0]}", opts
            )
            raise RolloutFailedError(
                f"rollout #{rec['id']} rolled back: {exc.message}",
                hint=(exc.hint or "") + ("; traffic stayed on the live version." if frm else ""),
            ) from exc
        self.report(f"v{base['version']} ready after {took:.1f} s")
        return self._shift(name, state, rec, opts, 0)

    def _shift(self, name: str, state: ClusterState, rec: dict, opts: DeployOptions, start: int) -> dict:
        obj = rec["to"]["object"]
        frm = rec.get("from")
        plan = rec["plan"]
        rec = state.journal(rec["id"], phase="shifting")
        for i in range(start, len(plan)):
            p = plan[i]
            rec = state.journal(
                rec["id"],
                step_index=i,
                event=f"step {i + 1}/{len(plan)}: {p['percent']}% to v{rec['version']} "
                f"({p['new']} new / {p['old']} old replica(s))",
            )
            problem = None
            try:
                self._scale(obj, p["new"])
                t0 = time.monotonic()
                self._wait_ready(obj, name, rec["version"], p["new"], opts.health_timeout_s)
                self._wait_endpoints(name, rec["version"], p["new"], opts.health_timeout_s)
                if frm:
                    self._scale(frm["object"], p["old"])
                self.report(
                    f"step {i + 1}/{len(plan)}: {p['percent']}% on v{rec['version']} "
                    f"({p['new']}/{p['new'] + p['old']} replicas)",
                    step=i + 1,
                    percent=p["percent"],
                )
                problem = self._gate(obj, frm, p, opts, t0)
            except HealthCheckFailedError as exc:
                problem = exc.message.splitlines()[0]
            if problem:
                self._undo(
                    name,
                    state,
                    state.journal(rec["id"]),
                    f"step {i + 1} ({p['percent']}%) failed its health gate: {problem}",
                    opts,
                )
                raise RolloutFailedError(
                    f"rollout #{rec['id']} rolled back at step {i + 1} ({p['percent']}%): {problem}",
                    hint=f"The old version has its replicas back; see `llmserve status {name} --target kubernetes`.",
                )
        return self._finish(name, state, state.journal(rec["id"]), opts)

    def _gate(self, obj: str, frm: dict | None, p: dict, opts: DeployOptions, t0: float) -> str | None:
        """Pause, watching the new color; then both colors must have their ready replicas."""
        while True:
            ready = self._ready(obj)
            if ready is None:
                return f"Deployment {obj} disappeared"
            if 0 <= ready < p["new"]:
                return f"{obj} dropped to {ready}/{p['new']} ready replicas"
            if time.monotonic() - t0 >= opts.pause_s:
                break
            time.sleep(min(0.25, max(opts.pause_s, 0.01)))
        if frm and p["old"] > 0:
            deadline = time.monotonic() + 10
            while True:
                old_ready = self._ready(frm["object"])
                if old_ready is None:
                    return f"the old Deployment {frm['object']} disappeared"
                if old_ready >= p["old"]:
                    break
                if time.monotonic() > deadline:
                    return f"old {frm['object']} has {max(old_ready, 0)}/{p['old']} ready replicas"
                time.sleep(0.25)
        return None

    def _finish(self, name: str, state: ClusterState, rec: dict, opts: DeployOptions) -> dict:
        obj = rec["to"]["object"]
        frm = rec.get("from")
        rec = state.journal(rec["id"], phase="finishing", event=f"100% on v{rec['version']}; removing the old version")
        self._scale(obj, rec["replicas"])
        if frm and frm["object"] != obj:
            self._delete_dep(frm["object"], opts.drain_timeout_s + 30, name)
        rec = state.journal(
            rec["id"],
            status=DONE,
            phase="done",
            event=f"rollout #{rec['id']} done: v{rec['version']} ({obj}) takes 100%",
        )
        self.report(f"rollout #{rec['id']} done: v{rec['version']} takes 100% of '{name}'")
        return self._summary(name, rec, "deployed")

    def _undo(self, name: str, state: ClusterState, rec: dict, reason: str, opts: DeployOptions) -> None:
        """Atomic rollback: the old color back to its journaled replica count (waited ready), then the new
        color deleted. Versioned: the new version's Deployment and Service deleted."""
        rec = state.journal(rec["id"], phase="rolling-back", event=f"rolling back: {reason}")
        self.report(f"rolling back rollout #{rec['id']}: {reason}")
        frm = rec.get("from")
        obj = (rec.get("to") or {}).get("object")
        if rec["strategy"] == RED_BLACK and frm and frm["object"] != obj and self._get_dep(frm["object"]) is not None:
            self._scale(frm["object"], frm["replicas"])
            try:
                self._wait_ready(frm["object"], name, frm["version"], frm["replicas"], opts.health_timeout_s)
            except HealthCheckFailedError as exc:
                self.report(
                    f"warning: the old version is not fully ready again: {exc.message.splitlines()[0]}",
                    warning=True,
                )
        if obj:
            self._delete_dep(obj, opts.drain_timeout_s + 30, name, rec["version"])
            if rec["strategy"] == VERSIONED:
                self._delete_service(obj)
        state.journal(
            rec["id"],
            status=ROLLED_BACK,
            phase="rolled-back",
            message=reason,
            event=f"rollout #{rec['id']} rolled back",
        )

    # -- versioned ----------------------------------------------------------------------------
    def _versioned(self, name: str, state: ClusterState, opts: DeployOptions, base: dict) -> dict:
        obj = f"{name}-v{base['version']}"
        existing = self._get_dep(obj)
        if existing is not None:
            if (existing.metadata.annotations or {}).get(manifests.A_DIGEST) == base["digest"]:
                self.report(f"v{base['version']} is already serving on '{name}': nothing to do")
                self._cleanup_idle(name, state)
                return self._summary(name, None, "unchanged")
            raise DeployInputError(
                f"v{base['version']} of '{base['model_id']}' already serves a different package (digest differs)",
                hint="Give the new package its own modelVersion, or replace this version with --strategy red-black.",
            )
        n = self.replicas or 1
        serving = self._deployments(name, VERSIONED)
        rec = state.begin(
            {
                "strategy": VERSIONED,
                **base,
                "from": None,
                "to": {"object": obj},
                "steps": [],
                "plan": [],
                "replicas": n,
                "promote": opts.promote,
            }
        )
        self.report(
            f"rollout #{rec['id']}: {base['model_id']} v{base['version']} versioned on '{name}' "
            f"in namespace '{self.ns}' ({n} replica(s))"
        )
        if serving:
            pods = sum(d.spec.replicas or 0 for d in serving)
            req = [f"{self.spec.cpu} CPU", self.spec.memory] + ([f"{self.spec.gpus} GPU"] if self.spec.gpus else [])
            self.report(
                f"warning: v{base['version']} runs beside {len(serving)} serving version(s) "
                f"({', '.join('v' + d.metadata.labels.get(L_VERSION, '?') for d in serving)}, {pods} pod(s)); "
                f"each pod requests {' + '.join(req)}, so the overlap costs that much more until old versions "
                "are retired (--idle-timeout, `llmserve rollback`).",
                warning=True,
            )
        try:
            self._create_dep(self._render_dep(name, obj, VERSIONED, rec, None, n, opts))
            self._apply_service(
                manifests.service(
                    namespace=self.ns,
                    object_name=obj,
                    name=name,
                    strategy=VERSIONED,
                    version=base["version"],
                    selector={L_DEPLOYMENT: name, L_STRATEGY: VERSIONED, L_VERSION: str(base["version"])},
                    spec=self.spec,
                )
            )
            rec = state.journal(
                rec["id"],
                phase="health-check",
                event=f"Deployment and Service {obj} created; waiting for {n} ready replica(s)",
            )
            took = self._wait_ready(obj, name, base["version"], n, opts.health_timeout_s)
        except HealthCheckFailedError as exc:
            self._undo(
                name, state, state.journal(rec["id"]), f"health check failed: {exc.message.splitlines()[0]}", opts
            )
            raise RolloutFailedError(f"rollout #{rec['id']} rolled back: {exc.message}", hint=exc.hint) from exc
        self.report(f"v{base['version']} ready after {took:.1f} s")
        return self._publish(name, state, rec, opts)

    def _publish(self, name: str, state: ClusterState, rec: dict, opts: DeployOptions) -> dict:
        version = rec["version"]
        st = state.load()
        default = st["deployment"].get("default_version")
        promote = rec.get("promote")
        if promote is None:
            promote = default is None or self._get_dep(f"{name}-v{default}") is None
        rec = state.journal(
            rec["id"], phase="publishing", event=f"v{version} routable" + (" and the default" if promote else "")
        )
        if promote:
            self._apply_service(self._main_service(name, VERSIONED, version))
            state.update(lambda s: s["deployment"].update(default_version=version))
        now = str(time.time())
        for d in self._deployments(name, VERSIONED):
            if int(d.metadata.labels.get(L_VERSION, 0)) < version and manifests.A_SUPERSEDED not in (
                d.metadata.annotations or {}
            ):
                api_call(
                    "annotate",
                    self.c.apps.patch_namespaced_deployment,
                    d.metadata.name,
                    self.ns,
                    {"metadata": {"annotations": {manifests.A_SUPERSEDED: now}}},
                )
        rec = state.journal(
            rec["id"], status=DONE, phase="done", event=f"rollout #{rec['id']} done: v{version} serving"
        )
        default = state.load()["deployment"].get("default_version")
        self.report(f"v{version} serving behind Service {name}-v{version}; Service {name} goes to v{default}")
        self._cleanup_idle(name, state)
        return self._summary(name, rec, "deployed")

    def _cleanup_idle(self, name: str, state: ClusterState) -> list[int]:
        """Delete versions superseded longer than the idle timeout; never the newest, never the default."""
        st = state.load()
        idle = st["deployment"].get("config", {}).get("idle_timeout_s")
        if idle is None:
            return []
        default = st["deployment"].get("default_version")
        deps = self._deployments(name, VERSIONED)
        if not deps:
            return []
        newest = max(int(d.metadata.labels.get(L_VERSION, 0)) for d in deps)
        removed = []
        for d in deps:
            v = int(d.metadata.labels.get(L_VERSION, 0))
            since = (d.metadata.annotations or {}).get(manifests.A_SUPERSEDED)
            if v in (newest, default) or since is None or time.time() - float(since) < idle:
                continue
            self._delete_dep(d.metadata.name)
            self._delete_service(d.metadata.name)
            state.event(
                "idle-retired",
                f"v{v} retired: superseded {time.time() - float(since):.0f} s ago (idle timeout {idle:g} s)",
            )
            self.report(f"v{v} retired (idle for more than {idle:g} s)")
            removed.append(v)
        return removed

    def _retire(self, name: str, state: ClusterState, last: dict, opts: DeployOptions) -> dict:
        version = last["version"]
        obj = f"{name}-v{version}"
        others = sorted(
            int(d.metadata.labels.get(L_VERSION, 0))
            for d in self._deployments(name, VERSIONED)
            if d.metadata.name != obj
        )
        if not others:
            raise DeployInputError(
                f"v{version} is the only serving version of '{name}'",
                hint=f"Tear it down with `llmserve deploy down {name} --target kubernetes`.",
            )
        rec = state.begin(
            {
                "strategy": RETIRE,
                "package": last["package"],
                "digest": last["digest"],
                "version": version,
                "model_id": last["model_id"],
                "interface": {},
                "from": None,
                "to": None,
                "steps": [],
                "plan": [],
                "replicas": 0,
            }
        )
        if state.load()["deployment"].get("default_version") == version:
            self._apply_service(self._main_service(name, VERSIONED, others[-1]))
            state.update(lambda s: s["deployment"].update(default_version=others[-1]))
        self._delete_dep(obj, opts.drain_timeout_s + 30, name, version)
        self._delete_service(obj)
        state.journal(rec["id"], status=DONE, phase="done", event=f"v{version} retired")

        def m(st):
            for r in st["rollouts"]:
                if r["id"] == last["id"]:
                    r["status"] = ROLLED_BACK
                    r["message"] = f"rolled back by #{rec['id']}"

        state.update(m)
        return {**self._summary(name, state.journal(rec["id"]), "rolled-back"), "retired_version": version}

    # -- recovery -----------------------------------------------------------------------------
    def recover(self, name: str, *, resume_package: str | None, opts: DeployOptions) -> dict | None:
        """Finish or undo a rollout whose CLI died (we hold the lease, so its owner is gone).
        finishing -> finish; same package asked again and the new pods still there -> resume at the
        journaled step; anything else -> roll back to the journaled state."""
        state = ClusterState(self.c, name)
        r = state.open_rollout()
        if r is None:
            return None
        state.event(
            "interrupted",
            f"rollout #{r['id']} ({r['strategy']}) was interrupted in phase '{r['phase']}' "
            f"at step {r['step_index'] + 1}; recovering",
            r["id"],
        )
        self.report(
            f"found interrupted rollout #{r['id']} ({r['strategy']}, phase {r['phase']}, step {r['step_index'] + 1})"
        )
        obj = (r.get("to") or {}).get("object")
        if r["strategy"] == RETIRE:
            state.journal(r["id"], status=DONE, phase="done", event=f"retire #{r['id']} completed on recovery")
            ver = r["version"]
            self._delete_dep(f"{name}-v{ver}")
            self._delete_service(f"{name}-v{ver}")
            return {"rollout": r["id"], "recovered": "completed", "resumed": False}
        if r["phase"] in ("finishing", "publishing"):
            if r["strategy"] == RED_BLACK:
                self._finish(name, state, r, opts)
            else:
                self._publish(name, state, r, opts)
            return {"rollout": r["id"], "recovered": "completed", "resumed": False}
        if resume_package is not None and r["package"] == resume_package and obj and self._get_dep(obj) is not None:
            step = max(r["step_index"], 0)
            need = r["plan"][step]["new"] if r["strategy"] == RED_BLACK else r["replicas"]
            try:
                self._wait_ready(obj, name, r["version"], need, opts.health_timeout_s)
            except HealthCheckFailedError as exc:
                self._undo(name, state, r, f"interrupted rollout not healthy: {exc.message.splitlines()[0]}", opts)
                return {"rollout": r["id"], "recovered": "rolled-back", "resumed": False}
            self.report(f"resuming rollout #{r['id']} at step {step + 1}")
            state.event("resumed", f"rollout #{r['id']} resumed at step {step + 1}", r["id"])
            if r["strategy"] == VERSIONED:
                out = self._publish(name, state, r, opts)
            else:
                out = self._shift(name, state, r, opts, step)
            return {**out, "recovered": "resumed", "resumed": True, "rollout": r["id"]}
        self._undo(name, state, r, "interrupted rollout (its CLI stopped)", opts)
        return {"rollout": r["id"], "recovered": "rolled-back", "resumed": False}

    # -- status -------------------------------------------------------------------------------
    def _summary(self, name: str, rec: dict | None, action: str) -> dict:
        out = self.status(name)
        out["action"] = action
        if rec is not None:
            out["rollout"] = _rollout_dict(rec) | {"seconds": round(rec["updated"] - rec["started"], 2)}
        return out

    def status(self, name: str, events: int = 15) -> dict:
        name = dns_name(name)
        state = ClusterState(self.c, name)
        st = state.load()
        pods = self._pods(name)
        ip_version = {p.status.pod_ip: p.metadata.labels.get(L_VERSION) for p in pods if p.status.pod_ip}
        deployments = []
        for d in self._deployments(name):
            ann = d.metadata.annotations or {}
            deployments.append(
                {
                    "object": d.metadata.name,
                    "strategy": d.metadata.labels.get(L_STRATEGY),
                    "color": d.metadata.labels.get(L_COLOR),
                    "version": int(d.metadata.labels.get(L_VERSION, 0)),
                    "replicas": d.spec.replicas or 0,
                    "ready": d.status.ready_replicas or 0,
                    "digest": ann.get(manifests.A_DIGEST),
                    "package": ann.get(manifests.A_PACKAGE),
                    "package_uri": ann.get(manifests.A_PACKAGE_URI),
                    "rollout": ann.get(manifests.A_ROLLOUT),
                    "superseded_at": float(ann[manifests.A_SUPERSEDED]) if manifests.A_SUPERSEDED in ann else None,
                }
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
                {
                    "service": svc.metadata.name,
                    "selector": svc.spec.selector,
                    "cluster_ip": svc.spec.cluster_ip,
                    "ready_endpoints_by_version": ready,
                    "not_ready_endpoints": not_ready,
                }
            )
        open_r = state.open_rollout(st)
        holder, alive = LeaseLock(self.c, name).holder_state()
        return {
            "target": "kubernetes",
            "deployment": name,
            "namespace": self.ns,
            "context": self.c.context,
            "server": self.c.server,
            "model_id": st["deployment"].get("model_id"),
            "strategy": st["deployment"].get("strategy"),
            "default_version": st["deployment"].get("default_version"),
            "config": st["deployment"].get("config", {}),
            "deployments": deployments,
            "services": services,
            "open_rollout": (_rollout_dict(open_r) | {"interrupted": not alive, "holder": holder}) if open_r else None,
            "rollouts": [_rollout_dict(r) for r in st["rollouts"][:10]],
            "history": st["history"][-events:],
        }


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


def _rollout_dict(r: dict) -> dict:
    return {
        k: r.get(k)
        for k in (
            "id",
            "strategy",
            "status",
            "phase",
            "package",
            "version",
            "steps",
            "plan",
            "replicas",
            "message",
            "started",
            "updated",
        )
    } | {
        "step": r.get("step_index", -1) + 1,
        "from": (r.get("from") or {}).get("object"),
        "to": (r.get("to") or {}).get("object"),
    }


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
