"""A lean keep-alive HTTP/1.1 client for the proxy's hot path (the gateway's default upstream transport).

:class:`LeanUpstream` has the contract of the aiohttp adapter in ``_upstream``: ``await post(endpoint, raw_path,
body, headers)`` sends one request on a pooled keep-alive connection and returns a :class:`LeanResponse` once the
head is in (and, for a non-SSE answer, the whole body). It raises :class:`UpstreamUnavailable` (retryable before any
byte reached the client) or :class:`~epp.errors.UpstreamTimeout`. It is an ``asyncio.Protocol``: each upstream read
of a relayed stream is handed to the relay in the same callback (no task switch per chunk). Plain ``http`` only;
answers are parsed strictly by :class:`epp.http1.response.ResponseParser` and passed through undecoded. A
connection goes back to the pool only when its answer was read to the end; :meth:`LeanResponse.close` before that
aborts it (the model server sees the request cancelled).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from epp.framework.endpoint import Endpoint
from epp.gateway._h1request import header_block
from epp.gateway._http1 import Http1Connection, LeanResponse
from epp.gateway._upstream import Upstream, UpstreamLimits, UpstreamResponse, UpstreamUnavailable, unavailable

__all__ = ["LeanResponse", "LeanUpstream"]


class LeanUpstream:
    """The pool of upstream connections (see the module docstring for the contract)."""

    def __init__(self, limits: UpstreamLimits = UpstreamLimits(), *, connect_timeout: float = 5.0,
                 upstream_timeout: float | None = 300.0, tls: Upstream | None = None) -> None:
        self.limits = limits
        self.tls = tls
        self.connect_timeout = connect_timeout
        self.upstream_timeout = upstream_timeout
        self._idle: dict[tuple[str, int], list[Http1Connection]] = {}
        self._busy: dict[tuple[str, int], int] = {}
        self._busy_total = 0
        # Requests waiting for a free slot, oldest first: each one's future and endpoint key.
        self._waiters: dict[asyncio.Future[None], tuple[str, int]] = {}
        self._all: set[Http1Connection] = set()
        self._sweeper: asyncio.TimerHandle | None = None
        self._heads: dict[tuple[str, str, int], str] = {}

    async def post(self, endpoint: Endpoint, raw_path: str, body: bytes,
                   headers: Mapping[str, str]) -> UpstreamResponse:
        """Send ``POST raw_path`` with ``body`` to ``endpoint``; see the module docstring."""
        if endpoint.spec.scheme != "http":
            if self.tls is None:
                raise unavailable(endpoint.hostport, "the lean upstream client speaks plain http only")
            return await self.tls.post(endpoint, raw_path, body, headers)
        key = (endpoint.spec.address, endpoint.spec.port)
        hostport = endpoint.hostport
        raw = self._request(hostport, raw_path, body, headers)
        conn = await self._acquire(key, hostport)
        resp = conn.send(raw)
        try:
            while not resp._ended and not resp.sse:
                await resp._wait()
        except BaseException:
            resp.close()
            raise
        return resp

    async def close(self) -> None:
        """Close every connection (idle or busy)."""
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        for conn in list(self._all):
            conn.abort()
        self._idle.clear()
        await asyncio.sleep(0)

    # -- request head ------------------------------------------------------------------------------------------

    def _request(self, hostport: str, raw_path: str, body: bytes, headers: Mapping[str, str]) -> bytes:
        """The request's bytes (a header holding CR or LF is dropped: :func:`header_block`)."""
        head = (f"POST {raw_path} HTTP/1.1\r\nHost: {hostport}\r\n{header_block(headers)}"
                f"Content-Length: {len(body)}\r\n\r\n")
        return head.encode("utf-8", "surrogateescape") + body

    # -- pool -------------------------------------------------------------------------------------------------

    async def _acquire(self, key: tuple[str, int], hostport: str) -> Http1Connection:
        """A connection to ``key`` holding one of the pool's slots, waiting for a free slot when the limits are
        reached. A waiter that is cancelled (its client went away) leaves the queue, and passes the slot on
        when it had just been given one."""
        while not self._may_take(key):
            fut = asyncio.get_running_loop().create_future()
            self._waiters[fut] = key
            try:
                await fut
            except BaseException:
                if self._waiters.pop(fut, None) is None and fut.done() and not fut.cancelled():
                    self._wake_waiter()  # woken, then cancelled before taking the slot: pass it on
                raise
        self._busy[key] = self._busy.get(key, 0) + 1
        self._busy_total += 1
        try:
            conn = self._idle_conn(key) or await self._connect(key, hostport)
        except BaseException:
            self._unbusy(key)
            raise
        conn.busy = True
        return conn

    def _may_take(self, key: tuple[str, int]) -> bool:
        limits = self.limits
        if limits.max_connections and self._busy_total >= limits.max_connections:
            return False
        return not (limits.max_per_endpoint and self._busy.get(key, 0) >= limits.max_per_endpoint)

    def _idle_conn(self, key: tuple[str, int]) -> Http1Connection | None:
        idle = self._idle.get(key)
        while idle:
            conn = idle.pop()
            transport = conn.transport
            if not conn.closed and transport is not None and not transport.is_closing():
                return conn
        return None

    async def _connect(self, key: tuple[str, int], hostport: str) -> Http1Connection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout):
                _, conn = await loop.create_connection(lambda: Http1Connection(self, key, hostport), key[0], key[1])
        except TimeoutError:
            raise UpstreamUnavailable(f"model server {hostport} did not accept a connection in time",
                                      reason="upstream_unavailable") from None
        except OSError as exc:
            raise unavailable(hostport, f"cannot connect: {exc.strerror or exc}") from exc
        self._all.add(conn)
        return conn

    def release(self, conn: Http1Connection) -> None:
        """An answer was read to the end on a reusable connection: back to the idle list."""
        conn.idle_since = conn._loop.time()
        self._idle.setdefault(conn.key, []).append(conn)
        conn.busy = False
        self._unbusy(conn.key)
        if self._sweeper is None:
            self._sweeper = conn._loop.call_later(self._sweep_every(), self._sweep)

    def forget(self, conn: Http1Connection) -> None:
        """``conn`` is closed: forget it (a busy one frees its slot)."""
        self._all.discard(conn)
        if conn.busy:
            conn.busy = False
            self._unbusy(conn.key)
            return
        idle = self._idle.get(conn.key)
        if idle and conn in idle:
            idle.remove(conn)

    def _unbusy(self, key: tuple[str, int]) -> None:
        self._busy[key] -= 1
        self._busy_total -= 1
        if self._waiters:
            self._wake_waiter()

    def _wake_waiter(self) -> None:
        """Give a free slot to the oldest waiter that may take it; waiters already done (cancelled, their task
        not yet run) are dropped on the way."""
        waiters = self._waiters
        for fut, key in list(waiters.items()):
            if fut.done():
                del waiters[fut]
            elif self._may_take(key):
                del waiters[fut]
                fut.set_result(None)
                return

    def _sweep_every(self) -> float:
        return max(0.5, self.limits.keepalive_timeout / 2)

    def _sweep(self) -> None:
        """Close connections idle for longer than ``keepalive_timeout``."""
        self._sweeper = None
        if not self._all:
            return
        loop = asyncio.get_running_loop()
        expired = loop.time() - self.limits.keepalive_timeout
        for idle in self._idle.values():
            while idle and idle[0].idle_since < expired:
                idle.pop(0).abort()
        if any(self._idle.values()):
            self._sweeper = loop.call_later(self._sweep_every(), self._sweep)
