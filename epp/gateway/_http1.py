"""The lean upstream client's per-connection half: one keep-alive HTTP/1.1 connection whose answers are parsed,
one at a time, by :class:`epp.http1.response.ResponseParser` (llhttp) into a :class:`LeanResponse`, and the response
object the proxy reads whole or relays into a sink from the connection's read callback. The pool that hands out
connections is :class:`epp.gateway._client.LeanUpstream` (its module docstring states the contract of both).
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable
from typing import Protocol, cast

from multidict import CIMultiDict

from epp.errors import UpstreamTimeout
from epp.gateway._upstream import Sink, unavailable
from epp.http1.response import ResponseError, ResponseParser

__all__ = ["ConnectionPool", "Http1Connection", "LeanResponse"]

_PAUSED = object()


class LeanResponse:
    """One upstream answer: ``status``, ``headers`` and the body, read whole or relayed into a sink."""

    __slots__ = ("_conn", "_ended", "_error", "_loop", "_parts", "_paused", "_sink", "_waiter", "headers", "sse",
                 "status")

    def __init__(self, conn: Http1Connection) -> None:
        self.status = 0
        self.headers: CIMultiDict[str] = CIMultiDict()
        self.sse = False
        self._conn: Http1Connection | None = conn
        # Kept, not looked up per wait: on Python 3.11 ``asyncio.get_running_loop()`` makes a getpid() syscall.
        self._loop = conn._loop
        self._parts: list[bytes] = []
        self._ended = False
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[object] | None = None
        self._sink: Sink | None = None
        self._paused = False

    # -- consumer side (the proxy's task) ---------------------------------------------------------------------

    async def read(self) -> bytes:
        """The whole body (already complete for a non-SSE answer)."""
        while not self._ended:
            await self._wait()
        return self._take()

    async def first(self) -> bytes:
        """The body bytes received so far, waiting for some (``b""`` only at the end of the body)."""
        while not self._parts and not self._ended:
            await self._wait()
        return self._take()

    def at_eof(self) -> bool:
        """Whether the whole body has been received and handed out."""
        return self._ended and not self._parts

    async def pump(self, sink: Sink, drain: Callable[[], Awaitable[None]]) -> bytes:
        """Relay the rest of the body: ``sink`` is called from the connection's callback for every read (``sink.chunk``
        for a read that is exactly one chunk, else ``sink(payload, framed)``); when it returns True (the client's buffer
        is full) reading pauses until ``await drain()`` returns. Returns the bytes that arrived together with the end of
        the body (not given to the sink, so the caller can send them with its end-of-stream marker). Exceptions raised
        by ``sink`` end the relay, abort the upstream connection and propagate here."""
        pending = self._take()
        if self._ended:
            return pending
        # The sink is installed before the pending bytes go out, so a full buffer pauses reading (as for any
        # read) and what arrives after them goes to the sink behind them, never to the end of the stream.
        self._sink = sink
        try:
            if pending:
                self._body(pending, None)
            while not self._ended:
                if self._paused or await self._wait() is _PAUSED:
                    await drain()
                    self._resume()
            return self._take()
        finally:
            self._sink = None

    def close(self) -> None:
        """Release the answer: a no-op when it was read to the end, otherwise the connection is aborted."""
        conn, self._conn = self._conn, None
        if conn is not None and not self._ended:
            conn.abort()

    async def _wait(self) -> object:
        if self._error is not None:
            raise self._error
        waiter = self._waiter = self._loop.create_future()
        try:
            return await waiter
        finally:
            self._waiter = None

    def _take(self) -> bytes:
        if self._error is not None:
            raise self._error
        parts, self._parts = self._parts, []
        if not parts:
            return b""
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def _resume(self) -> None:
        self._paused = False
        conn = self._conn
        if conn is not None and conn.transport is not None:
            conn.resume()

    # -- producer side (the connection's callbacks) -------------------------------------------------------------

    def _wake(self, value: object = None) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(value)

    def _body(self, payload: bytes, framed: bytes | None) -> None:
        sink = self._sink
        if sink is None:
            self._parts.append(payload)
            if self.sse:
                self._wake()
            return
        try:
            full = sink(payload, framed)
        except Exception as exc:  # noqa: BLE001 - the client went away (or the sink failed): stop relaying
            self._sink_failed(exc)
            return
        if full:
            self._full()

    def _chunk(self, read: bytes, payload: bytes) -> None:
        """A read that is exactly one whole chunk carrying ``payload``: handed to ``sink.chunk`` as received."""
        sink = self._sink
        if sink is None:
            self._body(payload, read)
            return
        try:
            full = sink.chunk(read, len(read) - len(payload) - 2)  # the payload sits before the chunk's CRLF
        except Exception as exc:  # noqa: BLE001 - as in _body
            self._sink_failed(exc)
            return
        if full:
            self._full()

    def _sink_failed(self, exc: Exception) -> None:
        self._fail(exc)
        if self._conn is not None:
            self._conn.abort()

    def _full(self) -> None:
        """The client's buffer is full: pause reading until the relay's task has drained it."""
        if not self._paused:
            self._paused = True
            if self._conn is not None:
                self._conn.pause()
            self._wake(_PAUSED)

    def _end(self, tail: bytes) -> None:
        if tail:
            self._parts.append(tail)
        self._ended = True
        self._wake()

    def _fail(self, exc: BaseException) -> None:
        if self._error is None and not self._ended:
            self._error = exc
            waiter = self._waiter
            if waiter is not None and not waiter.done():
                waiter.set_exception(exc)


class ConnectionPool(Protocol):
    """What a connection needs of the pool that opened it (:class:`epp.gateway._client.LeanUpstream`)."""

    @property
    def upstream_timeout(self) -> float | None:
        """Seconds an answer may go without a byte (None: no limit)."""
        ...

    def release(self, conn: Http1Connection) -> None:
        """``conn`` read its answer to the end and may be reused: it goes back to the idle list."""

    def forget(self, conn: Http1Connection) -> None:
        """``conn`` is closed: it leaves the pool (a busy one frees its slot)."""


class Http1Connection(asyncio.Protocol):
    """One upstream connection: parses one answer at a time into its :class:`LeanResponse`."""

    def __init__(self, pool: ConnectionPool, key: tuple[str, int], hostport: str) -> None:
        self.pool = pool
        self.key = key
        self.hostport = hostport
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.busy = False  # holds one of the pool's slots (between acquire and release/close)
        self.idle_since = 0.0
        self.resp: LeanResponse | None = None
        self._loop = asyncio.get_running_loop()
        self._parser = ResponseParser()
        self._timeout = pool.upstream_timeout
        self._timer: asyncio.TimerHandle | None = None
        self._last = 0.0

    # -- requests ---------------------------------------------------------------------------------------------

    def send(self, raw: bytes) -> LeanResponse:
        """Write one request; its answer is parsed into the returned response."""
        assert self.transport is not None
        resp = self.resp = LeanResponse(self)
        self._parser.begin()
        self.transport.write(raw)
        if self._timeout is not None:
            self._last = self._loop.time()
            if self._timer is None:  # a timer left from an earlier answer on this connection serves this one too
                self._timer = self._loop.call_at(self._last + self._timeout, self._check_idle)
        return resp

    def pause(self) -> None:
        if self.transport is not None:
            self.transport.pause_reading()

    def resume(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.resume_reading()
            self._last = self._loop.time()

    def abort(self) -> None:
        self.closed = True
        self._stop_timer()
        if self.transport is not None:
            self.transport.abort()

    def _check_idle(self) -> None:
        """The upstream timeout: fail the answer when no byte came for ``upstream_timeout`` (a paused relay is
        waiting for the client, not the server). The timer outlives the answer it was started for, so a busy
        keep-alive connection does not create and cancel one per request; it stops when no answer is pending."""
        self._timer = None
        resp = self.resp
        if resp is None or self._timeout is None:
            return
        now = self._loop.time()
        if resp._paused:  # a slow client, not a slow server
            self._last = now
        elif now - self._last >= self._timeout:
            resp._fail(UpstreamTimeout(f"model server {self.hostport} did not respond within the upstream "
                                       f"timeout", reason="upstream_timeout"))
            self.abort()
            return
        self._timer = self._loop.call_at(self._last + self._timeout, self._check_idle)

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    # -- asyncio.Protocol ---------------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # (uvloop's are not asyncio.Transport subclasses)
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._stop_timer()
        resp, self.resp = self.resp, None
        if resp is not None:
            if exc is None and self._parser.feed_eof():  # a body that ran to the end of the connection
                self._finish(resp, b"")
            else:
                resp._fail(unavailable(self.hostport, f"connection closed{': ' + str(exc) if exc else ''}"))
        self.pool.forget(self)

    def data_received(self, data: bytes) -> None:
        resp = self.resp
        if resp is None:  # nothing was asked: a broken server; never reuse this connection
            self.abort()
            return
        if self._timer is not None:
            self._last = self._loop.time()
        parser = self._parser
        try:
            had_head = parser.head_done
            payload = parser.feed(data)
            if not had_head:
                if not parser.head_done:
                    return
                self._head(resp, parser)
        except ResponseError as exc:
            resp._fail(unavailable(self.hostport, str(exc)))
            self.abort()
            return
        if parser.done:
            self._finish(resp, payload)  # the last bytes go out with the end of the stream, not to the sink
        elif payload:
            whole = parser.whole_chunks
            if whole == 1:
                resp._chunk(data, payload)  # the relay's per-token case: the read is one chunk
            else:
                resp._body(payload, data if whole else None)

    def _head(self, resp: LeanResponse, parser: ResponseParser) -> None:
        """The answer's head is in: status and headers into ``resp``; the relay is set up from it, before the
        first token."""
        resp.status = parser.status
        resp.headers = headers = CIMultiDict([(name.decode("latin-1"), value.decode("utf-8", "surrogateescape"))
                                              for name, value in parser.headers])
        resp.sse = "text/event-stream" in headers.get("Content-Type", "")
        if resp.sse and not parser.done:
            resp._wake()

    def _finish(self, resp: LeanResponse, tail: bytes) -> None:
        self.resp = None
        resp._conn = None
        if self._parser.keep_alive and not self.closed:
            self.pool.release(self)
        else:
            self.abort()  # connection_lost tells the pool
        resp._end(tail)
