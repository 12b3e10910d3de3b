"""Self-healing on the local target: the deployment's gateway process keeps its servers running.

A routed, serving instance whose process is gone (engine death, OOM kill, `kill -9`) is marked down
at once: the gateway stops picking it and holds requests that have no other backend. What is left of
its process tree (the engine core, reparented to init) is stopped, and it is started again on the
same ports (HTTP and gRPC) with the arguments it was first started with; a start that dies or does not pass /health
within the deployment's health timeout counts as a failure, and the next waits longer (1, 2, 4 ... 30
s). It is back in rotation once /health answers 200. After MAX_FAILED_STARTS failures in a row it is
marked failed: it stays out of rotation and `llmserve status` reports the deployment degraded.

Every change to an instance row is a compare-and-set (state.py), so a CLI stopping the same instance
at the same moment always wins: a process started for a row that is no longer serving is killed.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

from llmserve.deploy import procs
from llmserve.deploy.state import FAILED, SERVING, STOPPED, Instance, StateStore

log = logging.getLogger("llmserve.gateway")

MAX_FAILED_STARTS = 5
MAX_BACKOFF_S = 30.0
DEFAULT_HEALTH_TIMEOUT_S = 300.0
REAP_EVERY = 10  # checks between two sweeps for processes of stopped instances


@dataclass
class _Attempts:
    failures: int = 0
    next_at: float = 0.0  # monotonic time the next start may happen
    started_at: float | None = None  # monotonic time the running start was launched


@dataclass(frozen=True)
class Health:
    """What the gateway needs from one check: who cannot take requests, and who of those will be back."""

    down: frozenset[int] = frozenset()
    recovering: frozenset[int] = frozenset()


class Supervisor:
    def __init__(self, store: StateStore, deployment: str, env: dict[str, str] | None = None, clock=time.monotonic):
        self.store = store
        self.deployment = deployment
        self.env = env
        self.clock = clock
        self.attempts: dict[int, _Attempts] = {}
        self.checks = 0

    def check(self, routed: set[int]) -> Health:
        """One pass over the routed instances (call every fraction of a second, off the event loop)."""
        dep = self.store.deployment(self.deployment)
        if dep is None:
            return Health()
        timeout = float(dep.config.get("health_timeout_s") or DEFAULT_HEALTH_TIMEOUT_S)
        down: set[int] = set()
        recovering: set[int] = set()
        serving = {i.id: i for i in self.store.instances(self.deployment, statuses=(SERVING,))}
        for iid in routed:
            inst = serving.get(iid)
            if inst is None:
                if self.store.instance(iid).status in (FAILED, STOPPED):
                    down.add(iid)  # failed or stopped, yet still in the table: never picked
                continue
            state = self._check_one(inst, timeout)
            if state != "up":
                down.add(iid)
            if state == "recovering":
                recovering.add(iid)
        for iid in list(self.attempts):
            if iid not in serving:
                del self.attempts[iid]
        self.checks += 1
        if self.checks % REAP_EVERY == 0:
            self._reap_leaks()
        return Health(frozenset(down), frozenset(recovering))

    # -- one instance ----------------------------------------------------------------------------
    def _check_one(self, inst: Instance, timeout: float) -> str:
        if inst.down_since is None:
            if procs.alive(inst.pid, inst.pid_start):
                return "up"
            why = f"v{inst.model_version} (instance #{inst.id}) process {inst.pid} is gone{_last_line(inst.log)}"
            if not self.store.mark_down(inst.id, inst.pid, why):
                return "recovering"  # a CLI changed the row meanwhile; look again next time
            log.warning("%s; restarting it", why)
            # Its leftovers (the engine core) are stopped by the restart, on the next check: this one
            # returns at once, so the gateway stops picking the dead server without waiting for them.
            self.attempts[inst.id] = _Attempts(next_at=self.clock())
            return "recovering"
        attempts = self.attempts.setdefault(inst.id, _Attempts(next_at=self.clock()))
        pid, start = inst.pid, inst.pid_start
        if pid is None:
            # Claimed for a restart by a gateway that died before recording the new process.
            pid = procs.read_pid_file(self._pid_file(inst))
            start = procs.start_time(pid) if pid else None
            if pid and start and self.store.restarted(inst.id, pid, start, procs.session_of(pid) or 0):
                attempts.started_at = self.clock()
        if pid is not None and procs.alive(pid, start):
            if attempts.started_at is None:
                attempts.started_at = self.clock()  # found running after a gateway restart
            if procs.health(inst.url, timeout=1.0) == 200:
                took = time.time() - inst.down_since
                self.store.mark_up(
                    inst.id,
                    f"v{inst.model_version} (instance #{inst.id}) serving again after {took:.1f} s "
                    f"(restart {inst.restarts})",
                )
                log.info("instance #%d serving again after %.1f s", inst.id, took)
                self.attempts.pop(inst.id, None)
                return "up"
            if self.clock() - attempts.started_at <= timeout:
                return "recovering"
            log.warning("instance #%d: no /health 200 within %g s of its restart; stopping it", inst.id, timeout)
            procs.terminate(pid, start, 10.0, inst.session)
            self._failed_start(attempts)
        elif attempts.started_at is not None:
            procs.kill_session(inst.session)  # the restarted process died before it was healthy
            self._failed_start(attempts)
        if attempts.failures >= MAX_FAILED_STARTS:
            self.store.set_instance_status(
                inst.id,
                FAILED,
                f"v{inst.model_version} (instance #{inst.id}) failed {attempts.failures} restarts in a row; "
                f"left stopped (log: {inst.log})",
            )
            self.attempts.pop(inst.id, None)
            return "failed"
        if self.clock() < attempts.next_at:
            return "recovering"
        return self._restart(inst, attempts)

    def _failed_start(self, attempts: _Attempts) -> None:
        attempts.failures += 1
        attempts.started_at = None
        attempts.next_at = self.clock() + min(2.0 ** (attempts.failures - 1), MAX_BACKOFF_S)

    def _restart(self, inst: Instance, attempts: _Attempts) -> str:
        if not inst.argv:
            self.store.set_instance_status(
                inst.id, FAILED, f"instance #{inst.id} has no launch record (started by an older llmserve)"
            )
            return "failed"
        if not self.store.claim_restart(inst.id, inst.pid):
            return "recovering"
        procs.kill_session(inst.session)
        deadline = self.clock() + 10.0
        ports = [p for p in (inst.port, inst.grpc_port) if p]
        while not all(procs.port_free("127.0.0.1", p) for p in ports) and self.clock() < deadline:
            time.sleep(0.1)
        launched = procs.launch(inst.argv, Path(inst.log or "/dev/null"), self._pid_file(inst), env=self.env)
        if not self.store.restarted(inst.id, launched.pid, launched.start, launched.session):
            procs.terminate(launched.pid, launched.start, 30.0, launched.session)
            return "gone"
        attempts.started_at = self.clock()
        self.store.event(
            self.deployment,
            "instance-restart",
            f"v{inst.model_version} (instance #{inst.id}) started again as pid {launched.pid} "
            f"(restart {inst.restarts + 1}, {attempts.failures} failed before)",
        )
        log.info("instance #%d started again as pid %d", inst.id, launched.pid)
        return "recovering"

    def _pid_file(self, inst: Instance) -> Path:
        return self.store.pid_file(inst.deployment, f"i{inst.id}")

    def _reap_leaks(self) -> None:
        """A stopped or failed instance must not have a live process (a CLI and a restart crossing)."""
        for inst in self.store.instances_to_reap(self.deployment):
            if procs.alive(inst.pid, inst.pid_start):
                log.warning("instance #%d is %s but pid %s runs: stopping it", inst.id, inst.status, inst.pid)
                procs.terminate(inst.pid, inst.pid_start, 30.0, inst.session)


def _last_line(log_path: str | None) -> str:
    tail = procs.log_tail(log_path, 1).strip()
    return f" (last log line: {tail[-200:]})" if tail else ""
