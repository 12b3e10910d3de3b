"""The local target: versions run as `llmserve serve` daemons behind one gateway daemon per deployment."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import httpx

from llmserve.deploy import doctor, procs
from llmserve.deploy.errors import GatewayError, HealthCheckFailedError
from llmserve.deploy.local_keys import KEY_ENV, key_files
from llmserve.deploy.state import DRAINING, FAILED, SERVING, STARTING, STOPPED, Deployment, Instance, Routes, StateStore


class LocalTarget:
    def __init__(self, store: StateStore, report=None):
        self.store = store
        self.report = report or (lambda msg, **kw: None)

    # -- gateway ------------------------------------------------------------------------------
    def gateway_alive(self, dep: Deployment) -> bool:
        return procs.alive(dep.gateway_pid, dep.gateway_start)

    def ensure_gateway(self, dep: Deployment, timeout: float = 30.0) -> Deployment:
        """The deployment's watchdog running (it keeps the gateway running) and the gateway answering."""
        if self.gateway_alive(dep):
            self._wait_gateway(dep, None, timeout)  # its watchdog may be restarting it
            return dep
        procs.kill_session(dep.gateway_session)  # a gateway left by a killed watchdog
        for what, port, option in (("", dep.gateway_port, "--port"), (" gRPC", dep.grpc_port, "--grpc-port")):
            if port and not procs.port_free(dep.gateway_host, port):
                raise GatewayError(
                    f"gateway{what} port {dep.gateway_host}:{port} is taken by another process",
                    hint="Free the port, or tear down with `llmserve deploy down "
                    f"{dep.name}` and deploy again with {option}.",
                )
        argv = [
            sys.executable,
            "-m",
            "llmserve.deploy.watchdog",
            "--state-dir",
            str(self.store.root),
            "--deployment",
            dep.name,
            "--host",
            dep.gateway_host,
            "--port",
            str(dep.gateway_port),
            *(["--grpc-port", str(dep.grpc_port)] if dep.grpc_port else []),
        ]
        launched = procs.launch(
            argv,
            self.store.log_file(dep.name, "gateway"),
            self.store.pid_file(dep.name, "gateway"),
            env=daemon_env(self.store.root, dep.name),
        )
        self.store.set_gateway_process(dep.name, launched.pid, launched.start, launched.session)
        dep = self.store.require(dep.name)
        self._wait_gateway(dep, launched, timeout)
        grpc = f", KServe v2 gRPC on {dep.grpc_address}" if dep.grpc_address else ""
        self.report(f"gateway up on {dep.gateway_url}{grpc} (watchdog pid {launched.pid})")
        return dep

    def _wait_gateway(self, dep: Deployment, launched: procs.Launched | None, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if launched is not None and not procs.alive(launched.pid, launched.start):
                raise GatewayError(
                    f"the gateway exited at start:\n{procs.log_tail(self.store.log_file(dep.name, 'gateway'))}"
                )
            if procs.health(dep.gateway_url) is not None:
                return
            time.sleep(0.1)
        raise GatewayError(
            f"the gateway did not answer on {dep.gateway_url} within {timeout:g} s",
            hint=f"Read its log: {self.store.log_file(dep.name, 'gateway')}",
        )

    def stop_gateway(self, dep: Deployment) -> None:
        procs.terminate(dep.gateway_pid, dep.gateway_start, 40.0, dep.gateway_session)
        self.store.set_gateway_process(dep.name, None, None)

    def apply_routes(self, dep: Deployment, routes: Routes, *, rollout: int | None = None, why: str = "") -> int:
        """Write the table, then make the gateway load it; return only once it is live there."""
        gen = self.store.set_routes(dep.name, routes, rollout=rollout, why=why)
        for _attempt in range(3):
            try:
                r = httpx.post(dep.gateway_url + "/-/reload", headers=self._admin_headers(dep), timeout=10)
                if r.status_code == 200 and r.json()["generation"] >= gen:
                    return gen
            except httpx.HTTPError:
                pass
            dep = self.ensure_gateway(self.store.require(dep.name))  # a dead gateway restarts on the new table
        raise GatewayError(f"the gateway of '{dep.name}' did not apply routes generation {gen}")

    def _admin_headers(self, dep: Deployment) -> dict[str, str]:
        key = key_files(self.store.root, dep.name).client_key()
        return {"Authorization": f"Bearer {key}"} if key else {}

    def stats(self, dep: Deployment) -> dict | None:
        try:
            return httpx.get(dep.gateway_url + "/-/stats", headers=self._admin_headers(dep), timeout=5).json()
        except (httpx.HTTPError, ValueError):
            return None

    def errors_of(self, dep: Deployment, iid: int) -> int:
        s = self.stats(dep) or {}
        return int(s.get("counts", {}).get(str(iid), {}).get("error", 0))

    def wait_drained(self, dep: Deployment, iids: list[int], timeout: float) -> bool:
        """Wait until the gateway has no request in flight to any of iids (it no longer routes to them)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            s = self.stats(dep)
            if s is not None and all(int(s["inflight"].get(str(i), 0)) == 0 for i in iids):
                return True
            if s is None and not self.gateway_alive(dep):
                return True  # no gateway, nothing in flight through it
            time.sleep(0.1)
        return False

    # -- instances ----------------------------------------------------------------------------
    def start_instance(
        self,
        dep: Deployment,
        package: str,
        digest: str | None,
        version: int,
        interface: dict,
        strategy: str,
        serve_args: list[str],
        drain_timeout: float,
        serve_package: str | None = None,
        openai: bool = True,
    ) -> Instance:
        """Start one server. `package` is what the state records (a path, or a store reference as given);
        `serve_package`, when given, is what the server is started with (a store reference pinned by digest);
        `openai`: whether it serves the OpenAI API too (procs.serve_argv)."""
        port, grpc_port = procs.free_port(), procs.free_port()
        inst = self.store.add_instance(dep.name, version, package, digest, interface, strategy, port, grpc_port)
        argv = procs.serve_argv(
            serve_package or package, port, drain_timeout, serve_args, grpc_port=grpc_port, openai=openai
        )
        assert inst.log is not None  # add_instance records the log path with the row
        launched = procs.launch(argv, Path(inst.log), self.pid_file(inst), env=daemon_env(self.store.root, dep.name))
        self.store.set_instance_process(inst.id, launched.pid, launched.start, launched.session, argv)
        self.report(
            f"started v{version} as instance #{inst.id} on 127.0.0.1:{port} (gRPC {grpc_port}, pid {launched.pid}); "
            f"log {inst.log}"
        )
        return self.store.instance(inst.id)

    def pid_file(self, inst: Instance) -> Path:
        return self.store.pid_file(inst.deployment, f"i{inst.id}")

    def adopt(self, inst: Instance) -> Instance:
        """An instance recorded before its pid (the CLI died in between): read the launcher's pid file."""
        if inst.pid is None:
            pid = procs.read_pid_file(self.pid_file(inst))
            if pid is not None:
                self.store.set_instance_process(inst.id, pid, procs.start_time(pid), procs.session_of(pid))
                inst = self.store.instance(inst.id)
        return inst

    def instance_alive(self, inst: Instance) -> bool:
        return procs.alive(inst.pid, inst.pid_start)

    def wait_healthy(self, inst: Instance, timeout: float) -> float:
        """Wait for /health 200; raise HealthCheckFailedError (with the log tail) on exit or timeout."""
        t0 = time.monotonic()
        last_note = t0
        while time.monotonic() - t0 < timeout:
            if not self.instance_alive(inst):
                raise HealthCheckFailedError(
                    f"v{inst.model_version} (instance #{inst.id}) exited before passing its health check; last log lines:\n"
                    + procs.log_tail(inst.log),
                    hint=f"Read the full log: {inst.log}",
                )
            status = procs.health(inst.url)
            if status == 200:
                return time.monotonic() - t0
            if time.monotonic() - last_note > 10:
                last_note = time.monotonic()
                self.report(
                    f"waiting for v{inst.model_version} health ({time.monotonic() - t0:.0f} s, /health {status})"
                )
            time.sleep(0.2)
        raise HealthCheckFailedError(
            f"v{inst.model_version} (instance #{inst.id}) not healthy after {timeout:g} s; last log lines:\n"
            + procs.log_tail(inst.log),
            hint=f"Raise --health-timeout or read {inst.log}",
        )

    def stop_instance(
        self, dep: Deployment, inst: Instance, *, drain_timeout: float, status: str = STOPPED, why: str = ""
    ) -> None:
        """Stop one server after the gateway stopped routing to it: wait for its in-flight requests, then
        SIGTERM (the server drains too), then record it."""
        inst = self.adopt(self.store.instance(inst.id))
        if self.instance_alive(inst):
            self.store.set_instance_status(inst.id, DRAINING)
            self.wait_drained(dep, [inst.id], drain_timeout)
            procs.terminate(inst.pid, inst.pid_start, drain_timeout + 15, inst.session)
        else:
            procs.kill_session(inst.session)  # killed earlier: its engine core may still run
        self.store.set_instance_status(
            inst.id, status, f"v{inst.model_version} (instance #{inst.id}) {status}" + (f": {why}" if why else "")
        )
        self.report(f"v{inst.model_version} (instance #{inst.id}) {status}" + (f": {why}" if why else ""))

    def mark_serving(self, inst: Instance) -> None:
        self.store.set_instance_status(inst.id, SERVING)

    def reconcile(self, dep: Deployment) -> list[str]:
        """Make the records tell the truth about processes (after a crash or a reboot): a serving instance
        whose process is gone is marked failed and taken out of the routes, unless the gateway's
        supervisor is restarting it (a routed instance while the gateway runs)."""
        notes = []
        _gen, routes = self.store.routes(dep.name)
        supervised = routes.instances() if self.gateway_alive(dep) else set()
        changed = False
        for inst in self.store.instances(dep.name):
            inst = self.adopt(inst)
            if inst.status == STARTING:
                continue  # the journal decides (recovery)
            if inst.status == SERVING and inst.id in supervised:
                continue
            if not self.instance_alive(inst):
                procs.kill_session(inst.session)
                self.store.set_instance_status(
                    inst.id, FAILED, f"v{inst.model_version} (instance #{inst.id}) found not running"
                )
                notes.append(f"instance #{inst.id} (v{inst.model_version}) was not running: marked failed")
                if inst.id in routes.instances():
                    routes = without(routes, {inst.id})
                    changed = True
        if changed:
            self.apply_routes(dep, routes, why="removed backends that are not running")
        return notes


def daemon_env(root: Path, name: str) -> dict[str, str]:
    """The environment servers and the gateway start with: this one, minus the caller's API key (servers
    read the deployment's server key from its file; the gateway reads the key files), plus the tag that
    lets `deploy doctor` find them (and their children) without the database."""
    env = {k: v for k, v in os.environ.items() if k != KEY_ENV}
    env[doctor.TAG_ENV] = doctor.tag(root, name)
    return env


def without(routes: Routes, iids: set[int]) -> Routes:
    """The table minus some instances; the remaining default weights are rescaled to 100."""
    default = [m for m in routes.default if m.instance not in iids]
    total = sum(m.weight for m in default)
    if total > 0:
        scaled = [round(m.weight * 100 / total) for m in default]
        scaled[-1] += 100 - sum(scaled)
        for m, w in zip(default, scaled, strict=False):
            m.weight = w
    pinned = {v: [m for m in ms if m.instance not in iids] for v, ms in routes.pinned.items()}
    return Routes(routes.model_id, default, {v: ms for v, ms in pinned.items() if ms})


def stop_recorded_processes(store: StateStore) -> int:
    """Stop every process the state records (servers with their trees, gateways with their watchdogs),
    whatever their status: the last resort after a teardown that could not finish. Returns how many ran."""
    found = 0
    for row in store.db.execute("SELECT pid, pid_start, session FROM instances WHERE pid IS NOT NULL OR session"):
        found += procs.alive(row["pid"], row["pid_start"])
        procs.terminate(row["pid"], row["pid_start"], 10, row["session"])
    for row in store.db.execute("SELECT gateway_pid, gateway_start, gateway_session FROM deployments"):
        found += procs.alive(row[0], row[1])
        procs.terminate(row[0], row[1], 10, row[2])
    return found
