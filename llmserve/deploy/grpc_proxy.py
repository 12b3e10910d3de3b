"""The gateway's KServe v2 gRPC entry point: a byte-level proxy in front of the servers' own gRPC ports.

Every method of any service is forwarded as raw bytes (no message is decoded but for one field, below):
`inference.GRPCInferenceService/ModelStreamInfer` as a stream (stream-stream), everything else as unary.
Request metadata goes to the server (minus the caller's key, which is replaced by the servers' own), and
the server's initial metadata, trailing metadata, status code and details come back as they were sent,
plus `x-served-version` in the initial metadata. The caller's deadline goes upstream with the call, and a
caller that cancels cancels the upstream call.

Routing is the HTTP routes' (llmserve.deploy.gateway): a call that names a version goes to that version's
servers, one that names none to the default pool by weight, with the same pick, in-flight counts (so the
CLI's drain waits for gRPC calls too), retries and holding while a server restarts. A call names a version
with metadata `x-model-version: 2`, or with the `version` field of a KServe request (field 2 of
ModelInferRequest, ModelReadyRequest, ModelMetadataRequest, ModelConfigRequest, ModelStatisticsRequest:
read from the raw bytes); the metadata wins, as the header does over the path on HTTP. A stream goes to
one server, chosen by its first request.

Retries: a unary call that fails UNAVAILABLE (connection refused or reset, or a server draining) is sent
to another pick: inference has no side effect, and the caller has seen nothing yet. A stream is retried
the same way until the server's first response; its requests so far are replayed. After that, a server
that dies ends the stream with its status (UNAVAILABLE), never with a silent clean end.

Answered here, from the gateway's view, without an API key (health probes, as `llmserve serve` does):
ServerLive (true while the gateway runs), ServerReady (true while requests naming no version can be
served: what GET /health says), ModelReady (this deployment's model, and the version named if any, has a
server up). Everything else wants the deployment's key, as metadata `authorization: Bearer KEY` or
`x-api-key: KEY`; without it: UNAUTHENTICATED.

The port is the deployment's `grpc_port` (`llmserve deploy --grpc-port`, default a free port chosen at
creation), on the gateway's host. The watchdog holds its listening socket, as it holds the HTTP port's, and
the gateway relays each connection accepted there to its gRPC server on a loopback port
(llmserve.deploy.tcp_relay): calls made while the gateway restarts wait in the backlog and are served by
the next gateway, instead of failing UNAVAILABLE. Only calls in flight on the gateway that died fail.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import socket
import time
from collections import deque
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Any

import grpc

from llmserve.deploy.gateway import VERSION_HEADER, NoRoute, _as_version, _NotStarted
from llmserve.deploy.state import Member
from llmserve.deploy.tcp_relay import Relay

if TYPE_CHECKING:
    from llmserve.deploy.gateway import Gateway

log = logging.getLogger("llmserve.gateway")

SERVICE = "/inference.GRPCInferenceService/"
STREAMING = {SERVICE + "ModelStreamInfer"}
ANSWERED_HERE = {SERVICE + "ServerLive", SERVICE + "ServerReady", SERVICE + "ModelReady"}
# Requests whose field 2 is the model version (all name the model in field 1).
VERSIONED = {
    SERVICE + m
    for m in ("ModelInfer", "ModelStreamInfer", "ModelReady", "ModelMetadata", "ModelConfig", "ModelStatistics")
}
NOT_FORWARDED = {"authorization", "x-api-key", VERSION_HEADER, "user-agent", "te", "content-type"}
SERVER_ERRORS = {
    grpc.StatusCode.UNKNOWN,
    grpc.StatusCode.INTERNAL,
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DATA_LOSS,
}
NO_ROUTE_CODES = {400: grpc.StatusCode.INVALID_ARGUMENT, 404: grpc.StatusCode.NOT_FOUND}
MAX_MESSAGE_BYTES = 64 * 1024 * 1024  # what the HTTP side takes in a body
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", -1),
    ("grpc.max_receive_message_length", -1),
    ("grpc.enable_retries", 0),  # the gateway retries itself, knowing which calls are safe to
    # A server restarted on its port is reachable again within a second, not after gRPC's default backoff
    # (up to 120 s, during which every call on the channel fails at once).
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]
CONNECT_S = 5.0  # how long a call waits for its server's channel to connect before trying another server
UNAUTHENTICATED_MSG = "missing or invalid API key: send metadata 'authorization: Bearer <key>'"


# -- the one field read from a message ------------------------------------------------------------
def _varint(data: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if i >= len(data) or shift > 63:
            raise ValueError("truncated varint")
        b = data[i]
        i += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, i
        shift += 7


def string_field(data: bytes, number: int) -> str | None:
    """The last value of string field `number` of a serialized protobuf message (as protobuf reads it),
    or None when absent or the bytes do not parse (the server then says what is wrong with them)."""
    found: str | None = None
    i = 0
    try:
        while i < len(data):
            key, i = _varint(data, i)
            wire = key & 7
            if wire == 0:
                _, i = _varint(data, i)
            elif wire == 1:
                i += 8
            elif wire == 5:
                i += 4
            elif wire == 2:
                length, i = _varint(data, i)
                if key >> 3 == number:
                    found = data[i : i + length].decode("utf-8", "replace")
                i += length
            else:
                return None  # groups: not in KServe's messages
    except ValueError:
        return None
    return found if i == len(data) else None


def _bool_message(value: bool) -> bytes:
    """A message whose field 1 is a bool (ServerLiveResponse, ServerReadyResponse, ModelReadyResponse)."""
    return b"\x08\x01" if value else b""


# -- the proxy ------------------------------------------------------------------------------------
class GrpcProxy(grpc.GenericRpcHandler):
    def __init__(self, gateway: Gateway):
        self.gw = gateway
        self.channels: dict[str, grpc.aio.Channel] = {}
        self.owners: dict[str, int] = {}  # channel address -> the instance it was opened for
        self.server: grpc.aio.Server | None = None
        self.relay: Relay | None = None
        self.port: int | None = None

    async def start(self, host: str, port: int, listening: socket.socket | None = None) -> None:
        """Serve on host:port, or on `listening` (the watchdog's socket for that port) through a relay."""
        server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_send_message_length", -1),
                ("grpc.so_reuseport", 0),  # never share the port with another gateway
            ]
        )
        server.add_generic_rpc_handlers((self,))
        if listening is None:
            where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
            bound = server.add_insecure_port(where)  # raises RuntimeError when the port is taken
            await server.start()
        else:
            inner = server.add_insecure_port("127.0.0.1:0")
            await server.start()  # before the relay accepts, so no relayed connection is refused
            self.relay = Relay("127.0.0.1", inner)
            await self.relay.start(listening)
            bound = listening.getsockname()[1]
        self.server, self.port = server, bound

    async def stop(self, grace: float) -> None:
        """Refuse new calls, let in-flight ones finish within grace, then close the upstream channels."""
        if self.relay is not None:
            await self.relay.stop_accepting()
        if self.server is not None:
            await self.server.stop(grace)
            self.server = None
        if self.relay is not None:
            await self.relay.close()
            self.relay = None
        for channel in self.channels.values():
            await channel.close()
        self.channels.clear()

    async def close_unused_channels(self) -> None:
        """Channels of servers no longer in the table and with nothing in flight (called by the poller)."""
        ports = self.gw.grpc_ports
        routed = {f"127.0.0.1:{ports[i]}" for i in self.gw.table.routes.instances() if i in ports}
        for address in [a for a in self.channels if a not in routed]:
            if not self.gw.inflight.get(self.owners.get(address, -1), 0):
                self.owners.pop(address, None)
                await self.channels.pop(address).close()

    async def _channel(self, member: Member) -> grpc.aio.Channel:
        """The member's channel, connected (raises _NotStarted when it cannot connect within CONNECT_S)."""
        address = f"127.0.0.1:{self.gw.grpc_ports[member.instance]}"
        channel = self.channels.get(address)
        if channel is None:
            channel = self.channels[address] = grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS)
        self.owners[address] = member.instance
        if channel.get_state(try_to_connect=True) != grpc.ChannelConnectivity.READY:
            try:
                await asyncio.wait_for(channel.channel_ready(), CONNECT_S)
            except TimeoutError:
                raise _NotStarted() from ConnectionError(f"cannot connect to {address} within {CONNECT_S:g} s")
        return channel

    # -- grpc.GenericRpcHandler ----------------------------------------------------------------
    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        method: str = handler_call_details.method
        if method in STREAMING:

            async def stream(request_iterator: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> None:
                await self._stream(method, request_iterator, context)

            return grpc.stream_stream_rpc_method_handler(stream)

        async def unary(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
            return await self._unary(method, request, context)

        return grpc.unary_unary_rpc_method_handler(unary)

    # -- shared steps ------------------------------------------------------------------------------
    def _authorized(self, md: dict[str, Any]) -> bool:
        key = self.gw.client_key
        if key is None:
            return True
        auth = md.get("authorization", "")
        presented = (
            auth[7:].strip() if isinstance(auth, str) and auth[:7].lower() == "bearer " else md.get("x-api-key", "")
        )
        if isinstance(presented, str):
            presented = presented.encode()
        return bool(presented) and hmac.compare_digest(presented, key)

    def _upstream_metadata(self, metadata: Sequence[tuple[str, Any]], md: dict[str, Any]) -> list[tuple[str, Any]]:
        out = [(k, v) for k, v in metadata if k.lower() not in NOT_FORWARDED and not k.startswith(("grpc-", ":"))]
        if self.gw.backend_key:
            out.append(("authorization", f"Bearer {self.gw.backend_key}"))  # the servers' key, not the caller's
        elif "authorization" in md:
            out.append(("authorization", md["authorization"]))
        return out

    def _version(self, method: str, md: dict[str, Any], first: bytes | None) -> int | None:
        header = md.get(VERSION_HEADER)
        if header:
            return _as_version(header if isinstance(header, str) else header.decode())
        if first is not None and method in VERSIONED:
            named = string_field(first, 2)
            if named:
                return _as_version(named)
        return None

    def _without_port(self) -> frozenset[int]:
        return frozenset(self.gw.table.routes.instances() - set(self.gw.grpc_ports))

    @staticmethod
    def _timeout(context: grpc.aio.ServicerContext) -> float | None:
        left = context.time_remaining()
        return None if left is None or left > 10**8 else max(left, 0.001)

    async def _begin(self, method: str, context: grpc.aio.ServicerContext) -> dict[str, Any]:
        """The caller's metadata as a dict, once the key is checked (aborts UNAUTHENTICATED otherwise)."""
        md = {k.lower(): v for k, v in (context.invocation_metadata() or ())}
        if not self._authorized(md):
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, UNAUTHENTICATED_MSG)
        return md

    async def _no_route(self, context: grpc.aio.ServicerContext, exc: NoRoute) -> None:
        await context.abort(NO_ROUTE_CODES.get(exc.status, grpc.StatusCode.UNAVAILABLE), exc.message)

    def _served_metadata(
        self, upstream: Sequence[tuple[str, Any]] | None, member: Member
    ) -> tuple[tuple[str, Any], ...]:
        return (*_user_metadata(upstream), ("x-served-version", str(member.version)))

    async def _finish_error(self, context: grpc.aio.ServicerContext, member: Member, exc: grpc.aio.AioRpcError) -> None:
        self.gw._account(member.instance, ok=exc.code() not in SERVER_ERRORS)
        await context.abort(exc.code(), exc.details() or "", _user_metadata(exc.trailing_metadata()))

    # -- unary ---------------------------------------------------------------------------------
    async def _unary(self, method: str, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        if method in ANSWERED_HERE:
            return self._answer(method, request)
        md = await self._begin(method, context)
        try:
            version = self._version(method, md, request)
        except NoRoute as exc:
            await self._no_route(context, exc)
        upstream_md = self._upstream_metadata(context.invocation_metadata() or (), md)

        async def attempt(member: Member) -> bytes:
            call = (await self._channel(member)).unary_unary(method)(
                request, metadata=upstream_md, timeout=self._timeout(context)
            )
            try:
                response = await call
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.UNAVAILABLE:
                    raise _NotStarted() from exc  # refused, reset or draining: the caller saw nothing yet
                await self._finish_error(context, member, exc)
                raise  # not reached: abort raises
            except asyncio.CancelledError:
                call.cancel()  # the caller went away: so does the upstream call
                raise
            self.gw._account(member.instance, ok=True)
            await context.send_initial_metadata(self._served_metadata(await call.initial_metadata(), member))
            context.set_trailing_metadata(_user_metadata(await call.trailing_metadata()))
            return response

        try:
            return await self.gw.route(version, attempt, "a gRPC call", self._without_port())
        except NoRoute as exc:
            await self._no_route(context, exc)
            raise  # not reached

    def _answer(self, method: str, request: bytes) -> bytes:
        gw = self.gw
        if method.endswith("/ServerLive"):
            return _bool_message(True)
        version: int | None = None
        if method.endswith("/ModelReady"):
            name = string_field(request, 1)
            if name != gw.table.routes.model_id:
                return _bool_message(False)
            try:
                version = _as_version(string_field(request, 2) or "") if string_field(request, 2) else None
            except NoRoute:
                return _bool_message(False)
        try:
            members = gw.table.candidates(version)
        except NoRoute:
            return _bool_message(False)
        return _bool_message(any(m.instance not in gw.down for m in members))

    # -- stream --------------------------------------------------------------------------------
    async def _stream(
        self, method: str, request_iterator: AsyncIterator[bytes], context: grpc.aio.ServicerContext
    ) -> None:
        md = await self._begin(method, context)
        inbox = _Inbox()
        reader = asyncio.create_task(inbox.read(request_iterator))
        try:
            first = await inbox.first()
            try:
                version = self._version(method, md, first)
            except NoRoute as exc:
                await self._no_route(context, exc)
            upstream_md = self._upstream_metadata(context.invocation_metadata() or (), md)

            async def attempt(member: Member) -> None:
                call = (await self._channel(member)).stream_stream(method)(
                    inbox.replay(), metadata=upstream_md, timeout=self._timeout(context)
                )
                responded = False
                try:
                    async for response in call:
                        if not responded:
                            responded = inbox.committed = True  # from here on, no retry: the caller has seen it
                            await context.send_initial_metadata(
                                self._served_metadata(await call.initial_metadata(), member)
                            )
                        await context.write(response)
                except grpc.aio.AioRpcError as exc:
                    if not responded and exc.code() == grpc.StatusCode.UNAVAILABLE:
                        raise _NotStarted() from exc
                    if exc.code() == grpc.StatusCode.UNAVAILABLE:
                        log.warning(
                            "backend #%d (v%d) broke off a gRPC stream: %s",
                            member.instance,
                            member.version,
                            exc.details(),
                        )
                    await self._finish_error(context, member, exc)
                except asyncio.CancelledError:
                    call.cancel()
                    raise
                self.gw._account(member.instance, ok=True)
                if not responded:
                    await context.send_initial_metadata(self._served_metadata(await call.initial_metadata(), member))
                context.set_trailing_metadata(_user_metadata(await call.trailing_metadata()))

            try:
                await self.gw.route(version, attempt, "a gRPC stream", self._without_port())
            except NoRoute as exc:
                await self._no_route(context, exc)
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reader


def _user_metadata(md: Sequence[tuple[str, Any]] | None) -> tuple[tuple[str, Any], ...]:
    """Metadata as grpc.aio's server calls take it (a tuple of pairs), without gRPC's reserved keys."""
    return tuple((k, v) for k, v in (md or ()) if not k.startswith("grpc-"))


class _Inbox:
    """The caller's stream requests, read once. Each upstream attempt replays them from the first until the
    stream is committed (a response went back to the caller); then what was sent is dropped as it goes."""

    def __init__(self) -> None:
        self.items: deque[bytes] = deque()
        self.dropped = 0  # how many from the start are no longer held
        self.eof = False
        self.committed = False
        self._changed = asyncio.Event()

    async def read(self, request_iterator: AsyncIterator[bytes]) -> None:
        try:
            async for message in request_iterator:
                self.items.append(message)
                self._notify()
        except Exception as exc:  # the caller's side broke: end the upstream stream too
            log.debug("gRPC stream from the caller ended: %s", exc)
        finally:
            self.eof = True
            self._notify()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def first(self) -> bytes | None:
        while not self.items and not self.eof:
            await self._changed.wait()
        return self.items[0] if self.items else None

    async def replay(self) -> AsyncIterator[bytes]:
        pos = 0
        t0 = time.monotonic()
        while True:
            if pos - self.dropped < 0:
                raise RuntimeError("a stream was replayed after it was committed")  # never: one attempt commits
            if pos - self.dropped < len(self.items):
                message = self.items[pos - self.dropped]
                pos += 1
                if self.committed:
                    while self.dropped < pos and self.items:
                        self.items.popleft()
                        self.dropped += 1
                yield message
                continue
            if self.eof:
                log.debug("gRPC stream: %d requests forwarded in %.1f s", pos, time.monotonic() - t0)
                return
            await self._changed.wait()
