"""Strategies (red-black, versioned), recovery of interrupted rollouts, rollback, teardown, status.

Every action is journaled before it is taken (llmserve.deploy.state): the rollout row says what the
CLI is about to do and which routing table was the last good one, so the next command can finish or
undo a rollout whose CLI was killed. All changes hold the deployment's flock.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from llmserve.deploy import interface as iface
from llmserve.deploy import local_keys, procs
from llmserve.deploy.errors import DeployInputError, HealthCheckFailedError, InterfaceChangedError, RolloutFailedError
from llmserve.deploy.hosting import HostChoice
from llmserve.deploy.local_keys import KeyRequest
from llmserve.deploy.local_target import LocalTarget, without
from llmserve.deploy.source import PackageSource, is_reference, open_source, reference_model_id
from llmserve.deploy.state import (
    DONE,
    FAILED,
    ROLLED_BACK,
    SERVING,
    STARTING,
    Deployment,
    DeploymentLock,
    Member,
    Rollout,
    Routes,
    StateStore,
)

if TYPE_CHECKING:
    from llmserve.store import StoreOptions

RED_BLACK, VERSIONED = "red-black", "versioned"
ROLLED_FORWARD = "rolled-forward"
DEFAULT_STEPS = [10, 25, 50, 100]
LOCK_WAIT_S = 120.0  # how long a command waits for another change (a CLI or the idle reaper) to finish


@dataclass
class DeployOptions:
    package: Path | str  # a local package, or a model store reference s3://BUCKET/PREFIX/MODEL_ID:VERSION
    strategy: str = RED_BLACK
    name: str | None = None  # default: the package's modelId
    steps: list[int] = field(default_factory=lambda: list(DEFAULT_STEPS))
    pause_s: float = 5.0
    health_timeout_s: float = 300.0
    drain_timeout_s: float = 30.0
    host: str = "127.0.0.1"
    port: int | None = None  # gateway port; default: chosen once, then kept
    grpc_port: int | None = None  # gateway KServe v2 gRPC port; default: chosen once, then kept
    idle_timeout_s: float | None = None  # versioned: stop idle non-newest versions after this
    promote: bool | None = None  # versioned: make the new version the default for unversioned requests
    max_step_errors: int = 0  # health gate: server errors (5xx, broken connections) allowed per step
    hold_timeout_s: float | None = None  # gateway: how long a request waits for a restarting server (kept)
    api_key: KeyRequest = field(default_factory=KeyRequest)  # --api-key-file / env, --no-api-key, --rotate
    serve_args: list[str] = field(default_factory=list)
    cache_dir: Path | None = None  # store references: the store cache (default: the deployment's, else the usual)
    store: StoreOptions | None = None  # store references: endpoint, profile, region (credentials: AWS config)
    digest_hint: str | None = None  # store references: the digest recorded for it (rollback finds it cached)
    serve_package: str | None = None  # set by deploy: what servers are started with (the source's serve_ref)


def parse_steps(text: str) -> list[int]:
    try:
        steps = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise DeployInputError(f"--steps '{text}': expected comma-separated percentages, e.g. 10,25,50,100") from None
    if not steps or steps[-1] != 100 or any(not 0 < s <= 100 for s in steps) or steps != sorted(set(steps)):
        raise DeployInputError(f"--steps '{text}': percentages must rise strictly, each in 1..100, ending at 100")
    return steps


class Deployer:
    def __init__(self, store: StateStore, report=None):
        self.store = store
        self.report = report or (lambda msg, **kw: None)
        self.target = LocalTarget(store, self.report)

    # -- entry points -------------------------------------------------------------------------
    def deploy(self, opts: DeployOptions) -> dict:
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

    def _deploy(self, opts: DeployOptions, src: PackageSource) -> dict:
        from llmserve.packaging.opened import open_package

        package = src.reference
        opened = open_package(src.path)  # verifies and unpacks once, so the servers start from the cache
        m = opened.manifest
        name = opts.name or m.modelId
        _check_local_hosting(m)
        new_iface = iface.fingerprint(opened)
        with DeploymentLock(self.store, name, LOCK_WAIT_S):
            dep = self.store.deployment(name)
            recovered = None
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
                recovered = self.recover(dep, resume_package=package, opts=opts)
                if recovered and recovered.get("resumed"):
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
            dep = self.store.require(name)
            if opts.strategy == VERSIONED:
                result = self._versioned(dep, opts, package, opened, new_iface)
            else:
                result = self._red_black(dep, opts, package, opened, new_iface)
            if recovered:
                result["recovered"] = recovered
            return result

    def rollback(self, name: str, to_version: int | None = None, opts: DeployOptions | None = None) -> dict:
        opts = opts or DeployOptions(package=Path("."))
        with DeploymentLock(self.store, name, LOCK_WAIT_S):
            dep = self.target.ensure_gateway(self.store.require(name))
            recovered = self.recover(dep, resume_package=None, opts=opts)
            if recovered:
                return {"deployment": name, "action": "undid-interrupted-rollout", **recovered}
            last = next((r for r in self.store.rollouts(name) if r.status == DONE and r.to_instance), None)
            if last is None:
                raise DeployInputError(
                    f"deployment '{name}' has no finished rollout to roll back",
                    hint=f"See its history with `llmserve status {name}`.",
                )
            if last.strategy == VERSIONED and to_version is None:
                return self._retire(dep, last, opts)
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
            return {"deployment": name, "action": "removed", "stopped_instances": stopped}

    # -- shared by both strategies -----------------------------------------------------------
    def _start_healthy(
        self,
        dep: Deployment,
        rollout: Rollout,
        package: str,
        opened,
        new_iface: dict,
        strategy: str,
        opts: DeployOptions,
        hint_suffix: str = "",
    ):
        """Start the new version's server and wait for its health check; on failure undo the rollout."""
        try:
            inst = self.target.start_instance(
                dep,
                package,
                opened.digest,
                opened.manifest.modelVersion,
                new_iface,
                strategy,
                opts.serve_args,
                opts.drain_timeout_s,
                serve_package=opts.serve_package,
                openai=HostChoice.of(opened.manifest).openai,
            )
            self.store.journal(
                rollout.id,
                to_instance=inst.id,
                phase="health-check",
                event=f"instance #{inst.id} started; waiting for its health check",
            )
            return inst, self.target.wait_healthy(inst, opts.health_timeout_s)
        except HealthCheckFailedError as exc:
            self._undo(
                dep,
                self.store.rollout(rollout.id),
                f"health check failed: {exc.message.splitlines()[0]}",
                opts,
            )
            hint = exc.hint + hint_suffix if exc.hint else exc.hint
            raise RolloutFailedError(f"rollout #{rollout.id} rolled back: {exc.message}", hint=hint) from exc

    # -- red-black ----------------------------------------------------------------------------
    def _red_black(self, dep: Deployment, opts: DeployOptions, package: str, opened, new_iface: dict) -> dict:
        m = opened.manifest
        _gen, routes = self.store.routes(dep.name)
        live = [self.store.instance(mb.instance) for mb in routes.default if mb.weight > 0]
        if live:
            main = max(live, key=lambda i: routes.weights().get(i.id, 0))
            diff = iface.differences(main.interface, new_iface)
            if diff:
                raise InterfaceChangedError(
                    f"the interface of {m.modelId} v{m.modelVersion} differs from the live v{main.model_version} "
                    f"({', '.join(r[0] for r in diff)}): red-black would mix two interfaces behind one name",
                    details=[iface.difference_detail(diff)],
                )
            if len(live) == 1 and main.digest and main.digest == opened.digest and main.model_version == m.modelVersion:
                self.report(f"v{m.modelVersion} with this digest already takes 100% of '{dep.name}': nothing to do")
                return self._summary(dep, None, "unchanged")
        rollout = self.store.begin_rollout(
            dep.name, RED_BLACK, package, main.id if live else None, opts.steps if live else [100], routes
        )
        self.report(
            f"rollout #{rollout.id}: {m.modelId} v{m.modelVersion} red-black on '{dep.name}' "
            f"({'steps ' + ','.join(map(str, opts.steps)) + '%' if live else 'first version'})"
        )
        inst, took = self._start_healthy(
            dep,
            rollout,
            package,
            opened,
            new_iface,
            RED_BLACK,
            opts,
            hint_suffix="; traffic stayed on the live version." if live else "",
        )
        self.target.mark_serving(inst)
        self.report(f"v{m.modelVersion} healthy after {took:.1f} s")
        return self._shift(dep, self.store.rollout(rollout.id), opts, start_index=0)

    def _shift(self, dep: Deployment, rollout: Rollout, opts: DeployOptions, start_index: int) -> dict:
        """Walk the steps from start_index; each: journal intent, apply weights, pause, health gate."""
        new = self.store.new_instance_of(rollout)
        last_good = Routes.from_dict(rollout.last_good)
        olds = [mb for mb in last_good.default if mb.weight > 0 and mb.instance != new.id]
        steps = rollout.steps
        self.store.journal(rollout.id, phase="shifting")
        for i in range(start_index, len(steps)):
            pct = steps[i]
            target = step_routes(last_good, olds, new, pct)
            self.store.journal(
                rollout.id, step_index=i, event=f"step {i + 1}/{len(steps)}: {pct}% to v{new.model_version}"
            )
            errors_before = self.target.errors_of(dep, new.id)
            t0 = time.monotonic()
            self.target.apply_routes(dep, target, rollout=rollout.id, why=f"rollout #{rollout.id} step {i + 1}")
            self.report(
                f"step {i + 1}/{len(steps)}: {pct}% of traffic on v{new.model_version}", step=i + 1, percent=pct
            )
            problem = self._gate(dep, new, olds if pct < 100 else [], opts, errors_before, t0)
            if problem:
                reason = f"step {i + 1} ({pct}%) failed its health gate: {problem}"
                if self._undo(dep, self.store.rollout(rollout.id), reason, opts) == ROLLED_FORWARD:
                    out = self._summary(dep, self.store.rollout(rollout.id), "deployed")
                    out["rolled_forward"] = reason
                    return out
                raise RolloutFailedError(
                    f"rollout #{rollout.id} rolled back at step {i + 1} ({pct}%): {problem}",
                    hint=f"Traffic is back on the last healthy state; see `llmserve status {dep.name}`.",
                )
            self.store.journal(rollout.id, last_good=target)
        return self._finish(dep, self.store.rollout(rollout.id), opts)

    def _gate(
        self, dep: Deployment, new, olds: list[Member], opts: DeployOptions, errors_before: int, t0: float
    ) -> str | None:
        """Pause, then check: the new server alive and healthy, the old ones too while they take traffic,
        and at most max_step_errors server errors from the new one during the step."""
        while True:
            if not self.target.instance_alive(new):
                return f"v{new.model_version} (instance #{new.id}) exited"
            if time.monotonic() - t0 >= opts.pause_s:
                break
            time.sleep(min(0.2, opts.pause_s))
        if procs.health(new.url) != 200:
            return f"v{new.model_version} /health is not 200"
        for mb in olds:
            if procs.health(mb.url) != 200:
                return f"old v{mb.version} (instance #{mb.instance}) /health is not 200"
        errors = self.target.errors_of(dep, new.id) - errors_before
        if errors > opts.max_step_errors:
            return (
                f"{errors} server error(s) from v{new.model_version} during the step (allowed {opts.max_step_errors})"
            )
        return None

    def _finish(self, dep: Deployment, rollout: Rollout, opts: DeployOptions) -> dict:
        """Take the replaced version out of every route (default and pinned), then drain and stop it."""
        new = self.store.new_instance_of(rollout)
        _gen, routes = self.store.routes(dep.name)
        old_ids = {mb.instance for mb in routes.default if mb.instance != new.id}
        if rollout.from_instance and rollout.from_instance != new.id:
            old_ids.add(rollout.from_instance)
        final = without(routes, old_ids)
        final.default = [new.member(100)]
        final.pinned.setdefault(new.model_version, [])
        if not any(mb.instance == new.id for mb in final.pinned[new.model_version]):
            final.pinned[new.model_version].append(new.member())
        self.store.journal(
            rollout.id,
            phase="finishing",
            last_good=final,
            event=f"100% on v{new.model_version}; draining the old version",
        )
        self.target.apply_routes(dep, final, rollout=rollout.id, why="old version out of every route")
        for iid in sorted(old_ids):
            inst = self.store.instance(iid)
            if inst.status in (SERVING, "draining", STARTING):
                self.target.stop_instance(dep, inst, drain_timeout=opts.drain_timeout_s, why="replaced")
        self.store.journal(
            rollout.id, status=DONE, phase="done", event=f"rollout #{rollout.id} done: v{new.model_version} takes 100%"
        )
        self.report(f"rollout #{rollout.id} done: v{new.model_version} takes 100% of '{dep.name}'")
        return self._summary(dep, self.store.rollout(rollout.id), "deployed")

    def _undo(self, dep: Deployment, rollout: Rollout, reason: str, opts: DeployOptions) -> str:
        """Back to the last *healthy* state, atomically: one table swap to the last good routes, then drain
        and stop the new server. When nothing in those routes is healthy any more (the version being
        replaced died) and the new server is, going back would send every request to a dead server:
        the rollout rolls forward instead. Returns ROLLED_BACK or ROLLED_FORWARD."""
        good = Routes.from_dict(rollout.last_good)
        if rollout.to_instance:
            good = without(good, {rollout.to_instance}) if rollout.phase != "finishing" else good
            new = self.store.instance(rollout.to_instance)
            if (
                rollout.strategy == RED_BLACK
                and not any(self._healthy(mb.instance) for mb in good.default if mb.weight > 0)
                and any(mb.instance != new.id for mb in Routes.from_dict(rollout.last_good).default)
                and new.status == SERVING
                and self._healthy(new.id)
            ):
                self.store.journal(
                    rollout.id,
                    phase="finishing",
                    event=f"{reason}; the version being replaced is not healthy and v{new.model_version} is: "
                    "rolling forward",
                )
                self.report(f"{reason}; the old version is not healthy, v{new.model_version} is: rolling forward")
                self._finish(dep, self.store.rollout(rollout.id), opts)
                return ROLLED_FORWARD
        self.store.journal(rollout.id, phase="rolling-back", event=f"rolling back: {reason}")
        self.report(f"rolling back rollout #{rollout.id}: {reason}")
        self.target.apply_routes(dep, good, rollout=rollout.id, why=f"rollback of #{rollout.id}")
        if rollout.to_instance:
            inst = self.store.instance(rollout.to_instance)
            self.target.stop_instance(dep, inst, drain_timeout=opts.drain_timeout_s, status=FAILED, why=reason)
        self.store.journal(
            rollout.id,
            status=ROLLED_BACK,
            phase="rolled-back",
            message=reason,
            event=f"rollout #{rollout.id} rolled back",
        )
        return ROLLED_BACK

    def _healthy(self, iid: int) -> bool:
        inst = self.store.instance(iid)
        return inst.down_since is None and self.target.instance_alive(inst) and procs.health(inst.url) == 200

    # -- versioned ----------------------------------------------------------------------------
    def _versioned(self, dep: Deployment, opts: DeployOptions, package: str, opened, new_iface: dict) -> dict:
        m = opened.manifest
        _gen, routes = self.store.routes(dep.name)
        existing = routes.pinned.get(m.modelVersion)
        if existing:
            inst = self.store.instance(existing[0].instance)
            if inst.digest == opened.digest:
                self.report(f"v{m.modelVersion} is already serving on '{dep.name}': nothing to do")
                return self._summary(dep, None, "unchanged")
            raise DeployInputError(
                f"v{m.modelVersion} of '{m.modelId}' already serves a different package (digest differs)",
                hint="Give the new package its own modelVersion, or replace this version with --strategy red-black.",
            )
        rollout = self.store.begin_rollout(dep.name, VERSIONED, package, None, [], routes)
        serving = [i for i in self.store.instances(dep.name) if i.status == SERVING]
        self.report(f"rollout #{rollout.id}: {m.modelId} v{m.modelVersion} versioned on '{dep.name}'")
        if serving:
            rss = sum(procs.rss_bytes(i.session, i.pid) for i in serving) / 2**30
            self.report(
                f"warning: v{m.modelVersion} runs beside {len(serving)} serving version(s) "
                f"({', '.join('v' + str(i.model_version) for i in serving)}); each holds its own engine, weights and "
                f"KV cache (now {rss:.1f} GiB resident in total), so the overlap costs that much more memory "
                "until old versions are retired (--idle-timeout, `llmserve rollback`).",
                warning=True,
            )
        inst, took = self._start_healthy(dep, rollout, package, opened, new_iface, VERSIONED, opts)
        self.target.mark_serving(inst)
        self.report(f"v{m.modelVersion} healthy after {took:.1f} s")
        return self._publish_version(dep, self.store.rollout(rollout.id), opts)

    def _publish_version(self, dep: Deployment, rollout: Rollout, opts: DeployOptions) -> dict:
        inst = self.store.new_instance_of(rollout)
        _gen, routes = self.store.routes(dep.name)
        routes.pinned[inst.model_version] = [inst.member()]
        promote = opts.promote
        if promote is None:
            promote = not any(mb.weight > 0 for mb in routes.default)
        if promote:
            routes.default = [inst.member(100)]
        self.store.journal(
            rollout.id,
            phase="publishing",
            event=f"v{inst.model_version} routable" + (" and the default" if promote else ""),
        )
        self.target.apply_routes(dep, routes, rollout=rollout.id, why=f"v{inst.model_version} ready")
        self.store.journal(
            rollout.id,
            status=DONE,
            phase="done",
            last_good=routes,
            event=f"rollout #{rollout.id} done: v{inst.model_version} serving",
        )
        default = ", ".join(f"v{mb.version}" for mb in routes.default if mb.weight > 0) or "none"
        self.report(
            f'v{inst.model_version} serving: ask for it with model "{routes.model_id}:{inst.model_version}" '
            f"or header X-Model-Version: {inst.model_version}; unversioned requests go to {default}"
        )
        return self._summary(dep, self.store.rollout(rollout.id), "deployed")

    def _retire(self, dep: Deployment, last: Rollout, opts: DeployOptions) -> dict:
        inst = self.store.new_instance_of(last)
        _gen, routes = self.store.routes(dep.name)
        remaining = sorted(v for v in routes.pinned if v != inst.model_version)
        if not remaining:
            raise DeployInputError(
                f"v{inst.model_version} is the only serving version of '{dep.name}'",
                hint=f"Tear it down with `llmserve deploy down {dep.name}`.",
            )
        rollout = self.store.begin_rollout(dep.name, "retire", inst.package, inst.id, [], routes)
        new_routes = without(routes, {inst.id})
        if not any(mb.weight > 0 for mb in new_routes.default):
            newest = new_routes.pinned[remaining[-1]]
            new_routes.default = [
                Member(mb.instance, mb.version, mb.url, 100 if k == 0 else 0) for k, mb in enumerate(newest)
            ]
        self.store.journal(rollout.id, phase="finishing", last_good=new_routes, event=f"retiring v{inst.model_version}")
        self.target.apply_routes(dep, new_routes, rollout=rollout.id, why=f"rollback: v{inst.model_version} retired")
        self.target.stop_instance(dep, inst, drain_timeout=opts.drain_timeout_s, why="rolled back")
        self.store.journal(rollout.id, status=DONE, phase="done", event=f"v{inst.model_version} retired")
        self.store.journal(last.id, status=ROLLED_BACK, message=f"rolled back by #{rollout.id}")
        return {
            **self._summary(dep, self.store.rollout(rollout.id), "rolled-back"),
            "retired_version": inst.model_version,
        }

    # -- recovery -----------------------------------------------------------------------------
    def recover(self, dep: Deployment, *, resume_package: str | None, opts: DeployOptions) -> dict | None:
        """Finish or undo a rollout whose CLI died (we hold the lock, so its owner is gone).

        finishing phase -> finish it (the new version already had 100%);
        same package asked again and its server healthy -> resume from the journaled step;
        anything else -> roll back to the journaled last good routes."""
        r = self.store.open_rollout(dep.name)
        if r is None:
            return None
        self.store.event(
            dep.name,
            "interrupted",
            f"rollout #{r.id} ({r.strategy}) was interrupted in phase "
            f"'{r.phase}' at step {r.step_index + 1}; recovering",
            r.id,
        )
        self.report(f"found interrupted rollout #{r.id} ({r.strategy}, phase {r.phase}, step {r.step_index + 1})")
        new = None
        if r.to_instance is None:
            # Killed between recording the instance and journaling it: find the orphan.
            orphans = [i for i in self.store.instances(dep.name) if i.status == STARTING and i.created >= r.started]
            if orphans:
                new = self.target.adopt(orphans[-1])
                self.store.journal(r.id, to_instance=new.id)
                r = self.store.rollout(r.id)
        else:
            new = self.target.adopt(self.store.instance(r.to_instance))
        if r.phase == "finishing":
            result = self._finish(dep, r, opts) if r.strategy == RED_BLACK else None
            if result is None:
                self.store.journal(r.id, status=DONE, phase="done", event=f"rollout #{r.id} completed on recovery")
            return {"rollout": r.id, "recovered": "completed", "resumed": False}
        healthy = new is not None and self.target.instance_alive(new) and procs.health(new.url) == 200
        if (
            resume_package is not None
            and r.package == resume_package
            and new is not None
            and self.target.instance_alive(new)
        ):
            try:
                self.target.wait_healthy(new, opts.health_timeout_s)
                healthy = True
            except HealthCheckFailedError:
                healthy = False
            if healthy:
                self.target.mark_serving(new)
                self.report(f"resuming rollout #{r.id} at step {max(r.step_index, 0) + 1}")
                self.store.event(
                    dep.name, "resumed", f"rollout #{r.id} resumed at step {max(r.step_index, 0) + 1}", r.id
                )
                if r.strategy == VERSIONED:
                    out = self._publish_version(dep, self.store.rollout(r.id), opts)
                else:
                    out = self._shift(dep, self.store.rollout(r.id), opts, start_index=max(r.step_index, 0))
                return {**out, "recovered": "resumed", "resumed": True, "rollout": r.id}
        outcome = self._undo(dep, r, "interrupted rollout (its CLI stopped)", opts)
        return {"rollout": r.id, "recovered": outcome, "resumed": False}

    # -- status -------------------------------------------------------------------------------
    def _summary(self, dep: Deployment, rollout: Rollout | None, action: str) -> dict:
        out = status_of(self.store, dep.name, self.target)
        out["action"] = action
        if rollout is not None:
            out["rollout"] = _rollout_dict(rollout)
            out["rollout"]["seconds"] = round(rollout.updated - rollout.started, 2)
        return out


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


def _rollout_dict(r: Rollout) -> dict:
    return {
        "id": r.id,
        "strategy": r.strategy,
        "status": r.status,
        "phase": r.phase,
        "package": r.package,
        "steps": r.steps,
        "step": r.step_index + 1,
        "from_instance": r.from_instance,
        "to_instance": r.to_instance,
        "message": r.message,
        "started": r.started,
        "updated": r.updated,
    }


def status_of(store: StateStore, name: str, target: LocalTarget | None = None, events: int = 15) -> dict:
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
            {
                "instance": inst.id,
                "version": inst.model_version,
                "status": inst.status,
                "strategy": inst.strategy,
                "url": inst.url,
                "pid": inst.pid,
                "alive": alive,
                "health": health,
                "restarts": inst.restarts,
                "down_since": inst.down_since,
                "last_exit": inst.last_exit,
                "memory_bytes": procs.rss_bytes(inst.session, inst.pid) if alive else 0,
                "weight": weights.get(inst.id, 0),
                "routable_by_version": inst.id in pinned,
                "inflight": int((stats or {}).get("inflight", {}).get(str(inst.id), 0)),
                "last_request": last,
                "package": inst.package,
                "digest": inst.digest,
                "log": inst.log,
            }
        )
    open_r = store.open_rollout(name)
    if not target.gateway_alive(dep):
        degraded.append("the gateway is not running (`llmserve deploy` of the live package starts it again)")
    elif stats is None:
        degraded.append("the gateway does not answer")
    return {
        "deployment": name,
        "degraded": degraded,
        "model_id": dep.model_id,
        "state_dir": str(store.root),
        "gateway": {
            "url": dep.gateway_url,
            "grpc": dep.grpc_address,
            "pid": dep.gateway_pid,
            "alive": target.gateway_alive(dep),
            "generation_applied": (stats or {}).get("generation"),
            "log": str(store.log_file(name, "gateway")),
        },
        "routes": {"generation": gen, **routes.to_dict()},
        "config": dep.config,
        "auth": "open" if dep.config.get("api_key", local_keys.OPEN) == local_keys.OPEN else "api-key",
        "instances": instances,
        "open_rollout": (_rollout_dict(open_r) | {"interrupted": True})
        if open_r and not _lock_held(store, name)
        else (_rollout_dict(open_r) if open_r else None),
        "rollouts": [_rollout_dict(r) for r in store.rollouts(name, 10)],
        "history": [
            {"ts": e["ts"], "kind": e["kind"], "rollout": e["rollout"], "message": e["message"]}
            for e in store.events(name, events)
        ],
    }


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
