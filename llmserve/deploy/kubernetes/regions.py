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

Every regional rollout is journaled across regions (llmserve.deploy.kubernetes.region_journal: a record in
ConfigMap <name>-llmserve-regions of the first context, written before each region changes and after each of
its phases): for each region, what it served before this rollout reached it, and how far the rollout got there.

If a region's rollout fails (it has rolled itself back) or its gate fails, every region this rollout moved
(the failed one's gate included) is put back to its before-state, newest first: KubernetesDeployer.rollback
(red-black back to the package it served before; a versioned rollout's version retired), or `down` for a
region that had no deployment before. A region that already served the package before this rollout began is
not moved by it and stays. The command exits 7 with a RegionalRolloutError that names the region that failed
and the regions rolled back; `--output json` gives the error and per-region results. The record is closed
(rolled-back), or left `failed` while some region could not be rolled back.

After the CLI died (`kill -9`, a lost machine) the record is still open:
- the same deploy (same package, same --contexts) continues it: regions that passed their gate stay done, a
  region in the middle of its rollout resumes through its own journal, the rest follow;
- `llmserve rollback NAME --contexts ...` undoes exactly the regions the record says this rollout moved, newest
  first, each to its recorded before-state (undo_to_before judges by what the region runs now, so a re-run of
  an interrupted rollback does no harm, and a region someone changed since is left alone, with an error), then
  closes the record; regions it never reached are reported `untouched`. Without an open record,
  `rollback --contexts` rolls every listed region back, each as `llmserve rollback` does;
- a deploy of another package, or over other contexts, is refused (exit 8) until one of the two is done.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

from llmserve.deploy.errors import DeployInputError, DeploymentNotFoundError, RolloutFailedError
from llmserve.deploy.kubernetes import manifests
from llmserve.deploy.kubernetes import region_journal as rj
from llmserve.deploy.kubernetes.cluster import L_DEPLOYMENT, L_VERSION, api_call, dns_name
from llmserve.deploy.kubernetes.figures import pod_url
from llmserve.deploy.kubernetes.region_journal import BeforeState, JournalStore, RegionalRecord, ServedVersion
from llmserve.deploy.kubernetes.rollout import KubernetesDeployer
from llmserve.deploy.kubernetes.state import DONE, ClusterState, holder_host_pid
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
from llmserve.deploy.strategy import RED_BLACK, VERSIONED
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
Journal = Callable[[KubernetesDeployer], JournalStore]  # the store a context keeps the cross-region journal in


@dataclass(frozen=True)
class PackageIdentity:
    """What a regional rollout rolls out, known before any region changes."""

    name: str  # the deployment's name in every region
    reference: str
    digest: str | None  # None only for an unpacked source folder
    version: int
    # a store reference's archive digest, as resolved once: every region deploys that build, even if the
    # reference's tag moves during the rollout
    store_digest: str | None = None


def identify_package(opts: DeployOptions) -> PackageIdentity:
    """The package of `opts` opened once (a store reference is pulled into the cache the regions then use)."""
    from llmserve.deploy.source import open_source
    from llmserve.packaging.opened import open_package

    with open_source(
        opts.package, cache_dir=opts.cache_dir, store_options=opts.store, digest_hint=opts.digest_hint
    ) as src:
        opened = open_package(src.path)
        m = opened.manifest
        return PackageIdentity(
            dns_name(opts.name or m.modelId), src.reference, opened.digest, m.modelVersion, src.store_digest
        )


class RegionalRollout:
    """deploy / rollback over several contexts. `connect(context)` gives that context's deployer; `journal(k)`
    the store of the cross-region journal in k's context (region_journal). Without a journal nothing is
    recorded across regions: a re-run cannot tell a region this rollout moved from one already on the package."""

    def __init__(
        self,
        connect: Connect,
        contexts: list[str],
        report=None,
        gate: GateOptions | None = None,
        journal: Journal | None = None,
    ):
        self.connect = connect
        self.contexts = contexts
        self.report = report or (lambda msg, **kw: None)
        self.gate_opts = gate or GateOptions()
        self.journal = journal

    def _connect_all(self) -> list[KubernetesDeployer]:
        """Every context resolved before anything moves (a misspelt context fails the command up front)."""
        return [self.connect(ctx) for ctx in self.contexts]

    # -- the cross-region journal ---------------------------------------------------------------
    def _find_open(self, deployers: list[KubernetesDeployer], name: str) -> tuple[int, RegionalRecord | None]:
        """(index of the context whose journal holds the open regional rollout of `name`, that record); (0, None)
        when none is open: a new one is journaled in the first context."""
        assert self.journal is not None
        for i, k in enumerate(deployers):
            rec = next((r for r in self.journal(k).load(name) if r.is_open), None)
            if rec is not None:
                return i, rec
        return 0, None

    def _save(self, store: JournalStore, rec: RegionalRecord) -> None:
        rec.updated = time.time()
        rec.cli = holder_host_pid()

        def put(records: list[RegionalRecord]) -> None:
            at = next((i for i, r in enumerate(records) if r.id == rec.id), None)
            if at is None:
                records.insert(0, rec)
            else:
                records[at] = rec

        store.update(rec.deployment, put)

    # -- deploy -------------------------------------------------------------------------------
    def deploy(self, opts: DeployOptions) -> RegionalOutcome:
        deployers = self._connect_all()
        if self.journal is None:
            return self._run(deployers, opts, None)
        pkg = identify_package(opts)
        at, _ = self._find_open(deployers, pkg.name)
        store = self.journal(deployers[at])
        with store.lock(pkg.name):
            rec = next((r for r in store.load(pkg.name) if r.is_open), None)  # again, now that the lock is held
            if rec is not None:
                where = self.contexts[at]
                if (rec.digest, rec.digest or rec.package) != (pkg.digest, pkg.digest or pkg.reference):
                    raise rj.refuse_open(rec, where, f"it rolls out {rec.package}, not {opts.package}")
                if rec.contexts != self.contexts:
                    raise rj.refuse_open(rec, where, f"it is over --contexts {','.join(rec.contexts)}")
                self.report(f"continuing regional rollout #{rec.id} of '{rec.deployment}' ({rec.summary()})")
                rec.status = rj.RUNNING
            else:
                now = time.time()
                rec = RegionalRecord(
                    id=max((r.id for r in store.load(pkg.name)), default=0) + 1,
                    deployment=pkg.name,
                    package=pkg.reference,
                    digest=pkg.digest,
                    version=pkg.version,
                    strategy=opts.strategy,
                    regions=[
                        rj.RegionEntry(context=c, namespace=k.ns) for c, k in zip(self.contexts, deployers, strict=True)
                    ],
                    started=now,
                )
                self.report(
                    f"regional rollout #{rec.id}: journal in context '{self.contexts[0]}' (namespace '{deployers[0].ns}')"
                )
            self._save(store, rec)
            pinned = replace(opts, name=pkg.name, digest_hint=pkg.store_digest or opts.digest_hint)
            return self._run(deployers, pinned, (store, rec))

    def _run(
        self,
        deployers: list[KubernetesDeployer],
        opts: DeployOptions,
        journaled: tuple[JournalStore, RegionalRecord] | None,
    ) -> RegionalOutcome:
        store, rec = journaled if journaled else (None, None)

        def phase(ctx: str, value: str, **changes) -> None:
            if store is not None and rec is not None:
                rec.set_phase(ctx, value, **changes)
                self._save(store, rec)

        results = [
            RegionDeploy(context=ctx, namespace=k.ns, server=k.c.server, result="not-started")
            for ctx, k in zip(self.contexts, deployers, strict=True)
        ]
        moved: list[tuple[RegionDeploy, KubernetesDeployer]] = []
        name: str | None = opts.name if rec is not None else None
        for i, (res, k) in enumerate(zip(results, deployers, strict=True)):
            entry = rec.regions[i] if rec is not None else None
            if entry is not None and entry.phase == rj.GATED:  # done in an earlier run: it stays done
                res.deployment, res.version, res.rollout = name, rec.version if rec else None, entry.rollout
                res.result = "deployed" if entry.changed else "unchanged"
                if entry.changed:
                    moved.append((res, k))
                self.report(f"region {i + 1}/{len(results)}: '{res.context}' passed its gate in an earlier run")
                continue
            self.report(f"region {i + 1}/{len(results)}: context '{res.context}', namespace '{k.ns}'")
            if entry is not None:
                assert name is not None
                # what the region served before this rollout: written before it changes, kept across re-runs
                phase(res.context, rj.ROLLING, before=entry.before or region_before(k, name), error=None)
            try:
                out = k.deploy(replace(opts, name=name or opts.name))
            except LLMServeError as exc:
                res.result = "failed"
                res.error = exc.message
                res.exit_code = exc.exit_code
                phase(res.context, rj.FAILED, error=exc.message)
                self._undo(moved, opts, journaled)
                raise self._failed(res, results, name, exc.hint) from exc
            name = out.deployment
            _fill(res, out)
            changed = True
            if entry is not None and entry.before is not None:
                # a region that already served the package before this rollout is not moved by it
                changed = {(s.version, s.digest) for s in served(k, name)} != entry.before.key()
                rid = res.rollout.id if isinstance(res.rollout, ClusterRolloutRecord) else res.rollout
                phase(res.context, rj.MOVED, changed=changed, rollout=rid)
            if changed:
                moved.append((res, k))
            self.report(f"region '{res.context}': {out.action}; gate: watching it {self.gate_opts.pause_s:g} s")
            gate = region_gate(k, name, res.version, self.gate_opts)
            res.gate = gate
            if gate.failed:
                res.result = "gate-failed"
                res.error = gate.failed
                phase(res.context, rj.FAILED, error=gate.failed)
                if not changed:  # already on the package: its undo finds nothing to do, but says so
                    moved.append((res, k))
                self._undo(moved, opts, journaled)
                raise self._failed(res, results, name, None)
            phase(res.context, rj.GATED)
            self.report(f"region '{res.context}' passed its gate")
        if store is not None and rec is not None:
            rec.status = rj.DONE
            self._save(store, rec)
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

    def _undo(
        self,
        moved: list[tuple[RegionDeploy, KubernetesDeployer]],
        opts: DeployOptions,
        journaled: tuple[JournalStore, RegionalRecord] | None,
    ) -> None:
        """Every moved region back to what it served before, newest first; one failure does not stop the others.
        Journaled: each back to its recorded before-state, and the record closed (failed while one is stuck)."""
        ropts = rollback_options(opts)
        for res, k in reversed(moved):
            assert res.deployment is not None  # a moved region's deploy returned its name
            self.report(f"rolling back region '{res.context}' (namespace '{k.ns}')")
            try:
                if journaled is None:
                    res.rollback = undo_region(k, res.deployment, ropts)
                    continue
                store, rec = journaled
                entry = rec.region(res.context)
                assert entry.before is not None  # written before the region changed
                res.rollback = undo_to_before(k, res.deployment, entry.before, rec.digest, ropts)
                rec.set_phase(res.context, rj.ROLLED_BACK)
            except LLMServeError as exc:
                res.rollback = RegionUndo(action="rollback-failed", error=exc.message)
                self.report(f"rollback of region '{res.context}' failed: {exc.message}", warning=True)
                if journaled is not None:
                    journaled[1].set_phase(res.context, rj.ROLLBACK_FAILED, error=exc.message)
            if journaled is not None:
                self._save(*journaled)
        if journaled is not None:
            store, rec = journaled
            stuck = [r.context for r in rec.regions if r.phase == rj.ROLLBACK_FAILED]
            rec.status = rj.FAILED if stuck else rj.ROLLED_BACK
            self._save(store, rec)

    # -- rollback -----------------------------------------------------------------------------
    def rollback(self, name: str, to_version: int | None, opts: DeployOptions) -> RegionalOutcome:
        """`llmserve rollback NAME --contexts a,b,c`. With an open (or failed) regional rollout of NAME in the
        journal: exactly the regions it moved, newest first, each back to its before-state; the record closed.
        Otherwise every listed region rolled back (each as `llmserve rollback` does it). A region that fails
        does not stop the others; exit 7 if any failed."""
        deployers = self._connect_all()
        if self.journal is not None:
            at, rec = self._find_open(deployers, dns_name(name))
            if rec is not None:
                if to_version is not None:
                    raise DeployInputError(
                        f"regional rollout #{rec.id} of '{rec.deployment}' is open ({rec.summary()}): "
                        "--to-version does not apply",
                        hint="Undo it first with the same command without --to-version.",
                    )
                return self._rollback_journaled(deployers, at, rec.deployment, opts)
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
        return self._rolled_back(name, results)

    def _rollback_journaled(
        self, deployers: list[KubernetesDeployer], at: int, name: str, opts: DeployOptions
    ) -> RegionalOutcome:
        assert self.journal is not None
        store = self.journal(deployers[at])
        by_ctx = dict(zip(self.contexts, deployers, strict=True))
        with store.lock(name):
            rec = next((r for r in store.load(name) if r.is_open), None)
            if rec is None:  # closed meanwhile by another CLI
                raise DeploymentNotFoundError(f"the regional rollout of '{name}' was closed meanwhile")
            todo = [e for e in reversed(rec.regions) if e.maybe_moved]
            missing = [e.context for e in todo if e.context not in by_ctx]
            if missing:
                raise rj.refuse_open(rec, self.contexts[at], f"it moved {', '.join(missing)}, not named by --contexts")
            self.report(f"undoing regional rollout #{rec.id} of '{name}' ({rec.summary()})")
            done: dict[str, RegionRollback] = {}
            for entry in todo:
                k = by_ctx[entry.context]
                assert entry.before is not None  # written with phase rolling, before the region changed
                self.report(f"region '{entry.context}': back to {entry.before.describe()}")
                res = RegionRollback(context=entry.context, namespace=k.ns, server=k.c.server, result="failed")
                try:
                    undo = undo_to_before(k, name, entry.before, rec.digest, opts)
                    res.result, res.version = undo.action, undo.version
                    rec.set_phase(entry.context, rj.ROLLED_BACK, error=None)
                except LLMServeError as exc:
                    res.error = exc.message
                    rec.set_phase(entry.context, rj.ROLLBACK_FAILED, error=exc.message)
                self._save(store, rec)
                done[entry.context] = res
            stuck = [r.context for r in rec.regions if r.phase == rj.ROLLBACK_FAILED]
            rec.status = rj.FAILED if stuck else rj.ROLLED_BACK
            rec.message = "rolled back by `llmserve rollback --contexts`"
            self._save(store, rec)
        results = [done.get(ctx) or _not_undone(rec, ctx, k) for ctx, k in by_ctx.items()]
        cm = f"{rj.journal_name(name)} -n {deployers[at].ns} --context {self.contexts[at]}"
        return self._rolled_back(name, results, cm)

    def _rolled_back(self, name: str, results: list[RegionRollback], journal: str | None = None) -> RegionalOutcome:
        """`journal`: where the record stays open (failed) meanwhile, as a kubectl argument."""
        failed = [r.context for r in results if r.result == "failed"]
        if failed:
            hint = "Look at each with `llmserve status NAME --target kubernetes --context CONTEXT`."
            if journal:
                # the only way out where a region cannot go back by itself (its deployment deleted by hand...)
                hint += (
                    " Run this rollback again once fixed; or, with every region as it should be, drop the open "
                    f"record: `kubectl delete configmap {journal}`."
                )
            raise RegionalRolloutError(f"rollback of '{name}' failed in {', '.join(failed)}", results, hint=hint)
        return RegionalOutcome(deployment=name, action="rolled-back", regions=results)


def _not_undone(rec: RegionalRecord, ctx: str, k: KubernetesDeployer) -> RegionRollback:
    """A listed region the journaled rollback left alone: rolled back by an earlier run, or never moved."""
    entry = next((e for e in rec.regions if e.context == ctx), None)
    res = RegionRollback(context=ctx, namespace=k.ns, server=k.c.server, result="untouched")
    if entry is not None and entry.phase == rj.ROLLED_BACK and entry.before is not None:
        res.result = "rolled-back"
        res.version = max((s.version for s in entry.before.serving), default=None)
    return res


def _fill(res: RegionDeploy, out: Outcome) -> None:
    """A region's result from its deploy's outcome."""
    res.deployment = out.deployment
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


def served(k: KubernetesDeployer, name: str) -> list[ServedVersion]:
    """The Deployments of `name` a region runs with replicas."""
    out = []
    for d in _deployments(k, name):
        if (d.spec.replicas or 0) > 0:
            ann = d.metadata.annotations or {}
            out.append(
                ServedVersion(
                    object=d.metadata.name,
                    version=int((d.metadata.labels or {}).get(L_VERSION, 0)),
                    digest=ann.get(manifests.A_DIGEST),
                    package=ann.get(manifests.A_PACKAGE),
                    replicas=d.spec.replicas,
                )
            )
    return out


def region_before(k: KubernetesDeployer, name: str) -> BeforeState:
    """What a region serves now, and how far its own journal goes, before a regional rollout changes it."""
    try:
        last = max((r.id for r in ClusterState(k.c, name).rollouts()), default=0)
    except DeploymentNotFoundError:
        last = 0
    return BeforeState(last_rollout=last, serving=served(k, name))


def undo_to_before(
    k: KubernetesDeployer, name: str, before: BeforeState, digest: str | None, opts: DeployOptions
) -> RegionUndo:
    """One region back to its before-state, judged by what it runs now, so that running it twice (a rollback
    re-run after the CLI died) does no harm: an interrupted rollout of its own is undone first; a region that
    serves its before-state again needs nothing; one that had nothing is taken down; otherwise its last
    finished rollout is reversed (`llmserve rollback`), but only where that rollout is this regional rollout's
    (newer than the region's journal was then, of the package's digest): a region changed by anyone since is
    left alone, with an error saying what it served before."""
    state = ClusterState(k.c, name)
    if not state.exists():
        if not before.serving:
            return RegionUndo(action="nothing-to-undo")
        raise RolloutFailedError(
            f"deployment '{name}' is gone from namespace '{k.ns}'; it served {before.describe()} before",
            hint="Deploy that package there again by hand (`llmserve deploy PKG --target kubernetes --context ...`).",
        )
    undid = False
    if state.open_rollout() is not None:
        k.rollback(name, None, opts)  # an interrupted rollout is undone, nothing more
        undid = True
    now = {(s.version, s.digest) for s in served(k, name)}
    if now == before.key():
        version = max((v for v, _ in now), default=None)
        return (
            RegionUndo(action="rolled-back", version=version)
            if undid
            else RegionUndo(action="nothing-to-undo", version=version)
        )
    if not before.serving:
        k.down(name, opts.drain_timeout_s)
        return RegionUndo(action="removed")
    done = [r for r in state.rollouts() if r.status == DONE and r.strategy in (RED_BLACK, VERSIONED)]
    last = done[0] if done else None
    if last is None or last.id <= before.last_rollout or last.digest != digest:
        since = f" (its last rollout is #{last.id}, of {last.package})" if last is not None else ""
        raise RolloutFailedError(
            f"deployment '{name}' in namespace '{k.ns}' changed after this regional rollout moved it{since}: "
            f"not rolled back; it served {before.describe()} before",
            hint=f"Look at it with `llmserve status {name} --target kubernetes --context CONTEXT` and roll it back by hand.",
        )
    k.rollback(name, None, opts)
    return RegionUndo(action="rolled-back", version=max((s.version for s in served(k, name)), default=None))


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
