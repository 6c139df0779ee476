"""EPP's own HTTP/1.1 server for the gateway (the default front end; aiohttp's server stays selectable).

Why: aiohttp's server costs 116–124 µs of CPU per request here before any handler code runs, against 28–31 µs
for a bare ``asyncio.Protocol`` giving the same answer (``python -m bench.http_frontends``), a fifth of what EPP
may spend on a whole proxied request. This server parses requests in ``data_received``,
runs one task per request, and answers with one write per response (head and body together).

Contract (what clients and the proxy can rely on):

* **Requests**: HTTP/1.0 and 1.1 (1.1 with ``Host``); origin-form and absolute-form targets; bodies by
  ``Content-Length`` or ``Transfer-Encoding: chunked`` (trailers ignored); ``Expect: 100-continue`` is answered
  when the body is awaited. Empty lines before a request line are ignored (RFC 9112 §2.2). A body over the
  app's ``body_limit`` gets 413 (for ``Content-Length``, before the body is read). A head over
  :data:`MAX_HEAD` bytes or with bare LF line ends, a malformed request line or header, a missing or repeated
  ``Host``, a bad or conflicting length, a transfer coding other than ``chunked`` gets 400. All in OpenAI error
  format (Anthropic's when the request line targets ``/v1/messages``), after which the connection is closed;
  other connections are unaffected.
* **Connections**: keep-alive by default in 1.1 (``Connection: close`` honoured), on request in 1.0;
  pipelined requests are answered in order, one at a time (reading pauses while too much is queued). An idle
  connection closes after ``keepalive_timeout`` seconds. A client that disconnects cancels its request's task
  (the proxy then aborts the upstream request and releases its in-flight count). The end of the client's side
  (FIN) counts as disconnecting, as in nginx and uvicorn: a closed socket and a half-closed one send the same
  FIN, and freeing a GPU from a client that left matters more than answering the rare client that half-closes
  (telling them apart would need probing the socket with unsolicited bytes).
* **Responses**: ``Date`` is added; ``Content-Length`` for complete answers; streams are chunked in 1.1 and
  delimited by closing the connection in 1.0. ``HEAD`` gets the head of the ``GET`` answer.
* **Routes**: those of :func:`epp.gateway.make_gateway_app`; the app's start-up hooks must have run (the
  proxy, catalog and director are taken from it).
* **Stop**: listening stops, idle connections close, requests in flight get up to ``timeout`` seconds to
  finish (their connections then close), the rest are cancelled.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from email.utils import formatdate
from http import HTTPStatus
from types import MappingProxyType

from aiohttp import web

from ..errors import BadRequest, EppError, InternalError, PayloadTooLarge, error_body
from ..request import is_messages_path
from ._app import GET_PATHS, INFERENCE_PATHS, PROXY_KEY, get_answer, no_route
from ._downstream import HeaderItems
from ._h1request import MAX_HEAD, HeadOverLimit, RequestHead, header_block, parse_head
from ._proxy import answer_request_id

__all__ = ["LeanFrontend"]

log = logging.getLogger("epp.gateway")

_MAX_QUEUED = 1024 * 1024  # pipelined bytes buffered while a request is served before reading pauses
_REASONS = MappingProxyType({s.value: s.phrase.encode() for s in HTTPStatus})
_JSON_HEADERS = MappingProxyType({"Content-Type": "application/json"})
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_NONE, _STREAMING, _DONE = range(3)


class LeanFrontend:
    """Serves a started gateway app (see the module docstring for the contract)."""

    def __init__(self, app: web.Application, *, keepalive_timeout: float = 75.0) -> None:
        self.app = app
        self.proxy = app[PROXY_KEY]
        self.body_limit = self.proxy.settings.body_limit
        self.keepalive_timeout = keepalive_timeout
        self.closing = False
        self.connections: set[_Connection] = set()
        self._server: asyncio.AbstractServer | None = None
        self._date = b""
        self._date_second = -1

    async def start(self, host: str, port: int, *, backlog: int = 2048, reuse_port: bool = False) -> int:
        """Start listening; returns the port (useful with port 0)."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _Connection(self), host or None, port, backlog=backlog,
                                                reuse_port=reuse_port or None)
        return int(self._server.sockets[0].getsockname()[1])

    async def stop(self, timeout: float) -> None:
        """Stop listening and drain (see the module docstring)."""
        self.closing = True
        if self._server is not None:
            self._server.close()
        busy = []
        for conn in list(self.connections):
            if conn.task is None:
                conn.close()
            else:
                busy.append(conn.task)
        if busy:
            _, pending = await asyncio.wait(busy, timeout=timeout)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending, timeout=1.0)
        for conn in list(self.connections):
            conn.close(flush=False)
        if self._server is not None:
            try:
                await asyncio.wait_for(self._server.wait_closed(), timeout=max(1.0, timeout))
            except asyncio.TimeoutError:
                log.warning("gateway connections still open after stop")
            self._server = None

    def date(self) -> bytes:
        """The ``Date`` header line for responses (formatted once per second)."""
        now = time.time()
        second = int(now)
        if second != self._date_second:
            self._date_second = second
            self._date = b"Date: " + formatdate(now, usegmt=True).encode() + b"\r\n"
        return self._date

    async def serve(self, req: RequestHead, down: _LeanDownstream) -> None:
        """Route one request (the app's routes)."""
        method, path = req.method, req.path
        if method == "POST" and path in INFERENCE_PATHS:
            await self.proxy.handle(down)
            return
        if method in ("GET", "HEAD") and path in GET_PATHS:
            status, body = await get_answer(self.app, path)
            await down.respond(status, _JSON_HEADERS, body)
            return
        err = no_route(method, path)
        await down.respond(err.status, _JSON_HEADERS, error_body(err, anthropic=is_messages_path(path)))


def _request_line_path(data: bytes) -> str:
    """The path of the request line at the start of ``data`` (a head that failed to parse), or "" when there is
    none to read; only to pick the envelope of the error answer."""
    line = data[:data.find(b"\r\n")].split(b" ")
    return line[1].partition(b"?")[0].decode("latin-1") if len(line) == 3 else ""


class _LeanDownstream:
    """One request on a :class:`_Connection` as a :class:`~epp.gateway._downstream.Downstream`."""

    __slots__ = ("chunked", "conn", "headers", "path", "raw_path", "req", "state", "transport")

    opens_now = True

    def __init__(self, conn: _Connection, req: RequestHead) -> None:
        self.conn = conn
        self.req = req
        self.path = req.path
        self.raw_path = req.raw_path
        self.headers = req.headers
        self.transport: asyncio.Transport | None = None
        self.chunked = False
        self.state = _NONE

    async def read_body(self, limit: int) -> bytes:
        body = self.req.body
        if len(body) > limit:
            raise PayloadTooLarge(f"request body of {len(body)} bytes exceeds the limit of {limit}")
        return body

    async def respond(self, status: int, headers: HeaderItems, body: bytes) -> None:
        transport = self.conn.writable()
        self.state = _DONE
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
        self.state = _DONE if end else _STREAMING
        self.transport = transport
        transport.write(self.conn.head(status, headers, framing, req) + payload)

    async def drain(self) -> None:
        await self.conn.drain()

    async def end_stream(self, tail: bytes) -> None:
        transport = self.conn.writable()
        self.state = _DONE
        if self.chunked:
            transport.write((b"%x\r\n%b\r\n0\r\n\r\n" % (len(tail), tail)) if tail else b"0\r\n\r\n")
        elif tail:
            transport.write(tail)

    def abort(self) -> None:
        self.conn.abort()


class _Connection(asyncio.Protocol):
    """One client connection: parses requests and serves them one at a time, in order."""

    def __init__(self, front: LeanFrontend) -> None:
        self.front = front
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.task: asyncio.Task[None] | None = None
        self.closed = False
        self._buf = b""
        self._req: RequestHead | None = None
        self._broken = False  # a fatal error answer was sent: ignore further input
        self._read_paused = False
        self._write_paused = False
        self._drain: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._last_input = 0.0

    # -- asyncio.Protocol ---------------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.front.connections.add(self)
        if self.front.closing:
            self.close()
            return
        self._arm_idle()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.front.connections.discard(self)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        drain, self._drain = self._drain, None
        if drain is not None and not drain.done():
            drain.set_exception(ConnectionResetError("the client went away"))
        if self.task is not None:
            self.task.cancel()

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        drain, self._drain = self._drain, None
        if drain is not None and not drain.done():
            drain.set_result(None)

    def data_received(self, data: bytes) -> None:
        if self._broken:
            return
        if self._buf:
            data = self._buf + data
            self._buf = b""
        if self.task is not None:  # serving a request: keep what follows (pipelined requests) for later
            self._buf = data
            if len(data) > _MAX_QUEUED and not self._read_paused:
                self._read_paused = True
                self.transport.pause_reading()  # type: ignore[union-attr]
            return
        self._last_input = self.loop.time()
        self._process(data)

    # -- requests ---------------------------------------------------------------------------------------------

    def _process(self, data: bytes) -> None:
        """Parse what ``data`` holds: start serving the next complete request, keep the rest for later."""
        req = self._req
        try:
            if req is None:
                if data[0] in b"\r\n":  # empty lines before a request line are ignored (RFC 9112 §2.2)
                    data = data.lstrip(b"\r\n")
                    if not data:
                        return
                end = data.find(b"\r\n\r\n", 0, MAX_HEAD + 4)
                if end < 0:
                    if len(data) > MAX_HEAD:
                        raise BadRequest(f"request head larger than {MAX_HEAD} bytes")
                    if b"\n\n" in data or b"\n\r\n" in data:  # the head ended, but not with CRLF CRLF
                        raise BadRequest("request head with bare LF line ends (CRLF is required)")
                    self._buf = data
                    return
                req = parse_head(data[:end], self.front.body_limit)
                if req.v11 and "host" not in req.headers:
                    raise BadRequest("HTTP/1.1 request without a Host header")  # RFC 9112 §3.2
                data = data[end + 4:]
            if req.reader is not None:
                done, data = req.reader.feed(data)
                if not done:
                    if req.expect:
                        req.expect = False
                        self.transport.write(_CONTINUE)  # type: ignore[union-attr]
                    self._req, self._buf = req, data
                    return
                req.body = req.reader.body()
                req.reader = None
        except EppError as err:
            if req is None and isinstance(err, HeadOverLimit):
                req = err.head
            self._reject(err, req.path if req is not None else _request_line_path(data), req)
            return
        self._req = None
        self._buf = data
        self.task = self.loop.create_task(self._serve(req))  # the idle timer stays: it ignores a busy connection

    async def _serve(self, req: RequestHead) -> None:
        down = _LeanDownstream(self, req)
        try:
            await self.front.serve(req, down)
        except Exception:
            log.exception("gateway request %s %s failed", req.method, req.path)
        finally:
            self.task = None
            self._finished(req, down)

    def _finished(self, req: RequestHead, down: _LeanDownstream) -> None:
        """After a request's task ended: complete or drop its answer, then go on with the connection."""
        if self.closed or self.transport is None or self.transport.is_closing():
            return
        if down.state == _STREAMING:  # the handler ended in the middle of a stream: it must not look complete
            self.abort()
            return
        if down.state == _NONE:
            req.keep_alive = False
            self.transport.write(self._closing_error(InternalError("the request ended without a response"), req.path,
                                                     req))
        if not req.keep_alive or self.front.closing:
            self.close()
            return
        if self._read_paused:
            self._read_paused = False
            self.transport.resume_reading()  # type: ignore[union-attr]
        data, self._buf = self._buf, b""
        self._last_input = self.loop.time()
        if data:
            self._process(data)
        if self.task is None and not self.closed:
            self._arm_idle()

    def _reject(self, err: EppError, path: str, req: RequestHead | None) -> None:
        """Answer a request that cannot be served (bad head, body over the limit) and close the connection. A body
        over the limit counts as the request's error, as when the proxy finds it; a malformed head is HTTP's.
        ``path`` (the request's, as far as it is known) picks the error envelope; ``req``, when its head was
        parsed, gives the ``x-request-id`` echoed."""
        if isinstance(err, PayloadTooLarge):
            self.front.proxy.director.record_rejection(err)
        self._broken = True
        self._req = None
        self._buf = b""
        self.transport.write(self._closing_error(err, path, req))  # type: ignore[union-attr]
        self.close()

    def _closing_error(self, err: EppError, path: str, req: RequestHead | None = None) -> bytes:
        """``err`` as a complete JSON error response (the envelope by ``path``) that announces the connection's
        close; with ``req`` (a parsed head) it carries the client's ``x-request-id``, or a new one, as the
        proxy's answers do."""
        body = error_body(err, anthropic=is_messages_path(path))
        rid = b"" if req is None else b"x-request-id: %b\r\n" % answer_request_id(req.headers).encode()
        return (b"HTTP/1.1 %d %b\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%b%bConnection: close"
                b"\r\n\r\n%b" % (err.status, _REASONS.get(err.status, b"Error"), len(body), rid, self.front.date(),
                                  body))

    # -- writing ----------------------------------------------------------------------------------------------

    def writable(self) -> asyncio.Transport:
        """The transport, or ``ConnectionResetError`` when the client is gone."""
        transport = self.transport
        if self.closed or transport is None or transport.is_closing():
            raise ConnectionResetError("the client went away")
        return transport

    def head(self, status: int, headers: HeaderItems, framing: bytes, req: RequestHead) -> bytes:
        """A response head: status line, ``headers`` (lines with CR or LF are dropped), Date, ``framing`` and
        the connection header the keep-alive decision needs."""
        text = header_block(headers)
        if self.front.closing:
            req.keep_alive = False
        if not req.keep_alive:
            conn = b"Connection: close\r\n"
        else:
            conn = b"" if req.v11 else b"Connection: keep-alive\r\n"
        return b"HTTP/1.1 %d %b\r\n%b%b%b%b\r\n" % (status, _REASONS.get(status, b"Unknown"),
                                                     text.encode("utf-8", "surrogateescape"), self.front.date(),
                                                     framing, conn)

    async def drain(self) -> None:
        if self.closed:
            raise ConnectionResetError("the client went away")
        if not self._write_paused:
            return
        if self._drain is None:
            self._drain = self.loop.create_future()
        await self._drain

    def close(self, *, flush: bool = True) -> None:
        """Close after the buffered bytes are sent; with ``flush=False`` (at stop) a client that is not reading
        them is dropped instead of holding the shutdown."""
        transport = self.transport
        if transport is None or self.closed:
            return
        if not flush and transport.get_write_buffer_size():
            transport.abort()
        else:
            transport.close()

    def abort(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.abort()

    # -- idle connections -------------------------------------------------------------------------------------

    def _arm_idle(self) -> None:
        timeout = self.front.keepalive_timeout
        if timeout and self._timer is None:
            self._timer = self.loop.call_at(self._last_input + timeout if self._last_input else
                                            self.loop.time() + timeout, self._idle_check)

    def _idle_check(self) -> None:
        """Close the connection when it has been idle for ``keepalive_timeout``. The timer is not cancelled
        while a request is served (that would cost a timer per request); a busy connection is checked again a
        full timeout later."""
        self._timer = None
        if self.closed:
            return
        if self.task is not None:
            self._timer = self.loop.call_later(self.front.keepalive_timeout, self._idle_check)
            return
        left = self._last_input + self.front.keepalive_timeout - self.loop.time()
        if left > 0:
            self._timer = self.loop.call_later(left, self._idle_check)
        else:
            self.close()

