"""The gateway benchmarks' floor: a TCP byte relay on uvloop, with no HTTP parsing and no routing. What it costs per
request is what the kernel and the event loop cost any Python proxy for the same bytes (``bench.http_gateway``
runs it as its ``_relay`` process, beside EPP and the Rust router).
"""

from __future__ import annotations

import asyncio
import json
import signal
import socket

__all__ = ["serve_relay"]


class _RelaySide(asyncio.Protocol):
    """One side of a TCP byte relay: what it reads, the peer side writes (with backpressure)."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.peer: _RelaySide | None = None
        self.pending: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        peer = self.peer
        if peer is None or peer.transport is None:
            self.pending.append(data)
        else:
            peer.transport.write(data)

    def pause_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.close()


async def serve_relay(ports: list[int]) -> None:
    """Relay from an ephemeral port on 127.0.0.1 (printed as one JSON line, ``{"port": N}``) to ``ports``,
    pinning each client connection to one server (round robin over connections), until SIGTERM."""
    loop = asyncio.get_running_loop()
    turn = iter(range(1 << 62))

    class Client(_RelaySide):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            super().connection_made(transport)
            loop.create_task(self._connect(ports[next(turn) % len(ports)]))

        async def _connect(self, port: int) -> None:
            _, upstream = await loop.create_connection(_RelaySide, "127.0.0.1", port)
            upstream.peer, self.peer = self, upstream
            for data in self.pending:
                upstream.transport.write(data)  # type: ignore[union-attr]
            self.pending.clear()

    server = await loop.create_server(Client, "127.0.0.1", 0, backlog=1024)
    print(json.dumps({"port": server.sockets[0].getsockname()[1]}), flush=True)
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
