"""The local gateway: one HTTP entry point (and one KServe v2 gRPC entry point) per deployment, in front of
its `llmserve serve` processes.

Run as a daemon by `llmserve deploy` (`python -m llmserve.deploy.gateway --state-dir D --deployment NAME
--port P`); it outlives the CLI and reloads its table (and the servers' gRPC ports) from the state database.

Routing (documented in `llmserve deploy --help`):
  * A request that names no version goes to the default pool, by weight (smooth weighted round robin,
    so 10% is exactly 1 request in 10): red-black rollouts shift these weights.
  * A request that names a version goes to that version's servers; versions that are not serving get 404.
    Ways to name one: header `X-Model-Version: 2`; OpenAI body `"model": "<modelId>:2"` (rewritten to
    `<modelId>` before forwarding); KServe v2 path `/v2/models/<modelId>/versions/2/...`.
  * `GET /v1/models` is forwarded to a default server and gains one `<modelId>:<version>` entry per
    serving version.
Everything else (OpenAI /v1/..., KServe v2 /v2/...) is forwarded as is; responses are streamed
chunk by chunk, so server-sent events pass through unbuffered.

KServe v2 gRPC (llmserve.deploy.grpc_proxy): on the deployment's `grpc_port` (config; `llmserve deploy
--grpc-port`, default a free port chosen when the deployment is made, then kept: on by default because the
servers behind it speak gRPC anyway, and a fixed port+1 could be taken), every RPC is proxied as raw bytes
to the servers' loopback gRPC ports, unary and ModelStreamInfer streams alike, with metadata, trailing
metadata, status codes, deadlines and cancellation passed through. Routing, in-flight counts, retries,
holding and the API key are the HTTP rules below: a version is named with metadata `x-model-version` or the
request's `model_version` / `version` field; ServerLive, ServerReady and ModelReady are answered here.

Zero-downtime rules: a table swap is atomic (the pick and the in-flight count happen in one event-loop
step, so after `POST /-/reload` returns no new request reaches a removed backend); in-flight requests
are counted per backend (`GET /-/stats`), and the CLI stops a backend only once its count is zero.
A connection refused/reset before any response byte is retried on another pick (inference is free of
side effects), so a backend that dies between health checks does not fail the caller.

Authentication (llmserve.deploy.local_keys): when the deployment has a key, every route but GET /health
wants it (`Authorization: Bearer KEY` or `X-API-Key`); requests are forwarded with the servers' own key
instead of the caller's. Admin endpoints (POST /-/reload, GET /-/stats, GET /-/routes) want the key too
and answer on loopback only.

Self-healing (llmserve.deploy.supervisor): servers that die are taken out of rotation at once and
restarted; a request with no backend left waits for one (up to the deployment's hold timeout).
Idle versions: when the deployment's config has `idle_timeout_s`, the gateway stops pinned-only
versions idle that long (never a default-pool version, never the newest), under the deployment lock.
"""

from __future__ import annotations

import argparse
import asyncio
import hmac
import json
import logging
import os
import re
import signal
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

import aiohttp
from aiohttp import web
from yarl import URL

from llmserve.deploy import procs
from llmserve.deploy.local_keys import key_files
from llmserve.deploy.state import STOPPED, DeploymentLock, Member, Routes, StateStore
from llmserve.deploy.strategy import idle_versions
from llmserve.deploy.supervisor import Health, Supervisor

if TYPE_CHECKING:
    from llmserve.deploy.grpc_proxy import GrpcProxy

log = logging.getLogger("llmserve.gateway")

HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailers",
    "transfer-encoding",
    "upgrade",
    "host",
    "content-length",
}
VERSION_HEADER = "x-model-version"
GATEWAY_ONLY = {VERSION_HEADER, "authorization", "x-api-key"}  # consumed here, not forwarded as sent
KSERVE_VERSIONED = re.compile(r"^/v2/models/([^/]+)/versions/([^/]+)(/.*)?$")
RETRYABLE = (aiohttp.ClientConnectorError, aiohttp.ServerDisconnectedError, aiohttp.ClientOSError)
DEFAULT_HOLD_S = (
    300.0  # how long a request waits for a restarting backend (config hold_timeout_s, else health_timeout_s)
)
MAX_HELD = 1024  # requests held at once; more get 503 at once
T = TypeVar("T")


class NoRoute(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass
class Table:
    generation: int
    routes: Routes
    current: dict[int, float] = field(default_factory=dict)  # smooth WRR state

    def candidates(self, version: int | None) -> list[Member]:
        """Who may serve a request: the default pool (weight > 0), or the servers of the version named."""
        if version is None:
            members = [m for m in self.routes.default if m.weight > 0]
            if not members:
                raise NoRoute(503, "no version of this deployment is serving")
            return members
        members = self.routes.pinned.get(version) or []
        if not members:
            served = sorted(self.routes.pinned)
            raise NoRoute(
                404, f"version {version} of '{self.routes.model_id}' is not serving; serving versions: {served}"
            )
        return members

    def pick(self, version: int | None, exclude: set[int]) -> Member | None:
        """The next backend among the candidates not excluded (down, or already tried for this request);
        None when every candidate is excluded."""
        members = [m for m in self.candidates(version) if m.instance not in exclude]
        if not members:
            return None
        if version is not None:
            key = -version  # per-version round robin counter
            n = int(self.current.get(key, 0))
            self.current[key] = n + 1
            return members[n % len(members)]
        total = sum(m.weight for m in members)
        best = members[0]
        for m in members:
            self.current[m.instance] = self.current.get(m.instance, 0.0) + m.weight
            if self.current[m.instance] > self.current[best.instance]:
                best = m
        self.current[best.instance] -= total
        return best


class Gateway:
    def __init__(self, store: StateStore, deployment: str, grpc_socket: socket.socket | None = None):
        self.store = store
        self.grpc_socket = grpc_socket  # the gRPC port's listening socket, held by the watchdog across restarts
        self.deployment = deployment
        gen, routes, self.grpc_ports = self._read_table()
        self.table = Table(gen, routes)
        self.inflight: dict[int, int] = {}
        self.counts: dict[int, dict[str, int]] = {}
        self.last_request: dict[int, float] = {}
        self.session: aiohttp.ClientSession | None = None
        self.started = time.time()
        self.supervisor = Supervisor(store, deployment, env=dict(os.environ))
        self.down: set[int] = set()  # routed backends that cannot take requests now
        self.recovering: set[int] = set()  # ... of which the supervisor is bringing these back
        self.held = 0  # requests waiting for a backend to come back
        dep = store.deployment(deployment)
        self.hold_s = hold_timeout(dep.config if dep else {})
        self._changed: asyncio.Event | None = None  # set (and replaced) when backends come or go
        self.keys = key_files(store.root, deployment)
        self.client_key: bytes | None = None  # None: the deployment is open
        self.backend_key: str | None = None
        self._keys_seen: tuple = ()
        self.load_keys()
        self.grpc: GrpcProxy | None = None  # the KServe v2 gRPC entry point, when the deployment has a grpc_port

    def load_keys(self) -> None:
        """(Re)read the key files when they changed (a rotation writes a new client key)."""
        seen = tuple(_mtime(p) for p in (self.keys.client, self.keys.backend))
        if seen != self._keys_seen:
            client = self.keys.client_key()
            self.client_key = client.encode() if client else None
            self.backend_key = self.keys.backend_key()
            self._keys_seen = seen
            log.info("API key %s", "required" if client else "not required (open deployment)")

    def authorized(self, request: web.Request) -> bool:
        if self.client_key is None:
            return True
        presented = request.headers.get("Authorization", "")
        token = presented[7:].strip() if presented[:7].lower() == "bearer " else request.headers.get("X-API-Key", "")
        return hmac.compare_digest(token.encode(), self.client_key)

    # -- table --------------------------------------------------------------------------------
    def _read_table(self) -> tuple[int, Routes, dict[int, int]]:
        """The routes, and the gRPC port of each server (read after them: a server in the table has its
        port recorded since it was started). Blocking: call in a thread once the loop runs."""
        gen, routes = self.store.routes(self.deployment)
        return gen, routes, self.store.grpc_ports(self.deployment)

    def _set_table(self, gen: int, routes: Routes, grpc_ports: dict[int, int]) -> None:
        self.table = Table(gen, routes)
        self.grpc_ports = grpc_ports
        self._wake()

    def _wake(self) -> None:
        if self._changed is not None:
            self._changed.set()
        self._changed = asyncio.Event()

    def apply_health(self, health: Health) -> None:
        if set(health.down) != self.down or set(health.recovering) != self.recovering:
            gone, back = set(health.down) - self.down, self.down - set(health.down)
            if gone or back:
                log.info("backends down: %s (recovering %s)", sorted(health.down), sorted(health.recovering))
            self.down, self.recovering = set(health.down), set(health.recovering)
            self._wake()

    def _may_come_back(self, version: int | None, skip: frozenset[int] = frozenset()) -> bool:
        """Whether waiting can help: some candidate is being restarted, or failed only on this request
        (the supervisor has not judged it yet)."""
        return any(
            m.instance in self.recovering or m.instance not in self.down
            for m in self.table.candidates(version)
            if m.instance not in skip
        )

    async def _wait_for_backend(self, deadline: float) -> bool:
        left = deadline - asyncio.get_running_loop().time()
        if left <= 0:
            return False
        if self._changed is None:
            self._wake()
        assert self._changed is not None
        event = self._changed
        self.held += 1
        try:
            await asyncio.wait_for(event.wait(), left)
            return True
        except TimeoutError:
            return False
        finally:
            self.held -= 1

    def _account(self, iid: int, ok: bool) -> None:
        c = self.counts.setdefault(iid, {"ok": 0, "error": 0})
        c["ok" if ok else "error"] += 1

    # -- request parsing ----------------------------------------------------------------------
    def _requested(self, request: web.Request, body: bytes) -> tuple[int | None, str, bytes]:
        """(version or None, upstream path, upstream body)."""
        path = request.rel_url.path
        version: int | None = None
        m = KSERVE_VERSIONED.match(path)
        if m:
            version = _as_version(m.group(2))
        header = request.headers.get(VERSION_HEADER)
        if header:
            version = _as_version(header)
        if body and request.content_type == "application/json" and path.startswith("/v1/"):
            try:
                data = json.loads(body)
            except ValueError:
                data = None
            model = data.get("model") if isinstance(data, dict) else None
            if isinstance(model, str) and ":" in model:
                name, _, ver = model.rpartition(":")
                if name == self.table.routes.model_id:
                    version = _as_version(ver)
                    data["model"] = name
                    body = json.dumps(data).encode()
        return version, path, body

    # -- handlers -----------------------------------------------------------------------------
    async def handle_reload(self, request: web.Request) -> web.Response:
        await asyncio.to_thread(self.load_keys)  # first: a rotation's CLI presents the new key
        self._admin(request)
        gen, routes, ports = await asyncio.to_thread(self._read_table)
        # Swap in the loop thread: picks never see a half-applied table.
        if gen != self.table.generation:
            self._set_table(gen, routes, ports)
            log.info("routes generation %d applied", gen)
        await self._start_grpc()  # a deployment made before the gateway spoke gRPC gains a port on its next deploy
        return web.json_response({"generation": self.table.generation})

    async def handle_stats(self, request: web.Request) -> web.Response:
        self._admin(request)
        return web.json_response(
            {
                "generation": self.table.generation,
                "inflight": {str(k): v for k, v in self.inflight.items()},
                "counts": {str(k): v for k, v in self.counts.items()},
                "last_request": {str(k): v for k, v in self.last_request.items()},
                "uptime_s": time.time() - self.started,
            }
        )

    async def handle_routes(self, request: web.Request) -> web.Response:
        self._admin(request)
        return web.json_response({"generation": self.table.generation, **self.table.routes.to_dict()})

    async def handle_health(self, request: web.Request) -> web.Response:
        """200 while requests naming no version can be served; the body names every routed backend that
        cannot serve now (restarting, or failed for good), so a degraded deployment is visible here."""
        routes = self.table.routes
        up = [m for m in routes.default if m.weight > 0 and m.instance not in self.down]
        versions = {m.instance: m.version for ms in routes.pinned.values() for m in ms}
        versions.update({m.instance: m.version for m in routes.default})
        down = [
            {"instance": i, "version": versions.get(i), "state": "restarting" if i in self.recovering else "failed"}
            for i in sorted(self.down)
            if i in versions
        ]
        status = ("degraded" if down else "ok") if up else "no-backend"
        return web.json_response(
            {"status": status, "generation": self.table.generation, "down": down}, status=200 if up else 503
        )

    def _admin(self, request: web.Request) -> None:
        _loopback_only(request)
        if not self.authorized(request):
            raise web.HTTPUnauthorized(text="missing or invalid API key", headers={"WWW-Authenticate": "Bearer"})

    async def handle_proxy(self, request: web.Request) -> web.StreamResponse:
        if not self.authorized(request):
            message = "missing or invalid API key: send 'Authorization: Bearer <key>'"
            refusal: dict = (
                {"error": message}  # KServe v2 clients read a string
                if request.path.startswith("/v2")
                else {"error": {"message": message, "type": "invalid_request_error", "code": "invalid_api_key"}}
            )
            return web.json_response(refusal, status=401, headers={"WWW-Authenticate": "Bearer"})
        body = await request.read()
        try:
            version, path, body = self._requested(request, body)
        except NoRoute as exc:
            return _error(exc.status, exc.message)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP | GATEWAY_ONLY}
        if self.backend_key:
            headers["Authorization"] = f"Bearer {self.backend_key}"  # the servers' key, not the caller's
        elif "authorization" in {k.lower() for k in request.headers}:
            headers["Authorization"] = request.headers["Authorization"]
        try:
            return await self.route(
                version, lambda member: self._forward(request, member, path, headers, body, version), "a request"
            )
        except NoRoute as exc:
            return _error(exc.status, exc.message)

    async def route(
        self,
        version: int | None,
        attempt: Callable[[Member], Awaitable[T]],
        what: str,
        skip: frozenset[int] = frozenset(),
    ) -> T:
        """Run attempt(member) on a backend picked for `version` (HTTP and gRPC alike): the pick and the
        in-flight count happen in one loop step; attempt raises _NotStarted when the backend never took the
        call, and it is retried on another pick; with no backend left, the call is held while one may come back.
        `skip`: backends that cannot take this kind of call at all. Raises NoRoute when nothing can serve it."""
        tried: set[int] = set()
        last_exc: BaseException | None = None
        deadline: float | None = None
        while True:
            member = self.table.pick(version, tried | self.down | skip)
            if member is None and not self._may_come_back(version, skip):
                if skip and not [m for m in self.table.candidates(version) if m.instance not in skip]:
                    raise NoRoute(503, "no server of this version can take this call (see the gateway's log)")
                raise NoRoute(503, "every server of this deployment has failed; see `llmserve status`")
            if member is None:
                # No backend can take it now, but one is coming back (a restart): hold the request
                # rather than fail it, within the deployment's hold timeout and MAX_HELD requests.
                if deadline is None:
                    deadline = asyncio.get_running_loop().time() + self.hold_s
                if self.held >= MAX_HELD or not await self._wait_for_backend(deadline):
                    why = f"last error: {last_exc}" if last_exc else f"held {self.hold_s:g} s"
                    log.warning("gave up on %s after holding it: %s (%d held)", what, why, self.held)
                    raise NoRoute(503, f"no server of this deployment could take the request ({why})")
                tried.clear()
                continue
            iid = member.instance
            # pick + count in the same loop step as the table read: a reload cannot slip in between.
            self.inflight[iid] = self.inflight.get(iid, 0) + 1
            self.last_request[iid] = time.time()
            try:
                return await attempt(member)
            except _NotStarted as exc:
                last_exc = exc.__cause__
                tried.add(iid)
                self._account(iid, ok=False)
                log.warning("backend #%d (v%d) unreachable (%s); retrying elsewhere", iid, member.version, last_exc)
            finally:
                self.inflight[iid] -= 1

    def _session(self) -> aiohttp.ClientSession:
        if self.session is None:  # made in on_startup, inside the running loop
            raise RuntimeError("gateway used before its HTTP session was started")
        return self.session

    async def _forward(
        self, request: web.Request, member: Member, path: str, headers: dict, body: bytes, version: int | None
    ) -> web.StreamResponse:
        # The path and query exactly as the client sent them: decoding %3F, %23, %2F or resolving `..`
        # here would send the backend a different request than the one the client made.
        url = URL(member.url + request.raw_path, encoded=True)
        try:
            upstream = await self._session().request(request.method, url, headers=headers, data=body or None)
        except RETRYABLE as exc:
            raise _NotStarted() from exc
        async with upstream:
            self._account(member.instance, ok=upstream.status < 500)
            if path == "/v1/models" and request.method == "GET" and upstream.status == 200:
                return await self._models(upstream)
            response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
            for k, v in upstream.headers.items():
                if k.lower() not in HOP_BY_HOP:
                    response.headers[k] = v
            response.headers["X-Served-Version"] = str(member.version)
            if upstream.content_length is not None:
                response.content_length = upstream.content_length
            await response.prepare(request)
            try:
                async for chunk in upstream.content.iter_any():
                    await response.write(chunk)
            except aiohttp.ClientError as exc:
                self._account(member.instance, ok=False)  # the backend broke off mid-response
                if not upstream.headers.get("content-type", "").startswith("text/event-stream"):
                    raise  # the connection is cut before the body's end: the client sees a broken body
                # A stream's client would see a clean end: say what happened in the stream's own terms.
                log.warning("backend #%d (v%d) broke off a stream: %s", member.instance, member.version, exc)
                await response.write(_stream_error(member.version))
            await response.write_eof()
            return response

    async def _models(self, upstream: aiohttp.ClientResponse) -> web.Response:
        data = await upstream.json()
        entries = data.get("data") or []
        base = next((e for e in entries if e.get("id") == self.table.routes.model_id), None)
        if base is not None:
            for v in sorted(self.table.routes.pinned):
                entries.append({**base, "id": f"{self.table.routes.model_id}:{v}"})
        return web.json_response(data)

    # -- lifecycle ----------------------------------------------------------------------------
    async def _start_grpc(self) -> None:
        """Serve KServe v2 gRPC on the deployment's grpc_port, once (a port that cannot be bound is logged,
        and HTTP keeps serving: `deploy` checks the port is free before it starts the gateway)."""
        if self.grpc is not None:
            return
        dep = await asyncio.to_thread(self.store.deployment, self.deployment)
        if dep is None or not dep.grpc_port:
            return
        # Imported here: grpc_proxy imports this module, and grpcio comes with the servers' `serve` extra.
        from llmserve.deploy.grpc_proxy import GrpcProxy

        proxy = GrpcProxy(self)
        held = self.grpc_socket
        if held is not None and held.getsockname()[1] != dep.grpc_port:
            held = None  # the port changed since the watchdog started; the next watchdog will hold the new one
        try:
            await proxy.start(dep.gateway_host, dep.grpc_port, held)
        except RuntimeError as exc:
            log.error("cannot serve gRPC on %s: %s", dep.grpc_address, exc)
            return
        self.grpc = proxy
        log.info("KServe v2 gRPC on %s", dep.grpc_address)

    async def _poll(self) -> None:
        """Pick up route changes written while a reload call was lost; flush last-request times."""
        tick = 0
        while True:
            await asyncio.sleep(0.5)
            tick += 1
            try:
                self.apply_health(await asyncio.to_thread(self.supervisor.check, self.table.routes.instances()))
                gen, routes, ports = await asyncio.to_thread(self._read_table)
                if gen != self.table.generation:
                    self._set_table(gen, routes, ports)
                    log.info("routes generation %d picked up by polling", gen)
                if tick % 10 == 0:
                    await asyncio.to_thread(self.store.touch_instances, dict(self.last_request))
                    await asyncio.to_thread(self.load_keys)
                if tick % 10 == 5:
                    await self._reap()
                    if self.grpc is not None:
                        await self.grpc.close_unused_channels()
            except Exception:  # keep serving whatever happens to the database
                log.exception("state poll failed")

    async def _reap(self) -> None:
        dep = await asyncio.to_thread(self.store.deployment, self.deployment)
        if dep is not None:
            self.hold_s = hold_timeout(dep.config)
        idle = (dep.config or {}).get("idle_timeout_s") if dep else None
        if not idle:
            return
        routes = self.table.routes
        if not routes.pinned:
            return
        default_ids = {m.instance for m in routes.default if m.weight > 0}
        defaults = {v for v, ms in routes.pinned.items() if any(m.instance in default_ids for m in ms)}
        last_active: dict[int, float] = {}
        for version, members in routes.pinned.items():
            insts = [await asyncio.to_thread(self.store.instance, m.instance) for m in members]
            last_active[version] = max(
                max(self.last_request.get(i.id, 0.0), i.last_request or 0.0, i.ready_at or 0.0) for i in insts
            )
        now = time.time()
        for version in idle_versions(set(routes.pinned), last_active, defaults, idle, now):
            await self._retire_version(version, idle, now - last_active[version])

    async def _retire_version(self, version: int, idle: float, idle_for: float) -> None:
        lock = DeploymentLock(self.store, self.deployment)
        if not await asyncio.to_thread(lock.acquire):
            return  # a CLI is changing the deployment; try again later
        try:
            gen, routes = await asyncio.to_thread(self.store.routes, self.deployment)
            members = routes.pinned.pop(version, [])
            if not members:
                return
            await asyncio.to_thread(
                self.store.set_routes,
                self.deployment,
                routes,
                why=f"v{version} idle for {idle_for:.0f} s (idle timeout {idle:g} s)",
            )
            gen, routes, ports = await asyncio.to_thread(self._read_table)
            self._set_table(gen, routes, ports)

            for m in members:
                for _ in range(600):
                    if self.inflight.get(m.instance, 0) == 0:
                        break
                    await asyncio.sleep(0.1)
                inst = await asyncio.to_thread(self.store.instance, m.instance)
                await asyncio.to_thread(self.store.set_instance_status, inst.id, "draining")
                await asyncio.to_thread(procs.terminate, inst.pid, inst.pid_start, 60.0, inst.session)
                await asyncio.to_thread(
                    self.store.set_instance_status,
                    inst.id,
                    STOPPED,
                    f"v{version} (instance #{inst.id}) stopped after {idle_for:.0f} s idle",
                )
        finally:
            lock.release()


class _NotStarted(Exception):
    """The upstream request failed before any response: safe to retry elsewhere."""


def _as_version(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise NoRoute(400, f"model version must be a positive integer, got '{text}'") from None
    if v < 1:
        raise NoRoute(400, f"model version must be a positive integer, got '{text}'")
    return v


def hold_timeout(config: dict) -> float:
    """By default a request waits as long as a restart may take: giving up earlier would fail requests
    the restart is about to serve."""
    return float(config.get("hold_timeout_s") or config.get("health_timeout_s") or DEFAULT_HOLD_S)


def _mtime(path) -> float | None:
    try:
        return path.stat().st_mtime
    except FileNotFoundError:
        return None


def _loopback_only(request: web.Request) -> None:
    """The admin routes change or reveal the routing: only for the CLI on this machine, whatever --host."""
    if request.remote not in ("127.0.0.1", "::1") and not (request.remote or "").startswith("::ffff:127."):
        raise web.HTTPForbidden(text="admin routes answer on the loopback interface only")


def _stream_error(version: int) -> bytes:
    """An OpenAI-style error event (what vLLM's server sends when a stream fails), then no [DONE]."""
    error = {
        "message": f"the server of v{version} stopped in the middle of this stream; retry the request",
        "type": "server_error",
        "code": 502,
    }
    return b"data: " + json.dumps({"error": error}).encode() + b"\n\n"


def _error(status: int, message: str) -> web.Response:
    kind = {400: "invalid_request_error", 404: "not_found_error"}.get(status, "service_unavailable")
    return web.json_response({"error": {"message": message, "type": kind, "code": status}}, status=status)


def build_app(gateway: Gateway) -> web.Application:
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/-/reload", gateway.handle_reload)
    app.router.add_get("/-/stats", gateway.handle_stats)
    app.router.add_get("/-/routes", gateway.handle_routes)
    app.router.add_get("/health", gateway.handle_health)
    app.router.add_route("*", "/{tail:.*}", gateway.handle_proxy)

    async def on_startup(app: web.Application) -> None:
        # Keep-alive shorter than uvicorn's 5 s, so a pooled connection is never one the server is closing.
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=2.0)
        gateway.session = aiohttp.ClientSession(
            connector=connector, auto_decompress=False, timeout=aiohttp.ClientTimeout(total=None, sock_connect=5)
        )
        app["poller"] = asyncio.create_task(gateway._poll())
        await gateway._start_grpc()  # before the HTTP site starts: once /health answers, gRPC listens too

    async def on_shutdown(app: web.Application) -> None:
        # gRPC calls in flight get the same drain time as HTTP requests (aiohttp's shutdown_timeout).
        if gateway.grpc is not None:
            await gateway.grpc.stop(grace=30)

    async def on_cleanup(app: web.Application) -> None:
        app["poller"].cancel()
        await gateway._session().close()
        gateway.store.touch_instances(dict(gateway.last_request))

    app.on_startup.append(on_startup)
    app.on_shutdown.append(on_shutdown)
    app.on_cleanup.append(on_cleanup)
    return app


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="llmserve-gateway", description="Local gateway of one llmserve deployment.")
    parser.add_argument("--state-dir", required=True)
    parser.add_argument("--deployment", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument(
        "--fd", type=int, help="a listening socket inherited from the watchdog (which keeps it open across restarts)"
    )
    parser.add_argument("--grpc-fd", type=int, help="the same, for the deployment's gRPC port")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s gateway %(levelname)s %(message)s", datefmt="%H:%M:%S")
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    store = StateStore(args.state_dir)
    gateway = Gateway(store, args.deployment, socket.socket(fileno=args.grpc_fd) if args.grpc_fd is not None else None)
    log.info(
        "gateway for '%s' on %s:%d, routes generation %d",
        args.deployment,
        args.host,
        args.port,
        gateway.table.generation,
    )
    # SIGTERM: stop accepting, let in-flight requests finish (aiohttp's shutdown_timeout), exit 0.
    where: dict = (
        {"sock": socket.socket(fileno=args.fd)} if args.fd is not None else {"host": args.host, "port": args.port}
    )
    web.run_app(
        build_app(gateway),
        **where,
        print=None,
        shutdown_timeout=30,
        handle_signals=True,
        access_log=None,
    )
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.default_int_handler)
    # The module proper, not this __main__ copy: grpc_proxy imports llmserve.deploy.gateway, and its
    # NoRoute must be the one route() raises.
    from llmserve.deploy.gateway import main as _main

    raise SystemExit(_main())
