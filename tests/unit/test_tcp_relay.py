"""The gateway's gRPC relay (llmserve.deploy.tcp_relay) against real sockets on 127.0.0.1, in milliseconds:
bytes pass both ways unchanged, either side closing closes the other, and a closed relay leaves the held
listening socket's backlog to whoever accepts next (the next gateway)."""

from __future__ import annotations

import asyncio
import os
import socket

from llmserve.deploy.tcp_relay import CHUNK, Relay


def _listening() -> socket.socket:
    return socket.create_server(("127.0.0.1", 0), backlog=16)


async def _echo_upstream() -> tuple[asyncio.Server, int]:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


def test_bytes_pass_both_ways_unchanged():
    async def run() -> None:
        upstream, port = await _echo_upstream()
        held = _listening()
        relay = Relay("127.0.0.1", port)
        await relay.start(held)
        reader, writer = await asyncio.open_connection(*held.getsockname())
        payload = os.urandom(5 * CHUNK + 123)  # several reads per direction
        writer.write(payload)
        await writer.drain()
        got = await asyncio.wait_for(reader.readexactly(len(payload)), 10)
        assert got == payload
        writer.close()
        await relay.close()
        upstream.close()

    asyncio.run(run())


def test_upstream_closing_closes_the_client_and_a_refused_upstream_closes_it_at_once():
    async def run() -> None:
        closed = asyncio.Event()

        async def close_at_once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writer.close()
            closed.set()

        upstream = await asyncio.start_server(close_at_once, "127.0.0.1", 0)
        held = _listening()
        relay = Relay("127.0.0.1", upstream.sockets[0].getsockname()[1])
        await relay.start(held)
        reader, writer = await asyncio.open_connection(*held.getsockname())
        assert await asyncio.wait_for(reader.read(), 10) == b""  # EOF, not a hang
        writer.close()
        await asyncio.wait_for(closed.wait(), 10)
        upstream.close()
        await upstream.wait_closed()
        await relay.close()

        nobody = _listening()
        port = nobody.getsockname()[1]
        nobody.close()  # a port nobody listens on: the gRPC server gone
        held2 = _listening()
        relay2 = Relay("127.0.0.1", port)
        await relay2.start(held2)
        reader, writer = await asyncio.open_connection(*held2.getsockname())
        assert await asyncio.wait_for(reader.read(), 10) == b""
        writer.close()
        await relay2.close()
        assert not relay.connections and not relay2.connections

    asyncio.run(run())


def test_connections_wait_in_the_held_backlog_for_the_next_relay():
    async def run() -> None:
        upstream, port = await _echo_upstream()
        held = _listening()
        first = Relay("127.0.0.1", port)
        await first.start(socket.socket(fileno=os.dup(held.fileno())))  # the gateway's copy of the held socket
        await first.close()  # the gateway is gone; the watchdog's copy (held) stays open
        reader, writer = await asyncio.open_connection(*held.getsockname())  # queued, not refused
        writer.write(b"ping")
        await writer.drain()
        second = Relay("127.0.0.1", port)
        await second.start(held)
        assert await asyncio.wait_for(reader.readexactly(4), 10) == b"ping"
        writer.close()
        await second.close()
        upstream.close()

    asyncio.run(run())
