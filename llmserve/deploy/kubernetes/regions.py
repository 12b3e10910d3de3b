"""Region-by-region rollouts: one package rolled out to several Kubernetes contexts (regions), one after
another, with a gate between regions and one rollback that covers every region already moved.

    llmserve deploy dist/tiny-chat-2.llmpkg --target kubernetes --contexts eu-1,us-1,ap-1

Each region is an ordinary KubernetesDeployer deploy in its own context (and the context's namespace,
unless --namespace names one for all): red-black or versioned, gated at every step, rolled back by itself
when it fails. When a region's rollout is done, its gate watches it for --region-pause seconds:

- every Deployment of the name has its ready replicas, all along the pause (a Deployment an autoscaler
  scales up meanwhile is held to the count it had when the pause began);
- no container of the new version's pods has restarted;
- the new version's pods answered no more server errors (HTTP 5xx, failed gRPC calls) during the pause than
  --region-max-errors. The figures are scraped from each pod's /metrics at its pod IP (as `llmserve
  status` does), which answers only where the cluster network reaches: where it cannot be read, the gate
  says so in its result ("errors": null, "figures": why) and judges on readiness and restarts alone.

If a region's rollout fails (it has rolled itself back) or its gate fails, every region moved before it
(the failed one's gate included) is rolled back, newest first: KubernetesDeployer.rollback (red-black back
to the package the region served before; a versioned rollout's version retired), or `down` for a region
that had no deployment before this package. The command exits 7 with a RegionalRolloutError that names the
region that failed and the regions rolled back; `--output json` gives the error and per-region results.

Re-running the same deploy after the CLI died continues it: regions already on the package report
`unchanged` (and are gated again), an interrupted region is resumed by its own journal. Regions already on
the package count as moved by this rollout, so a later failure rolls them back too: the regions end where
they were before the package, not half on it.

Nothing is journaled across regions: each region's own journal (its ConfigMap) says what it runs.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

from llmserve.deploy.errors import DeployInputError, RolloutFailedError
from llmserve.deploy.kubernetes import manifests
from llmserve.deploy.kubernetes.cluster import L_DEPLOYMENT, L_VERSION, api_call
from llmserve.deploy.kubernetes.figures import pod_url
from llmserve.deploy.kubernetes.rollout import KubernetesDeployer
from llmserve.deploy.kubernetes.state import DONE, ClusterState
from llmserve.deploy.options import DeployOptions, rollback_options
from llmserve.deploy.status import (
    ClusterRolloutRecord,
    ClusterStatus,
    Outcome,
    RegionalOutcome,
    RegionDeploy,
    RegionDeploymentSummary,
    RegionGate,
    RegionRollback,
    RegionUndo,
    json_value,
)
from llmserve.deploy.strategy import RED_BLACK
from llmserve.errors import Detail, LLMServeError
from llmserve.metrics.snapshot import auth_headers, snapshots

DEFAULT_REGION_PAUSE_S = 30.0


def parse_contexts(text: str) -> list[str]:
    """--contexts a,b,c: distinct kubeconfig context names, in rollout order."""
    contexts = [c.strip() for c in text.split(",") if c.strip()]
    if not contexts:
        raise DeployInputError(f"--contexts '{text}': expected comma-separated kubeconfig contexts, e.g. eu-1,us-1")
    dup = sorted({c for c in contexts if contexts.count(c) > 1})
    if dup:
        raise DeployInputError(f"--contexts '{text}': {', '.join(dup)} given twice")
    return contexts


@dataclass(frozen=True)
class GateOptions:
    """The gate between regions."""

    pause_s: float = DEFAULT_REGION_PAUSE_S
    max_errors: int = 0  # server errors of the new version's pods allowed during the pause
    scrape_timeout_s: float = 2.0


class RegionalRolloutError(RolloutFailedError):
    """A region failed; the regions already moved were rolled back. Carries the per-region results."""

    code = "regional-rollout-failed"

    def __init__(self, message: str, regions: list[RegionDeploy] | list[RegionRollback], hint: str | None = None):
        rows = [[r.context, r.namespace or "-", _outcome(r)] for r in regions]
        super().__init__(message, hint, details=[Detail("regions", ["context", "namespace", "result"], rows)])
        self.regions = regions

    def to_dict(self) -> dict:
        return super().to_dict() | {"regions": json_value(self.regions)}


def _outcome(r: RegionDeploy | RegionRollback) -> str:
    out = r.result
    if isinstance(r, RegionDeploy) and r.rollback is not None:
        out += f", then {r.rollback.action}"
    if r.error:
        out += f": {r.error.splitlines()[0]}"
    return out


Connect = Callable[[str], KubernetesDeployer]


class RegionalRollout:
    """deploy / rollback over several contexts. `connect(context)` gives that context's deployer."""

    def __init__(self, connect: Connect, contexts: list[str], report=None, gate: GateOptions | None = None):
        self.connect = connect
        self.contexts = contexts
        self.report = report or (lambda msg, **kw: None)
        self.gate_opts = gate or GateOptions()

    def _connect_all(self) -> list[KubernetesDeployer]:
        """Every context resolved before anything moves (a misspelt context fails the command up front)."""
        return [self.connect(ctx) for ctx in self.contexts]

    # -- deploy -------------------------------------------------------------------------------
    def deploy(self, opts: DeployOptions) -> RegionalOutcome:
        deployers = self._connect_all()
        results = [
            RegionDeploy(context=ctx, namespace=k.ns, server=k.c.server, result="not-started")
            for ctx, k in zip(self.contexts, deployers, strict=True)
        ]
        moved: list[tuple[RegionDeploy, KubernetesDeployer]] = []
        name: str | None = None
        for i, (res, k) in enumerate(zip(results, deployers, strict=True)):
            self.report(f"region {i + 1}/{len(results)}: context '{res.context}', namespace '{k.ns}'")
            try:
                out = k.deploy(replace(opts, name=name or opts.name))
            except LLMServeError as exc:
                res.result = "failed"
                res.error = exc.message
                res.exit_code = exc.exit_code
                self._undo(moved, opts)
                raise self._failed(res, results, name, exc.hint) from exc
            name = out.deployment
            res.deployment = name
            res.result = out.action  # deployed, unchanged
            res.version = _serving_version(out)
            res.deployments = [
                RegionDeploymentSummary(
                    object=d.object,
                    version=d.version,
                    color=d.color,
                    replicas=d.replicas,
                    ready=d.ready,
                    digest=d.digest,
                )
                for d in (out.status.deployments if isinstance(out.status, ClusterStatus) else [])
            ]
            if isinstance(out.rollout, ClusterRolloutRecord | int):  # a Kubernetes deploy has no other kind
                res.rollout = out.rollout
            moved.append((res, k))
            self.report(f"region '{res.context}': {out.action}; gate: watching it {self.gate_opts.pause_s:g} s")
            gate = region_gate(k, name, res.version, self.gate_opts)
            res.gate = gate
            if gate.failed:
                res.result = "gate-failed"
                res.error = gate.failed
                self._undo(moved, opts)
                raise self._failed(res, results, name, None)
            self.report(f"region '{res.context}' passed its gate")
        return RegionalOutcome(
            deployment=name,
            action="deployed" if any(r.result == "deployed" for r in results) else "unchanged",
            regions=results,
        )

    def _failed(
        self, res: RegionDeploy, results: list[RegionDeploy], name: str | None, hint: str | None
    ) -> RegionalRolloutError:
        back = [
            r.context for r in results if r.rollback is not None and r.rollback.action in ("rolled-back", "removed")
        ]
        stuck = [r.context for r in results if r.rollback is not None and r.rollback.action == "rollback-failed"]
        msg = (
            f"region '{res.context}' {'failed its gate' if res.result == 'gate-failed' else 'failed'}: "
            f"{res.error.splitlines()[0] if res.error else ''}\n"
            + (f"rolled back: {', '.join(back)}" if back else "no other region had moved")
            + (f"; rollback FAILED in: {', '.join(stuck)}" if stuck else "")
        )
        if stuck:
            hint = (
                f"Roll those back by hand: `llmserve rollback {name} --target kubernetes --contexts {','.join(stuck)}`."
            )
        elif hint is None:
            hint = f"See each region with `llmserve status {name} --target kubernetes --context CONTEXT`."
        return RegionalRolloutError(msg, results, hint)

    def _undo(self, moved: list[tuple[RegionDeploy, KubernetesDeployer]], opts: DeployOptions) -> None:
        """Every moved region back to what it served before, newest first; one failure does not stop the others."""
        ropts = rollback_options(opts)
        for res, k in reversed(moved):
            assert res.deployment is not None  # a moved region's deploy returned its name
            self.report(f"rolling back region '{res.context}' (namespace '{k.ns}')")
            try:
                res.rollback = undo_region(k, res.deployment, ropts)
            except LLMServeError as exc:
                res.rollback = RegionUndo(action="rollback-failed", error=exc.message)
                self.report(f"rollback of region '{res.context}' failed: {exc.message}", warning=True)

    # -- rollback -----------------------------------------------------------------------------
    def rollback(self, name: str, to_version: int | None, opts: DeployOptions) -> RegionalOutcome:
        """`llmserve rollback NAME --contexts a,b,c`: every listed region rolled back (each as `llmserve
        rollback` does it); a region that fails does not stop the others; exit 7 if any failed."""
        deployers = self._connect_all()
        results: list[RegionRollback] = []
        for ctx, k in zip(self.contexts, deployers, strict=True):
            self.report(f"rolling back '{name}' in context '{ctx}' (namespace '{k.ns}')")
            try:
                out = k.rollback(name, to_version, opts)
                res = RegionRollback(
                    context=ctx,
                    namespace=k.ns,
                    server=k.c.server,
                    result=out.action,
                    version=_serving_version(out) if out.status is not None else None,
                )
            except LLMServeError as exc:
                res = RegionRollback(context=ctx, namespace=k.ns, server=k.c.server, result="failed", error=exc.message)
            results.append(res)
        failed = [r.context for r in results if r.result == "failed"]
        if failed:
            raise RegionalRolloutError(
                f"rollback of '{name}' failed in {', '.join(failed)}",
                results,
                hint="Look at each with `llmserve status NAME --target kubernetes --context CONTEXT`.",
            )
        return RegionalOutcome(deployment=name, action="rolled-back", regions=results)


def _serving_version(out: Outcome) -> int | None:
    """The version a region's deploy result serves: the rollout's, else the newest Deployment's."""
    if isinstance(out.rollout, ClusterRolloutRecord):
        return out.rollout.version
    versions = [d.version for d in out.status.deployments] if isinstance(out.status, ClusterStatus) else []
    return max(versions) if versions else None


def undo_region(k: KubernetesDeployer, name: str, opts: DeployOptions) -> RegionUndo:
    """One moved region back to what it served before its last finished rollout: `llmserve rollback` (red-black
    back to the package it replaced; a versioned rollout's version retired), or `down` where that rollout
    found nothing serving (the region had no deployment before)."""
    done = [r for r in ClusterState(k.c, name).rollouts() if r.status == DONE]
    last = done[0] if done else None
    if last is None:
        first = True
    elif last.strategy == RED_BLACK:
        first = not last.from_
    else:
        first = {d.metadata.labels.get(L_VERSION) for d in k._deployments(name)} <= {str(last.version)}
    if first:
        k.down(name, opts.drain_timeout_s)
        return RegionUndo(action="removed")
    out = k.rollback(name, None, opts)
    return RegionUndo(action="rolled-back", version=_serving_version(out))


def region_gate(k: KubernetesDeployer, name: str, version: int | None, gate: GateOptions) -> RegionGate:
    """Watch one region for gate.pause_s: every Deployment of `name` at its ready replicas all along, no
    restarts of the new version's pods, and at most gate.max_errors server errors on them (where their
    /metrics can be read). Returns the observations, with `failed` the reason or None."""
    pods = _new_pods(k, name, version)
    urls = {p.metadata.name: u for p in pods if (u := pod_url(p, "metrics") or pod_url(p))}
    headers = auth_headers(_api_key(k, name))
    failed: str | None = None
    t0 = time.monotonic()
    at_start = _replicas(k, name)
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="llmserve-region-gate") as pool:
        scrape = pool.submit(snapshots, urls, max(gate.pause_s, 0.1), gate.scrape_timeout_s, headers)
        while True:
            short = _not_ready(k, name, at_start)
            if short:
                failed = short
                break
            if time.monotonic() - t0 >= gate.pause_s and scrape.done():
                break
            time.sleep(0.25)
        figures = scrape.result() if failed is None else {}
    restarts = {p.metadata.name: n for p in _new_pods(k, name, version) if (n := sum(_restarts(p).values())) > 0}
    if restarts and failed is None:
        failed = "new pods restarted: " + ", ".join(f"{p} ({n}x)" for p, n in sorted(restarts.items()))
    read = {p: m for p, m in figures.items() if not m.get("error")}
    errors: int | None = None
    if read:
        errors = round(
            sum(
                (e.get("errors_per_s") or 0.0) * (m.get("interval_s") or 0.0)
                for m in read.values()
                for e in m["endpoints"] or []
            )
        )
        scraped = f"{len(read)}/{len(urls)} pod(s) scraped"
        if errors > gate.max_errors and failed is None:
            failed = (
                f"{errors} server error(s) on v{version} during the {gate.pause_s:g} s pause "
                f"(allowed: {gate.max_errors})"
            )
    else:
        why = next((m["error"] for m in figures.values() if m.get("error")), "no pod to scrape")
        scraped = f"unavailable: {why}" if figures or not urls else "not scraped"
    return RegionGate(
        pause_s=gate.pause_s,
        pods=len(pods),
        failed=failed,
        restarts=sum(restarts.values()),
        errors=errors,
        figures=scraped,
    )


def _new_pods(k: KubernetesDeployer, name: str, version: int | None) -> list:
    sel = f"{L_VERSION}={version}" if version is not None else ""
    return [p for p in k._pods(name, sel) if p.metadata.deletion_timestamp is None]


def _restarts(pod) -> dict[str, int]:
    statuses = list(pod.status.container_statuses or []) + list(pod.status.init_container_statuses or [])
    return {c.name: c.restart_count or 0 for c in statuses}


def _deployments(k: KubernetesDeployer, name: str) -> list:
    sel = f"{L_DEPLOYMENT}={name}"
    return api_call("list Deployments", k.c.apps.list_namespaced_deployment, k.ns, label_selector=sel).items


def _replicas(k: KubernetesDeployer, name: str) -> dict[str, int]:
    return {d.metadata.name: d.spec.replicas or 0 for d in _deployments(k, name)}


def _not_ready(k: KubernetesDeployer, name: str, at_start: dict[str, int]) -> str | None:
    """Why some Deployment of the name is short of ready replicas now; None when all are ready. A Deployment
    scaled up during the pause (by an autoscaler) is held to the count it had when the gate began: its new
    pods may take their time."""
    for d in _deployments(k, name):
        want = min(d.spec.replicas or 0, at_start.get(d.metadata.name, d.spec.replicas or 0))
        ready = d.status.ready_replicas or 0
        if ready < want:
            return f"Deployment {d.metadata.name} has {ready}/{want} ready replicas"
    return None


def _api_key(k: KubernetesDeployer, name: str) -> str | None:
    """The key the deployment's pods want on /metrics (read from its Secret), or None (open, or unreadable)."""
    import base64

    for d in k._deployments(name):
        ref = (d.metadata.annotations or {}).get(manifests.A_API_KEY) or ""
        secret, _, key = ref.rpartition(":")
        if not secret:
            continue
        try:
            s = api_call(f"read Secret {secret}", k.c.core.read_namespaced_secret, secret, k.ns, not_found_ok=True)
        except LLMServeError:
            return None
        if s is not None and key in (s.data or {}):
            return base64.b64decode(s.data[key]).decode()
    return None
