"""The local target's rollouts: `llmserve deploy` / `rollback` / `deploy down` / `status` for servers
behind a deployment's gateway, on the strategies of llmserve.deploy.strategy.

Every action is journaled before it is taken (llmserve.deploy.state): the rollout row says what the
CLI is about to do and which routing table was the last good one, so the next command can finish or
undo a rollout whose CLI was killed. All changes hold the deployment's flock.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

from llmserve.deploy import interface as iface
from llmserve.deploy import local_keys, procs
from llmserve.deploy.errors import DeployInputError
from llmserve.deploy.hosting import HostChoice
from llmserve.deploy.local_target import LocalTarget, without
from llmserve.deploy.options import LOCK_WAIT_S, DeployOptions, rollback_options
from llmserve.deploy.source import PackageSource, is_reference, open_source, reference_model_id
from llmserve.deploy.state import (
    DONE,
    DRAINING,
    FAILED,
    ROLLED_BACK,
    SERVING,
    STARTING,
    Deployment,
    DeploymentLock,
    Instance,
    Member,
    Rollout,
    Routes,
    StateStore,
)
from llmserve.deploy.status import (
    GatewayStatus,
    HistoryEvent,
    InstanceStatus,
    LocalStatus,
    LocalTeardown,
    Outcome,
    Recovery,
    RolloutRecord,
    RoutesStatus,
)
from llmserve.deploy.strategy import (
    FINISHING,
    RED_BLACK,
    RETIRE,
    VERSIONED,
    LiveVersion,
    NewVersion,
    Rollouts,
    Step,
)


class Deployer:
    """deploy / rollback / down / recover on the local target: the shared strategies
    (llmserve.deploy.strategy) over servers behind the deployment's gateway."""

    def __init__(self, store: StateStore, report=None):
        self.store = store
        self.report = report or (lambda msg, **kw: None)
        self.target = LocalTarget(store, self.report)

    # -- entry points -------------------------------------------------------------------------
    def deploy(self, opts: DeployOptions) -> Outcome:
        # A store reference is pulled (or found) in the store cache and leased before anything changes:
        # a store error fails the command here, with the current version still serving.
        with self._source(opts) as src:
            opts = replace(
                opts,
                serve_package=src.serve_ref,
                serve_args=[*opts.serve_args, *src.serve_args()],
            )
            return self._deploy(opts, src)

    def _source(self, opts: DeployOptions) -> PackageSource:
        cache_dir = opts.cache_dir
        name = opts.name or reference_model_id(str(opts.package))
        if cache_dir is None and name and is_reference(opts.package):
            dep = self.store.deployment(name)
            if dep is not None and dep.config.get("store_cache"):
                cache_dir = Path(dep.config["store_cache"])
        return open_source(
            opts.package,
            cache_dir=cache_dir,
            store_options=opts.store,
            digest_hint=opts.digest_hint,
            report=self.report,
        )

    def _rollouts(self, dep: Deployment, opts: DeployOptions, opened=None) -> Rollouts[Rollout]:
        return Rollouts(LocalRollouts(self.target, dep, opts, opened), self.report)

    def _deploy(self, opts: DeployOptions, src: PackageSource) -> Outcome:
        from llmserve.packaging.opened import open_package

        package = src.reference
        opened = open_package(src.path)  # verifies and unpacks once, so the servers start from the cache
        m = opened.manifest
        name = opts.name or m.modelId
        _check_local_hosting(m)
        new = NewVersion(m.modelId, m.modelVersion, opened.digest, package, iface.fingerprint(opened))
        with DeploymentLock(self.store, name, LOCK_WAIT_S):
            dep = self.store.deployment(name)
            recovered: Recovery | Outcome | None = None
            if dep is not None and dep.model_id != m.modelId:
                raise DeployInputError(
                    f"deployment '{name}' serves model '{dep.model_id}', not '{m.modelId}'",
                    hint="Give this model its own deployment with --name.",
                )
            # Checked before anything changes: a refused key change leaves the deployment as it was.
            recorded = None if dep is None else dep.config.get("api_key", local_keys.OPEN)
            api_key = local_keys.settle(self.store.root, name, recorded, opts.api_key, self.report)
            opts = replace(
                opts,
                serve_args=[
                    *opts.serve_args,
                    "--api-key-file",
                    str(local_keys.key_files(self.store.root, name).backend),
                ],
            )
            if dep is not None:
                dep = self.target.ensure_gateway(dep)
                recovered = self._rollouts(dep, opts, opened).recover(package, opts.promote)
                if isinstance(recovered, Outcome):  # resumed: that rollout's result is this deploy's
                    return recovered
                for note in self.target.reconcile(dep):
                    self.report(note)
            else:
                port = opts.port or procs.free_port(opts.host)
                grpc_port = opts.grpc_port or procs.free_port(opts.host)
                dep = self.store.create_deployment(name, m.modelId, opts.host, port, {"grpc_port": grpc_port})
                dep = self.target.ensure_gateway(dep)
            config = dict(dep.config)
            # A deployment made before the gateway spoke gRPC gets a port now (the gateway opens it on reload).
            config.setdefault("grpc_port", opts.grpc_port or procs.free_port(opts.host))
            config["api_key"] = api_key  # a fingerprint, never the key
            if opts.idle_timeout_s is not None:
                config["idle_timeout_s"] = opts.idle_timeout_s
            if opts.hold_timeout_s is not None:
                config["hold_timeout_s"] = opts.hold_timeout_s
            config["health_timeout_s"] = opts.health_timeout_s  # the supervisor's limit on a restart, too
            if src.cache_dir is not None:
                config["store_cache"] = str(src.cache_dir)  # rollbacks to a store reference find it there
            self.store.update_deployment_config(name, config)
            rollouts = self._rollouts(self.store.require(name), opts, opened)
            if opts.strategy == VERSIONED:
                result = rollouts.versioned(new, opts.promote)
            else:
                result = rollouts.red_black(new, opts.steps)
            if isinstance(recovered, Recovery):
                result.recovered = recovered
            return result

    def recover(self, dep: Deployment, *, resume_package: str | None, opts: DeployOptions) -> Recovery | Outcome | None:
        """Finish or undo a rollout whose CLI died (llmserve.deploy.strategy.Rollouts.recover)."""
        return self._rollouts(dep, opts).recover(resume_package, opts.promote)

    def rollback(self, name: str, to_version: int | None = None, opts: DeployOptions | None = None) -> Outcome:
        opts = opts or DeployOptions(package=Path("."))
        with DeploymentLock(self.store, name, LOCK_WAIT_S):
            dep = self.target.ensure_gateway(self.store.require(name))
            recovered = self.recover(dep, resume_package=None, opts=opts)
            if isinstance(recovered, Recovery):  # never an Outcome: there is no package to resume
                return Outcome.undid(name, recovered)
            last = next((r for r in self.store.rollouts(name) if r.status == DONE and r.to_instance), None)
            if last is None:
                raise DeployInputError(
                    f"deployment '{name}' has no finished rollout to roll back",
                    hint=f"See its history with `llmserve status {name}`.",
                )
            if last.strategy == VERSIONED and to_version is None:
                return self._rollouts(dep, opts).retire(last)
            # red-black back to the previous package, or to the newest package of the version asked for
            target_pkg = target_digest = None
            if to_version is None:
                if last.from_instance:
                    prev = self.store.instance(last.from_instance)
                    target_pkg, target_digest = prev.package, prev.digest
            else:
                for r in self.store.rollouts(name, 200):
                    inst = self.store.instance(r.to_instance) if r.to_instance else None
                    if r.status == DONE and inst is not None and inst.model_version == to_version:
                        target_pkg, target_digest = inst.package, inst.digest
                        break
            if target_pkg is None or not (is_reference(target_pkg) or Path(target_pkg).exists()):
                raise DeployInputError(
                    f"no earlier package of '{name}' to roll back to"
                    + (f" (version {to_version})" if to_version else "")
                    + (f": {target_pkg} is gone" if target_pkg else ""),
                    hint="Deploy the package you want with `llmserve deploy PKG`.",
                )
        self.report(f"rolling back '{name}' to {target_pkg} (red-black)")
        ropts = rollback_options(opts, name, target_pkg, target_digest)
        result = self.deploy(ropts)
        result.action = "rolled-back"
        return result

    def down(self, name: str, drain_timeout_s: float = 30.0) -> LocalTeardown:
        with DeploymentLock(self.store, name, LOCK_WAIT_S):
            dep = self.store.require(name)
            open_r = self.store.open_rollout(name)
            if open_r:
                self.store.journal(
                    open_r.id,
                    status=ROLLED_BACK,
                    message="deployment torn down",
                    event="rollout closed by `deploy down`",
                )
            _gen, routes = self.store.routes(name)
            if self.target.gateway_alive(dep):
                self.target.apply_routes(dep, Routes(routes.model_id), why="teardown")
            stopped = []
            for inst in self.store.instances(name):
                self.target.stop_instance(dep, inst, drain_timeout=drain_timeout_s, why="teardown")
                stopped.append(inst.id)
            self.target.stop_gateway(dep)
            self.store.delete_deployment(name)
            local_keys.remove(self.store.root, name)
            self.report(f"deployment '{name}' removed ({len(stopped)} server(s) stopped)")
            return LocalTeardown(deployment=name, stopped_instances=stopped)


class LocalRollouts:
    """The local target's side of the strategies (llmserve.deploy.strategy.Target): versions are `llmserve
    serve` processes, traffic is the weights of the gateway's routing table, the journal is the SQLite state.
    One object serves one command on one deployment."""

    def __init__(self, target: LocalTarget, dep: Deployment, opts: DeployOptions, opened=None):
        self.target = target
        self.store = target.store
        self.report = target.report
        self.dep = dep
        self.name = dep.name
        self.opts = opts
        self.opened = opened  # the package being deployed (None for a rollback or a recovery)
        self._main: Instance | None = None
        self._live_count = 0
        self._olds: list[Member] | None = None  # the replaced servers, fixed when the shift starts
        self._step_table: Routes | None = None
        self._replaced: set[int] = set()

    # -- journal ------------------------------------------------------------------------------
    def begin(
        self, strategy: str, new: NewVersion, live: LiveVersion | None, steps: list[int], promote: bool | None = None
    ) -> Rollout:
        # promote is not journaled here: a resuming command decides it again (its --promote)
        _gen, routes = self.store.routes(self.name)
        main = self._main.id if live is not None and self._main is not None else None
        return self.store.begin_rollout(self.name, strategy, new.package, main, steps, routes)

    def journal(self, r: Rollout, event: str | None = None, **changes) -> Rollout:
        self.store.journal(r.id, event=event, **changes)
        return self.store.rollout(r.id)

    def event(self, kind: str, message: str, rollout: int | None = None) -> None:
        self.store.event(self.name, kind, message, rollout)

    def open_rollout(self) -> Rollout | None:
        return self.store.open_rollout(self.name)

    def version_of(self, r: Rollout) -> int:
        if r.to_instance:
            return self.store.instance(r.to_instance).model_version
        return self.opened.manifest.modelVersion if self.opened is not None else 0

    def summary(self, r: Rollout | None, action: str) -> Outcome:
        # The engine adds its own fields to this (llmserve.deploy.strategy).
        status = status_of(self.store, self.name, self.target)
        rollout = _rollout_record(r, seconds=round(r.updated - r.started, 2)) if r is not None else None
        return Outcome(deployment=status.deployment, action=action, status=status, rollout=rollout)

    def where(self) -> str:
        return f"on '{self.name}'"

    def status_hint(self) -> str:
        return f"llmserve status {self.name}"

    # -- starting a version -------------------------------------------------------------------
    def _start(self, r: Rollout, new: NewVersion, strategy: str) -> float:
        assert self.opened is not None  # only a deploy starts versions
        inst = self.target.start_instance(
            self.dep,
            new.package,
            new.digest,
            new.version,
            new.interface,
            strategy,
            self.opts.serve_args,
            self.opts.drain_timeout_s,
            serve_package=self.opts.serve_package,
            openai=HostChoice.of(self.opened.manifest).openai,
        )
        self.store.journal(
            r.id,
            to_instance=inst.id,
            phase="health-check",
            event=f"instance #{inst.id} started; waiting for its health check",
        )
        took = self.target.wait_healthy(inst, self.opts.health_timeout_s)
        self.target.mark_serving(inst)
        return took

    # -- red-black ----------------------------------------------------------------------------
    def live(self) -> LiveVersion | None:
        _gen, routes = self.store.routes(self.name)
        live = [self.store.instance(mb.instance) for mb in routes.default if mb.weight > 0]
        if not live:
            return None
        weights = routes.weights()
        self._main = max(live, key=lambda i: weights.get(i.id, 0))
        self._live_count = len(live)
        return LiveVersion(self._main.model_version, self._main.digest, self._main.interface)

    def unchanged(self, live: LiveVersion, new: NewVersion) -> bool:
        return self._live_count == 1 and bool(live.digest) and live.digest == new.digest and live.version == new.version

    def steps(self, r: Rollout) -> list[Step]:
        return [Step(pct) for pct in r.steps]

    def start_new(self, r: Rollout, new: NewVersion) -> float:
        return self._start(r, new, RED_BLACK)

    def shift(self, r: Rollout, index: int) -> tuple[int, float, list[Member]]:
        new = self.store.new_instance_of(r)
        last_good = Routes.from_dict(r.last_good)
        if self._olds is None:
            self._olds = [mb for mb in last_good.default if mb.weight > 0 and mb.instance != new.id]
        pct = r.steps[index]
        self._step_table = step_routes(last_good, self._olds, new, pct)
        errors_before = self.target.errors_of(self.dep, new.id)
        t0 = time.monotonic()
        self.target.apply_routes(self.dep, self._step_table, rollout=r.id, why=f"rollout #{r.id} step {index + 1}")
        return errors_before, t0, self._olds if pct < 100 else []

    def gate(self, r: Rollout, index: int, mark: tuple[int, float, list[Member]]) -> str | None:
        """Pause, then check: the new server alive and healthy, the old ones too while they take traffic,
        and at most max_step_errors server errors from the new one during the step."""
        errors_before, t0, olds = mark
        new = self.store.new_instance_of(r)
        pause = self.opts.pause_s
        while True:
            if not self.target.instance_alive(new):
                return f"v{new.model_version} (instance #{new.id}) exited"
            if time.monotonic() - t0 >= pause:
                break
            time.sleep(min(0.2, pause))
        if procs.health(new.url) != 200:
            return f"v{new.model_version} /health is not 200"
        for mb in olds:
            if procs.health(mb.url) != 200:
                return f"old v{mb.version} (instance #{mb.instance}) /health is not 200"
        errors = self.target.errors_of(self.dep, new.id) - errors_before
        allowed = self.opts.max_step_errors
        if errors > allowed:
            return f"{errors} server error(s) from v{new.model_version} during the step (allowed {allowed})"
        return None

    def step_passed(self, r: Rollout, index: int) -> None:
        assert self._step_table is not None
        self.store.journal(r.id, last_good=self._step_table)

    def finish_record(self, r: Rollout) -> dict:
        """The final table (the replaced versions out of every route, default and pinned), journaled as the
        last good one before it is applied."""
        new = self.store.new_instance_of(r)
        _gen, routes = self.store.routes(self.name)
        self._replaced = {mb.instance for mb in routes.default if mb.instance != new.id}
        if r.from_instance and r.from_instance != new.id:
            self._replaced.add(r.from_instance)
        final = without(routes, self._replaced)
        final.default = [new.member(100)]
        final.pinned.setdefault(new.model_version, [])
        if not any(mb.instance == new.id for mb in final.pinned[new.model_version]):
            final.pinned[new.model_version].append(new.member())
        return {"last_good": final}

    def finish(self, r: Rollout) -> None:
        self.target.apply_routes(
            self.dep, Routes.from_dict(r.last_good), rollout=r.id, why="old version out of every route"
        )
        for iid in sorted(self._replaced):
            inst = self.store.instance(iid)
            if inst.status in (SERVING, DRAINING, STARTING):
                self.target.stop_instance(self.dep, inst, drain_timeout=self.opts.drain_timeout_s, why="replaced")

    def _good_routes(self, r: Rollout) -> Routes:
        good = Routes.from_dict(r.last_good)
        return without(good, {r.to_instance}) if r.to_instance and r.phase != FINISHING else good

    def _healthy(self, iid: int) -> bool:
        inst = self.store.instance(iid)
        return inst.down_since is None and self.target.instance_alive(inst) and procs.health(inst.url) == 200

    def old_dead_new_healthy(self, r: Rollout) -> bool:
        if not r.to_instance:
            return False
        new = self.store.instance(r.to_instance)
        return (
            not any(self._healthy(mb.instance) for mb in self._good_routes(r).default if mb.weight > 0)
            and any(mb.instance != new.id for mb in Routes.from_dict(r.last_good).default)
            and new.status == SERVING
            and self._healthy(new.id)
        )

    def undo(self, r: Rollout, reason: str) -> None:
        """One table swap to the last good routes, then drain and stop the new server."""
        self.target.apply_routes(self.dep, self._good_routes(r), rollout=r.id, why=f"rollback of #{r.id}")
        if r.to_instance:
            inst = self.store.instance(r.to_instance)
            self.target.stop_instance(
                self.dep, inst, drain_timeout=self.opts.drain_timeout_s, status=FAILED, why=reason
            )

    # -- versioned ----------------------------------------------------------------------------
    def existing(self, new: NewVersion) -> str | None:
        _gen, routes = self.store.routes(self.name)
        members = routes.pinned.get(new.version)
        return (self.store.instance(members[0].instance).digest or "") if members else None

    def overlap(self, new: NewVersion) -> tuple[list[str], str] | None:
        serving = [i for i in self.store.instances(self.name) if i.status == SERVING]
        if not serving:
            return None
        rss = sum(procs.rss_bytes(i.session, i.pid) for i in serving) / 2**30
        return [f"v{i.model_version}" for i in serving], (
            f"each holds its own engine, weights and KV cache in memory (now {rss:.1f} GiB resident in total)"
        )

    def start_version(self, r: Rollout, new: NewVersion) -> float:
        return self._start(r, new, VERSIONED)

    def promote_by_default(self, r: Rollout) -> bool:
        _gen, routes = self.store.routes(self.name)
        return not any(mb.weight > 0 for mb in routes.default)

    def publish(self, r: Rollout, promote: bool) -> None:
        inst = self.store.new_instance_of(r)
        _gen, routes = self.store.routes(self.name)
        routes.pinned[inst.model_version] = [inst.member()]
        if promote:
            routes.default = [inst.member(100)]
        self.target.apply_routes(self.dep, routes, rollout=r.id, why=f"v{inst.model_version} ready")
        self.store.journal(r.id, last_good=routes)

    def published_note(self, r: Rollout) -> str:
        version = self.version_of(r)
        _gen, routes = self.store.routes(self.name)
        default = ", ".join(f"v{mb.version}" for mb in routes.default if mb.weight > 0) or "none"
        return (
            f'v{version} serving: ask for it with model "{routes.model_id}:{version}" '
            f"or header X-Model-Version: {version}; unversioned requests go to {default}"
        )

    def retire_idle(self) -> None:
        """Nothing to do here: the gateway retires idle versions itself while it runs (llmserve.deploy.gateway)."""

    def retire_version(self, last: Rollout, drain: bool) -> tuple[Rollout, int]:
        inst = self.store.new_instance_of(last)
        _gen, routes = self.store.routes(self.name)
        remaining = sorted(v for v in routes.pinned if v != inst.model_version)
        if not remaining:
            raise DeployInputError(
                f"v{inst.model_version} is the only serving version of '{self.name}'",
                hint=f"Tear it down with `llmserve deploy down {self.name}`.",
            )
        r = self.store.begin_rollout(self.name, RETIRE, inst.package, inst.id, [], routes)
        new_routes = without(routes, {inst.id})
        if not any(mb.weight > 0 for mb in new_routes.default):
            newest = new_routes.pinned[remaining[-1]]
            new_routes.default = [
                Member(mb.instance, mb.version, mb.url, 100 if k == 0 else 0) for k, mb in enumerate(newest)
            ]
        r = self.journal(r, phase=FINISHING, last_good=new_routes, event=f"retiring v{inst.model_version}")
        self.complete_retire(r)
        return r, inst.model_version

    # -- recovery -----------------------------------------------------------------------------
    def adopt_new(self, r: Rollout) -> tuple[Rollout, bool]:
        new = None
        if r.to_instance is None:
            # Killed between recording the instance and journaling it: find the orphan.
            orphans = [i for i in self.store.instances(self.name) if i.status == STARTING and i.created >= r.started]
            if orphans:
                new = self.target.adopt(orphans[-1])
                r = self.journal(r, to_instance=new.id)
        else:
            new = self.target.adopt(self.store.instance(r.to_instance))
        return r, new is not None and self.target.instance_alive(new)

    def wait_new_ready(self, r: Rollout) -> None:
        new = self.store.new_instance_of(r)
        self.target.wait_healthy(new, self.opts.health_timeout_s)
        self.target.mark_serving(new)

    def complete_retire(self, r: Rollout) -> None:
        """The retired version (the retire rollout's from_instance) out of the journaled routes, then stopped."""
        self.target.apply_routes(self.dep, Routes.from_dict(r.last_good), rollout=r.id, why="rollback: version retired")
        if r.from_instance:
            inst = self.store.instance(r.from_instance)
            if inst.status in (SERVING, DRAINING, STARTING):
                self.target.stop_instance(self.dep, inst, drain_timeout=self.opts.drain_timeout_s, why="rolled back")

    def close_rolled_back(self, last: Rollout, by: Rollout) -> None:
        self.store.journal(last.id, status=ROLLED_BACK, message=f"rolled back by #{by.id}")


def step_routes(last_good: Routes, olds: list[Member], new, pct: int) -> Routes:
    """The table of one red-black step: the new server at pct, the old ones sharing 100-pct in their old ratio."""
    total_old = sum(mb.weight for mb in olds) or 1
    default: list[Member] = []
    left = 100 - pct
    for k, mb in enumerate(olds):
        w = round(left * mb.weight / total_old) if k < len(olds) - 1 else left - sum(d.weight for d in default)
        default.append(Member(mb.instance, mb.version, mb.url, w))
    default.append(new.member(pct))
    pinned = {v: list(ms) for v, ms in last_good.pinned.items()}
    ms = pinned.setdefault(new.model_version, [])
    if not any(m.instance == new.id for m in ms):
        ms.append(new.member())
    return Routes(last_good.model_id, [d for d in default if d.weight > 0 or d.instance == new.id], pinned)


def _rollout_record(r: Rollout, **extra) -> RolloutRecord:
    return RolloutRecord(
        id=r.id,
        strategy=r.strategy,
        status=r.status,
        phase=r.phase,
        package=r.package,
        steps=r.steps,
        step=r.step_index + 1,
        from_instance=r.from_instance,
        to_instance=r.to_instance,
        message=r.message,
        started=r.started,
        updated=r.updated,
        **extra,
    )


def status_of(store: StateStore, name: str, target: LocalTarget | None = None, events: int = 15) -> LocalStatus:
    """The truth about one deployment: processes checked now, routes, in-flight counts, journal, history."""
    target = target or LocalTarget(store)
    dep = store.require(name)
    gen, routes = store.routes(name)
    stats = target.stats(dep) if target.gateway_alive(dep) else None
    weights = routes.weights()
    pinned = {mb.instance for ms in routes.pinned.values() for mb in ms}
    instances = []
    degraded: list[str] = []
    for inst in store.instances(name):
        alive = target.instance_alive(inst)
        health = procs.health(inst.url, timeout=3.0) if alive else None
        last = (stats or {}).get("last_request", {}).get(str(inst.id)) or inst.last_request
        routed = weights.get(inst.id, 0) > 0 or inst.id in pinned
        # A slow /health (a loaded machine) is not counted: only a dead process, a restart, or an answer
        # that says the server cannot serve.
        unhealthy = health is not None and health != 200
        if inst.status == SERVING and routed and (not alive or unhealthy or inst.down_since is not None):
            state = (
                "restarting"
                if inst.down_since is not None
                else (f"answering /health {health}" if alive else "not running")
            )
            degraded.append(f"v{inst.model_version} (instance #{inst.id}) is {state}")
        elif inst.status == FAILED and routed:
            degraded.append(f"v{inst.model_version} (instance #{inst.id}) failed and is still routed")
        instances.append(
            InstanceStatus(
                instance=inst.id,
                version=inst.model_version,
                status=inst.status,
                strategy=inst.strategy,
                url=inst.url,
                pid=inst.pid,
                alive=alive,
                health=health,
                restarts=inst.restarts,
                down_since=inst.down_since,
                last_exit=inst.last_exit,
                memory_bytes=procs.rss_bytes(inst.session, inst.pid) if alive else 0,
                weight=weights.get(inst.id, 0),
                routable_by_version=inst.id in pinned,
                inflight=int((stats or {}).get("inflight", {}).get(str(inst.id), 0)),
                last_request=last,
                package=inst.package,
                digest=inst.digest,
                log=inst.log,
            )
        )
    open_r = store.open_rollout(name)
    gateway_alive = target.gateway_alive(dep)
    if not gateway_alive:
        degraded.append("the gateway is not running (`llmserve deploy` of the live package starts it again)")
    elif stats is None:
        degraded.append("the gateway does not answer")
    return LocalStatus(
        deployment=name,
        degraded=degraded,
        model_id=dep.model_id,
        state_dir=str(store.root),
        gateway=GatewayStatus(
            url=dep.gateway_url,
            grpc=dep.grpc_address,
            pid=dep.gateway_pid,
            alive=gateway_alive,
            generation_applied=(stats or {}).get("generation"),
            log=str(store.log_file(name, "gateway")),
        ),
        routes=RoutesStatus(generation=gen, table=routes.to_dict()),
        config=dep.config,
        auth="open" if dep.config.get("api_key", local_keys.OPEN) == local_keys.OPEN else "api-key",
        instances=instances,
        # interrupted: no CLI holds the lock, so no command is driving it (the next deploy resumes it)
        open_rollout=None
        if open_r is None
        else _rollout_record(open_r, interrupted=True if not _lock_held(store, name) else None),
        rollouts=[_rollout_record(r) for r in store.rollouts(name, 10)],
        history=[HistoryEvent.of(e) for e in store.events(name, events)],
    )


def _lock_held(store: StateStore, name: str) -> bool:
    lock = DeploymentLock(store, name)
    if lock.acquire():
        lock.release()
        return False
    return True


def _check_local_hosting(manifest) -> None:
    """The local target runs every server behind its gateway with llmserve's frontends (/health, the backend
    key): a Triton-hosted package in executionMode standalone has none (Triton's own endpoints), so it is
    refused before anything starts rather than failing its health check."""
    if HostChoice.of(manifest).standalone:
        raise DeployInputError(
            f"{manifest.modelId} v{manifest.modelVersion} has executionMode standalone: Triton's own endpoints "
            "would serve it, without the /health and the API key the local gateway and its servers use",
            hint="Package it with `executionMode: embedded` (the default) to deploy it locally; standalone "
            "packages deploy on --target kubernetes (with --no-api-key).",
        )
