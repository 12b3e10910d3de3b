"""Relays TCP connections accepted on a listening socket to a local port, byte for byte, both ways.

grpcio serves only on addresses it binds itself: it cannot take over the gRPC port's socket that the gateway's
watchdog holds open across gateway restarts. So the gateway runs its gRPC server on an ephemeral loopback port
and relays each connection accepted on the held socket to it. While the gateway restarts, new connections wait
in the held socket's backlog instead of being refused, as they do on the HTTP port.

Per connection the relay holds at most one read of CHUNK bytes per direction: a write waits (drain) until the
other side has taken the previous one, so a slow client slows its own upstream and nothing is buffered without
bound. Either side closing closes both.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket

log = logging.getLogger("llmserve.gateway")

CHUNK = 64 * 1024


class Relay:
    def __init__(self, upstream_host: str, upstream_port: int):
        self.upstream = (upstream_host, upstream_port)
        self.server: asyncio.Server | None = None
        self.connections: set[asyncio.Task] = set()

    async def start(self, listening: socket.socket) -> None:
        self.server = await asyncio.start_server(self._connection, sock=listening, limit=CHUNK)

    async def stop_accepting(self) -> None:
        """New connections stay in the listening socket's backlog (the watchdog's copy keeps it open)."""
        if self.server is not None:
            self.server.close()
            self.server = None

    async def close(self) -> None:
        """Stop accepting and cut the connections still open (after the gRPC server's own grace)."""
        await self.stop_accepting()
        for task in list(self.connections):
            task.cancel()
        for task in list(self.connections):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.connections.add(task)
        up_writer: asyncio.StreamWriter | None = None
        try:
            try:
                up_reader, up_writer = await asyncio.open_connection(*self.upstream, limit=CHUNK)
            except OSError as exc:
                log.error("gRPC relay: the gateway's own gRPC server on %s:%d refused: %s", *self.upstream, exc)
                return
            pipes = [
                asyncio.create_task(_pipe(reader, up_writer)),
                asyncio.create_task(_pipe(up_reader, writer)),
            ]
            try:
                await asyncio.wait(pipes, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for pipe in pipes:
                    pipe.cancel()
                await asyncio.gather(*pipes, return_exceptions=True)
        finally:
            self.connections.discard(task)
            for w in (writer, up_writer):
                if w is not None:
                    w.close()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError, OSError):
        while chunk := await reader.read(CHUNK):
            writer.write(chunk)
            await writer.drain()
