"""The lean upstream client's per-connection half: one keep-alive HTTP/1.1 connection that parses one answer at
a time (``Content-Length``, chunked, or to EOF) into its :class:`LeanResponse`, and the response object the proxy
reads whole or relays into a sink from the connection's read callback. The pool that hands out connections is
:class:`epp.gateway._client.LeanUpstream` (its module docstring states the contract of both).
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from multidict import CIMultiDict

from ..errors import UpstreamTimeout
from ._upstream import Sink, UpstreamUnavailable, check_transfer_coding, unavailable

if TYPE_CHECKING:
    from ._client import LeanUpstream

__all__ = ["Http1Connection", "LeanResponse"]

_MAX_HEAD = 64 * 1024
_MAX_LENGTH_DIGITS = 18  # a Content-Length beyond 10**18 is garbage (and int() refuses over 4300 digits)
_HEX_DIGITS = b"0123456789abcdefABCDEF"
_STATUS_CODES = frozenset(str(code) for code in range(100, 1000))  # three ASCII digits (str.isdigit takes '²')
_HEAD, _LENGTH, _CHUNKED, _TO_EOF, _DONE = range(5)
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

    def _chunk(self, read: bytes, start: int) -> None:
        """A read that is exactly one whole chunk (payload ``read[start:-2]``): :meth:`_body` without the copy."""
        sink = self._sink
        if sink is None:
            self._body(read[start:-2], read)
            return
        try:
            full = sink.chunk(read, start)
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


class Http1Connection(asyncio.Protocol):
    """One upstream connection: parses one answer at a time into its :class:`LeanResponse`."""

    def __init__(self, pool: LeanUpstream, key: tuple[str, int], hostport: str) -> None:
        self.pool = pool
        self.key = key
        self.hostport = hostport
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.busy = False  # holds one of the pool's slots (between acquire and release/close)
        self.idle_since = 0.0
        self.resp: LeanResponse | None = None
        self._loop = asyncio.get_running_loop()
        self._state = _DONE
        self._buf = b""
        self._left = 0  # _LENGTH: body bytes still expected; _CHUNKED: bytes left in the current chunk
        self._keep_alive = True
        self._timeout = pool.upstream_timeout
        self._timer: asyncio.TimerHandle | None = None
        self._last = 0.0

    # -- requests ---------------------------------------------------------------------------------------------

    def send(self, raw: bytes) -> LeanResponse:
        """Write one request; its answer is parsed into the returned response."""
        assert self.transport is not None
        resp = self.resp = LeanResponse(self)
        self._state, self._buf, self._keep_alive = _HEAD, b"", True
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
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._stop_timer()
        resp, self.resp = self.resp, None
        if resp is not None:
            if self._state == _TO_EOF and exc is None:
                self._finish(resp, self._buf)
            else:
                resp._fail(unavailable(self.hostport, f"connection closed{': ' + str(exc) if exc else ''}"))
        self.pool._lost(self)

    def data_received(self, data: bytes) -> None:
        resp = self.resp
        if resp is None:  # nothing was asked: a broken server; never reuse this connection
            self.abort()
            return
        if self._timer is not None:
            self._last = self._loop.time()
        if self._state == _CHUNKED and self._left == -1 and not self._buf:
            # The relay's common case, decoded inline: the read is exactly one whole chunk (an SSE event as the
            # server wrote it), handed over as received. Anything else takes the general decoder.
            eol = data.find(b"\r\n")
            if 0 < eol <= 16:
                line = data[:eol]
                # Hex digits only (int() would also take a sign, "0x", "_" or spaces); a chunk extension or
                # garbage takes the general decoder, which reports the garbage.
                if not line.strip(_HEX_DIGITS):
                    size = int(line, 16)
                    if size > 0 and len(data) == eol + size + 4 and data[-2:] == b"\r\n":
                        resp._chunk(data, eol + 2)
                        return
        try:
            if self._state == _HEAD:
                data = self._parse_head(resp, self._buf + data if self._buf else data)
                if self._state == _HEAD:
                    return
                if resp.sse:  # the relay is set up from the head, before the first token
                    resp._wake()
            state = self._state
            if state == _CHUNKED:
                self._chunks(resp, data)
            elif state == _LENGTH:
                self._length(resp, data)
            elif state == _TO_EOF and data:
                resp._body(data, None)
        except UpstreamUnavailable as exc:
            resp._fail(exc)
            self.abort()

    # -- parsing ----------------------------------------------------------------------------------------------

    def _parse_head(self, resp: LeanResponse, buf: bytes) -> bytes:
        """Parse the head if complete; returns the bytes after it (``self._state`` tells what they are)."""
        while True:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > _MAX_HEAD:
                    raise unavailable(self.hostport, "response head too large")
                self._buf = buf
                return b""
            head, buf = buf[:end], buf[end + 4:]
            if self._head(resp, head):
                break
            # a 1xx interim answer: the real head follows
        self._buf = b""
        if self._state == _DONE:
            self._keep_alive = self._keep_alive and not buf
            self._finish(resp, b"")
            return b""
        return buf

    def _head(self, resp: LeanResponse, head: bytes) -> bool:
        """Parse one head into ``resp`` and set how its body is framed; False for an interim (1xx) answer.
        Raises :class:`UpstreamUnavailable` for a malformed head."""
        lines = head.decode("utf-8", "surrogateescape").split("\r\n")
        parts = lines[0].split(None, 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or parts[1] not in _STATUS_CODES:
            raise unavailable(self.hostport, f"malformed status line {lines[0][:100]!r}")
        status = int(parts[1])
        if status < 200:
            return False
        headers: CIMultiDict[str] = CIMultiDict()
        length: int | None = None
        coding: str | None = None  # the Transfer-Encoding lines, joined, lower-case
        connection = ""
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep:
                raise unavailable(self.hostport, f"malformed header line {line[:100]!r}")
            name, value = name.strip(), value.strip()
            headers.add(name, value)
            low = name.lower()
            if low == "content-length":
                if length is None and value.isascii() and value.isdigit() and len(value) <= _MAX_LENGTH_DIGITS:
                    length = int(value)  # the common case; a list, a repeat or garbage takes _content_length
                else:
                    length = self._content_length(value, length)
            elif low == "transfer-encoding":
                coding = value.lower() if coding is None else f"{coding},{value.lower()}"
            elif low == "connection":
                connection = f"{connection},{value.lower()}"
        resp.status, resp.headers = status, headers
        resp.sse = "text/event-stream" in headers.get("Content-Type", "")
        self._keep_alive = "close" not in connection and (parts[0] != "HTTP/1.0" or "keep-alive" in connection)
        self._framing(status, length, coding)
        return True

    def _content_length(self, value: str, known: int | None) -> int:
        """A Content-Length line's value: ASCII digits, or a list repeating one value (RFC 9110 §8.6). It must
        equal ``known``, an earlier line's value, when there was one (RFC 9112 §6.3: conflicting lengths are
        a malformed answer)."""
        for item in value.split(","):
            item = item.strip()
            if not (item.isascii() and item.isdigit()) or len(item) > _MAX_LENGTH_DIGITS:
                raise unavailable(self.hostport, f"bad Content-Length {value[:40]!r}")
            length = int(item)
            if known is not None and length != known:
                raise unavailable(self.hostport, f"conflicting Content-Length values {value[:40]!r}")
            known = length
        return length

    def _framing(self, status: int, length: int | None, coding: str | None) -> None:
        """How the body is delimited (RFC 9112 §6.3): no body for 204 and 304; a Transfer-Encoding of chunked
        wins over Content-Length (the connection is then not reused: both at once may be a smuggling attempt);
        any other transfer coding is a malformed answer (:func:`check_transfer_coding`: a final coding other than
        chunked cannot be delimited, and one before it, such as gzip, was not asked for and would reach the client
        undecoded); then Content-Length; else the body runs to the end of the connection."""
        if status in (204, 304):
            self._state = _DONE
        elif coding is not None:
            if coding != "chunked":  # the common case costs no call
                check_transfer_coding(self.hostport, coding)
            self._state, self._left = _CHUNKED, -1
            if length is not None:
                self._keep_alive = False
        elif length is not None:
            self._state, self._left = (_LENGTH, length) if length else (_DONE, 0)
        else:
            self._state, self._keep_alive = _TO_EOF, False

    def _length(self, resp: LeanResponse, data: bytes) -> None:
        left = self._left - len(data)
        if left > 0:
            self._left = left
            if data:
                resp._body(data, None)
            return
        if left < 0:
            raise unavailable(self.hostport, "more data than Content-Length")
        self._finish(resp, data)

    def _chunks(self, resp: LeanResponse, data: bytes) -> None:
        """Decode chunked framing. A read made of whole chunks is also handed over as received (``framed``),
        so the relay can forward it without re-framing."""
        buf = self._buf + data if self._buf else data
        pos, n, left = 0, len(buf), self._left
        out: list[bytes] = []
        whole = not self._buf and left == -1  # the read starts at a chunk boundary
        while pos < n:
            if left == -1:  # expecting a size line
                eol = buf.find(b"\r\n", pos)
                if eol < 0:
                    break
                line = buf[pos:eol]  # hex digits alone are the common case; else extensions or garbage
                size = int(line, 16) if line and not line.strip(_HEX_DIGITS) else self._chunk_size(line)
                pos = eol + 2
                if size == 0:
                    self._buf = b""
                    self._trailer(resp, buf[pos:], b"".join(out))
                    return
                left = size
            elif left == -2:  # the CRLF after a chunk's data
                if n - pos < 2:
                    break
                if buf[pos:pos + 2] != b"\r\n":
                    raise unavailable(self.hostport, "chunk not followed by CRLF")
                pos += 2
                left = -1
            else:
                take = min(left, n - pos)
                out.append(buf[pos:pos + take])
                pos += take
                left -= take
                if left == 0:
                    left = -2
        self._left = left
        self._buf = buf[pos:] if pos < n else b""
        if not out:
            return
        payload = out[0] if len(out) == 1 else b"".join(out)
        resp._body(payload, data if whole and left == -1 and not self._buf else None)

    def _chunk_size(self, line: bytes) -> int:
        """The size a chunk-size line announces (RFC 9112 §7.1: hex digits, then optional ``;`` extensions
        after optional blanks). Anything else (a sign, ``0x``, ``_``, blanks inside or around the digits) is a
        malformed answer: raises :class:`UpstreamUnavailable`."""
        digits, semi, _ = line.partition(b";")
        if semi:
            digits = digits.rstrip(b" \t")
        if not digits or digits.strip(_HEX_DIGITS):
            raise unavailable(self.hostport, f"bad chunk size {line[:20]!r}")
        return int(digits, 16)

    def _trailer(self, resp: LeanResponse, rest: bytes, payload: bytes) -> None:
        """After the last chunk: the answer is complete. The connection is reused only when exactly the final
        CRLF follows (no trailers, nothing extra); trailers are ignored, and one split across reads (rare)
        costs only the keep-alive."""
        self._keep_alive = self._keep_alive and rest == b"\r\n"
        self._finish(resp, payload)

    def _finish(self, resp: LeanResponse, tail: bytes) -> None:
        self._state = _DONE
        self.resp = None
        resp._conn = None
        if self._keep_alive and not self.closed:
            self.pool._release(self)
        else:
            self.abort()  # connection_lost tells the pool
        resp._end(tail)
