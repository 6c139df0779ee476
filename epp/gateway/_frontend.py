"""EPP's own HTTP/1.1 server for the gateway (the default front end; aiohttp's server stays selectable).

One ``asyncio.Protocol`` per connection parses requests with llhttp (:mod:`epp.http1.request`) as bytes arrive,
serves one request at a time in a task, and answers with one write per response. Malformed input gets a 4xx/501 in
the API's error format once the requests before it are answered, then a lingering close (FIN, the rest read and
discarded until the client closes, at most 30 s) so that the client reads the answer instead of a reset. Keep-alive and
pipelining follow HTTP/1.1; every phase has a deadline (:class:`ClientLimits`), and beyond ``max_connections`` a new
connection is answered 503. A client's FIN cancels its request's task (the proxy aborts the upstream request). On
stop, requests in flight get up to ``timeout`` seconds to finish; the rest are cancelled.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from email.utils import formatdate
from typing import cast

from aiohttp import web

from epp.errors import EppError, InternalError, PayloadTooLarge
from epp.framework.request import is_messages_path
from epp.gateway._app import PROXY_KEY, route
from epp.gateway._downstream import HeaderItems
from epp.gateway._h1request import header_block
from epp.gateway._lean_downstream import NONE, STREAMING, LeanDownstream
from epp.gateway._limits import (
    REASONS,
    ClientLimits,
    HeldBudgetExceeded,
    Refused,
    TooManyConnections,
    closing_answer,
    default_max_connections,
)
from epp.gateway._proxy import answer_request_id
from epp.http1.request import Request, RequestParser

__all__ = ["ClientLimits", "LeanFrontend", "default_max_connections"]

log = logging.getLogger("epp.gateway")

_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
# What a connection waits for: a request, the rest of a head or body, the app, or (refused input answered) the
# client's close.
_IDLE, _HEAD, _BODY, _BUSY, _LINGER = range(5)
_CLOSED_BECAUSE = ("idle", "request head too slow", "request body too slow", "busy", "lingering close done")
_LINGER_IDLE = 5.0  # seconds a lingering connection's reads may pause before it is closed (nginx's lingering_timeout)
_LINGER_TOTAL = 30.0  # seconds after the answer a lingering connection is closed at the latest (nginx's lingering_time)
_REFUSED_LOG_EVERY = 10.0


class LeanFrontend:
    """Serves a started gateway app (see the module docstring for the contract)."""

    def __init__(self, app: web.Application, *, keepalive_timeout: float = 75.0,
                 limits: ClientLimits | None = None) -> None:
        self.app = app
        self.proxy = app[PROXY_KEY]
        self.body_limit = self.proxy.settings.body_limit
        self.keepalive_timeout = keepalive_timeout
        self.limits = limits or ClientLimits()
        cap = self.limits.max_connections
        self.max_connections = default_max_connections() if cap is None else cap
        self.closing = False
        self.held = 0  # bytes the connections' parsers hold for requests not yet served (ClientLimits.held_budget)
        self.connections: set[_Connection] = set()
        self.refused = 0
        self._accepting = 0  # connections accepted whose connection_made has not run yet
        self._refused_logged = -_REFUSED_LOG_EVERY
        self._server: asyncio.AbstractServer | None = None
        self._date = b""
        self._date_second = -1

    async def start(self, host: str, port: int, *, backlog: int = 2048, reuse_port: bool = False) -> int:
        """Start listening; returns the port (useful with port 0)."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(self._accept, host or None, port, backlog=backlog,
                                                reuse_port=reuse_port or None)
        return int(self._server.sockets[0].getsockname()[1])

    def _accept(self) -> asyncio.Protocol:
        """The protocol of a new connection: served, or refused beyond ``max_connections``."""
        if not self.max_connections or len(self.connections) + self._accepting < self.max_connections:
            # A burst of accepts runs before any connection_made: count those in between (connection_made is
            # scheduled right after this, so the callback below runs just before it, with no accept in between).
            self._accepting += 1
            asyncio.get_running_loop().call_soon(self._accepted)
            return _Connection(self)
        self.refused += 1
        now = time.monotonic()
        if now - self._refused_logged >= _REFUSED_LOG_EVERY:  # a flood must not flood the log too
            self._refused_logged = now
            log.warning("gateway at its %d open connections: refusing new ones with 503 (%d so far)",
                        self.max_connections, self.refused)
        err = TooManyConnections(f"the gateway has {self.max_connections} open connections; retry later")
        return Refused(closing_answer(err, b"Retry-After: 1\r\n" + self.date()))

    def _accepted(self) -> None:
        self._accepting -= 1

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

    async def serve(self, req: Request, down: LeanDownstream) -> None:
        """Serve one request by the app's route table (:func:`epp.gateway._app.route`), as aiohttp's server does."""
        await route(req.method, req.path)(self.app, down)


class _Connection(asyncio.Protocol):
    """One client connection: parses requests as bytes arrive and serves them one at a time, in order."""

    def __init__(self, front: LeanFrontend) -> None:
        self.front = front
        self.limits = front.limits
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.task: asyncio.Task[None] | None = None
        self.closed = False
        self.parser = RequestParser(front.body_limit, front.limits.max_head)
        self._error: EppError | None = None  # the input failed: answered after the requests before it
        self._read_paused = False
        self._write_paused = False
        self._drain: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self._phase = _IDLE
        self._since = 0.0  # _IDLE: the last answer's end (or accept); _HEAD: its first byte; _BODY: the window start
        self._last_read = 0.0  # _BODY: the last read
        self._window_base = 0  # _BODY: the body's size at the window's start
        self._counted = 0  # the parser's held bytes as last added to the front's total

    # -- asyncio.Protocol ---------------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # a stream transport (uvloop's are no subclasses)
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.front.connections.add(self)
        if self.front.closing:
            self.close()
            return
        self._since = self.loop.time()
        if self.front.keepalive_timeout:
            self._arm(self._since + self.front.keepalive_timeout)

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
        self.front.held -= self._counted
        self._counted = 0

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        drain, self._drain = self._drain, None
        if drain is not None and not drain.done():
            drain.set_result(None)

    def data_received(self, data: bytes) -> None:
        if self._error is not None:
            if self._phase == _LINGER:  # discarded, but the client is still sending: keep lingering
                self._last_read = self.loop.time()
            return  # the input went wrong: what follows is not parsed (reading goes on, to see the client leave)
        parser = self.parser
        try:
            parser.feed(data)
        except EppError as err:
            self._error = err
        if self._recount() and (parser.current is not None or parser.in_head) and self._error is None:
            self._error = HeldBudgetExceeded(f"requests not yet served hold more than {self.limits.held_budget} "
                                             "bytes on this server")
        if self.task is None:
            self._advance()
        elif self.parser.held > self.limits.pipeline_buffer and not self._read_paused and self.transport is not None:
            self._read_paused = True  # resumed when the app takes the next request (_finished)
            self.transport.pause_reading()

    # -- requests ---------------------------------------------------------------------------------------------

    def _advance(self) -> None:
        """No request is being served: serve the next complete one, else answer a failure, else note what the
        connection now waits for (and its deadline)."""
        parser = self.parser
        req = parser.take()
        if req is not None:
            self._recount()
            self._phase = _BUSY
            self.task = self.loop.create_task(self._serve(req))  # the timer stays: it ignores a busy connection
            return
        if self._error is not None:
            self._reject(self._error)
            return
        if parser.current is not None:
            now = self.loop.time()
            self._last_read = now
            if self._phase != _BODY:
                self._enter(_BODY, now, self.limits.body_timeout)
                self._window_base = parser.current.size
                if parser.current.expect and self.transport is not None:
                    parser.current.expect = False
                    self.transport.write(_CONTINUE)
        elif parser.in_head and self._phase != _HEAD:
            self._enter(_HEAD, self.loop.time(), self.limits.header_timeout)

    def _recount(self) -> bool:
        """Carry the parser's held bytes into the front's total; True when they grew it past ``held_budget``."""
        held = self.parser.held
        grown = held - self._counted
        self._counted = held
        front = self.front
        front.held += grown
        budget = self.limits.held_budget
        return grown > 0 and budget > 0 and front.held > budget

    def _enter(self, phase: int, now: float, timeout: float) -> None:
        self._phase = phase
        self._since = now
        if timeout:
            self._arm(now + timeout)

    async def _serve(self, req: Request) -> None:
        down = LeanDownstream(self, req)
        try:
            await self.front.serve(req, down)
        except Exception:
            log.exception("gateway request %s %s failed", req.method, req.path)
        finally:
            self.task = None
            self._finished(req, down)

    def _finished(self, req: Request, down: LeanDownstream) -> None:
        """After a request's task ended: complete or drop its answer, then go on with the connection."""
        if self.closed or self.transport is None or self.transport.is_closing():
            return
        if down.state == STREAMING:  # the handler ended in the middle of a stream: it must not look complete
            self.abort()
            return
        if down.state == NONE:
            req.keep_alive = False
            self.transport.write(self._closing_error(InternalError("the request ended without a response"),
                                                     req.path, req))
        if not req.keep_alive or self.front.closing:
            self.close()
            return
        self._phase = _IDLE
        self._since = self.loop.time()
        self._advance()
        if self.task is None and self._phase == _IDLE and self.front.keepalive_timeout:
            self._arm(self._since + self.front.keepalive_timeout)
        if self._read_paused and not self.transport.is_closing() and (
                self.task is None or self.parser.held <= self.limits.pipeline_buffer):
            self._read_paused = False
            self.transport.resume_reading()

    def _reject(self, err: EppError) -> None:
        """Answer input that cannot be served (malformed, a body over the limit) and close the connection. A body
        over the limit counts as the request's error, as when the proxy finds it; a malformed head is HTTP's (the
        access log has a line for either)."""
        director = self.front.proxy.director
        observer = director.observer
        obs = None
        if observer is not None:
            req = self.parser.current
            obs = observer.start("gateway", req.headers if req is not None else {}, self.parser.error_path())
        if isinstance(err, PayloadTooLarge):
            director.record_rejection(err, None, obs)
        elif obs is not None:
            obs.refused(err)
        if self.transport is not None:
            self.transport.write(self._closing_error(err, self.parser.error_path(), self.parser.current))
        self._linger()

    def _linger(self) -> None:
        """After answering refused input: send FIN once the answer is out, then read and discard until the client
        closes (or the lingering deadlines pass), as nginx's lingering close does. Closing at once with the
        client's bytes unread makes the kernel answer them with a reset, and a client still sending its body sees
        the reset instead of the answer. What the parser held is given back now."""
        transport = self.transport
        self.front.held -= self._counted
        self._counted = 0
        self.parser.discard()
        if transport is None or transport.is_closing() or not transport.can_write_eof():
            self.close()  # e.g. TLS, which cannot half-close: as before, closed once the answer is sent
            return
        transport.write_eof()
        now = self.loop.time()
        self._phase, self._since, self._last_read = _LINGER, now, now
        if self._read_paused:
            self._read_paused = False
            transport.resume_reading()
        self._arm(now + min(_LINGER_IDLE, _LINGER_TOTAL))

    def _closing_error(self, err: EppError, path: str, req: Request | None = None) -> bytes:
        """``err`` as a complete JSON error response (the envelope by ``path``) that announces the connection's
        close; with ``req`` (a parsed head) it carries the client's ``x-request-id``, or a new one, as the
        proxy's answers do."""
        rid = b"" if req is None else b"x-request-id: %b\r\n" % answer_request_id(req.headers).encode()
        if isinstance(err, HeldBudgetExceeded):
            rid += b"Retry-After: 1\r\n"  # load shed, as for a connection over the cap: worth retrying soon
        return closing_answer(err, rid + self.front.date(), anthropic=is_messages_path(path))

    # -- writing ----------------------------------------------------------------------------------------------

    def writable(self) -> asyncio.Transport:
        """The transport, or ``ConnectionResetError`` when the client is gone."""
        transport = self.transport
        if self.closed or transport is None or transport.is_closing():
            raise ConnectionResetError("the client went away")
        return transport

    def head(self, status: int, headers: HeaderItems, framing: bytes, req: Request) -> bytes:
        """A response head: status line, ``headers`` (lines with CR or LF are dropped), Date, ``framing`` and
        the connection header the keep-alive decision needs."""
        text = header_block(headers)
        if self.front.closing:
            req.keep_alive = False
        if not req.keep_alive:
            conn = b"Connection: close\r\n"
        else:
            conn = b"" if req.v11 else b"Connection: keep-alive\r\n"
        return b"HTTP/1.1 %d %b\r\n%b%b%b%b\r\n" % (status, REASONS.get(status, b"Unknown"),
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

    # -- deadlines --------------------------------------------------------------------------------------------

    def _arm(self, when: float) -> None:
        """Have the deadline timer fire by ``when``. One timer per connection, moved only earlier: a later
        deadline is found when it fires (so a request costs no timer of its own)."""
        if self._timer is not None:
            if self._timer_at <= when:
                return
            self._timer.cancel()
        self._timer_at = when
        self._timer = self.loop.call_at(when, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        if self.closed:
            return
        now = self.loop.time()
        due = self._due(now)
        if due is None:
            return  # busy, or no limit on this wait: the next wait arms the timer again
        if due > now:
            self._arm(due)
            return
        log.debug("gateway connection closed: %s", _CLOSED_BECAUSE[self._phase])
        self.close()

    def _due(self, now: float) -> float | None:
        """The deadline of what the connection waits for (None: none); in a body's wait, the end of a period
        that brought ``body_min_rate`` bytes a second starts the next one."""
        phase = self._phase
        if phase == _LINGER:
            return min(self._last_read + _LINGER_IDLE, self._since + _LINGER_TOTAL)
        if phase == _IDLE:
            return self._since + self.front.keepalive_timeout if self.front.keepalive_timeout else None
        if phase == _HEAD:
            return self._since + self.limits.header_timeout if self.limits.header_timeout else None
        req = self.parser.current
        timeout = self.limits.body_timeout
        if phase == _BUSY or req is None or not timeout:
            return None
        stalled = self._last_read + timeout
        window_end = self._since + timeout
        if window_end <= now < stalled:
            if req.size - self._window_base < self.limits.body_min_rate * timeout:
                return now  # too slow on average
            self._since, self._window_base = now, req.size
            window_end = now + timeout
        return min(stalled, window_end)
