"""One request on EPP's own HTTP/1.1 server, as the :class:`~epp.gateway._downstream.Downstream` the proxy answers.

:class:`LeanDownstream` writes the answer through its connection (a :class:`ResponseWriter`): a complete answer
in one write with ``Content-Length`` (none for 204/304; only the head for ``HEAD``), or a stream, chunked in
HTTP/1.1 and delimited by closing the connection in 1.0. :attr:`LeanDownstream.state` tells the connection how far
the answer got (:data:`NONE`, :data:`STREAMING`, :data:`DONE`): an answer left :data:`STREAMING` must not look
complete, one left at :data:`NONE` gets a 500. A write to a client that went away raises ``ConnectionResetError``.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from epp.errors import PayloadTooLarge
from epp.gateway._downstream import HeaderItems
from epp.http1.request import Request

__all__ = ["LeanDownstream", "ResponseWriter", "NONE", "STREAMING", "DONE"]

NONE, STREAMING, DONE = range(3)  # how far a response got


class ResponseWriter(Protocol):
    """What a :class:`LeanDownstream` needs of its connection."""

    def writable(self) -> asyncio.Transport:
        """The transport, or ``ConnectionResetError`` when the client is gone."""
        ...

    def head(self, status: int, headers: HeaderItems, framing: bytes, req: Request) -> bytes:
        """A response head with ``framing`` (the body's length or coding) and the connection header."""
        ...

    async def drain(self) -> None:
        """Wait until the client reads what was written (``ConnectionResetError`` if it went away)."""
        ...

    def abort(self) -> None:
        """Drop the connection at once."""
        ...


class LeanDownstream:
    """One request on a connection as a :class:`~epp.gateway._downstream.Downstream`."""

    __slots__ = ("chunked", "conn", "headers", "path", "raw_path", "req", "state", "transport")

    opens_now = True

    def __init__(self, conn: ResponseWriter, req: Request) -> None:
        self.conn = conn
        self.req = req
        self.path = req.path
        self.raw_path = req.raw_path
        self.headers = req.headers
        self.transport: asyncio.Transport | None = None
        self.chunked = False
        self.state = NONE

    async def read_body(self, limit: int) -> bytes:
        body = self.req.body
        if len(body) > limit:
            raise PayloadTooLarge(f"request body of {len(body)} bytes exceeds the limit of {limit}")
        return body

    async def respond(self, status: int, headers: HeaderItems, body: bytes) -> None:
        transport = self.conn.writable()
        self.state = DONE
        if status in (204, 304):  # no body and no Content-Length (RFC 9110 §8.6)
            transport.write(self.conn.head(status, headers, b"", self.req))
            return
        head = self.conn.head(status, headers, b"Content-Length: %d\r\n" % len(body), self.req)
        transport.write(head if self.req.method == "HEAD" else head + body)

    async def open_stream(self, status: int, headers: HeaderItems, first: bytes, *, end: bool) -> None:
        self._open(status, headers, first, end)

    def open_stream_now(self, status: int, headers: HeaderItems, first: bytes) -> None:
        self._open(status, headers, first, False)

    def _open(self, status: int, headers: HeaderItems, first: bytes, end: bool) -> None:
        transport = self.conn.writable()
        req = self.req
        if req.v11:
            self.chunked = True
            framing = b"Transfer-Encoding: chunked\r\n"
            payload = b"%x\r\n%b\r\n" % (len(first), first) if first else b""
            if end:
                payload += b"0\r\n\r\n"
        else:  # HTTP/1.0 has no chunked encoding: the body ends when the connection closes
            req.keep_alive = False
            framing, payload = b"", first
        self.state = DONE if end else STREAMING
        self.transport = transport
        transport.write(self.conn.head(status, headers, framing, req) + payload)

    async def drain(self) -> None:
        await self.conn.drain()

    async def end_stream(self, tail: bytes) -> None:
        transport = self.conn.writable()
        self.state = DONE
        if self.chunked:
            transport.write((b"%x\r\n%b\r\n0\r\n\r\n" % (len(tail), tail)) if tail else b"0\r\n\r\n")
        elif tail:
            transport.write(tail)

    def abort(self) -> None:
        self.conn.abort()
