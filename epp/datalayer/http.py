"""A minimal keep-alive HTTP/1.1 GET client for metrics scraping (the scraper's default transport).

Scraping is one small GET per endpoint every 50 ms, forever, and aiohttp's client costs noticeably more CPU per
request (docs/benchmarks.md); aiohttp stays available (``transport: aiohttp``). :class:`MetricsHttpClient`:
``await get(key, scheme, host, port, path, timeout)`` returns ``(status, body)`` over one keep-alive connection per
``key`` (one request at a time per key). Responses are parsed strictly by
:class:`epp.http1.response.ResponseParser`; gzip/deflate bodies are inflated; a body over ``max_bytes`` is an error.
Any failure raises :class:`HttpError` or ``TimeoutError`` and closes that connection; the next ``get`` reconnects.
"""

from __future__ import annotations

import asyncio
import ssl as ssl_module
import zlib
from typing import Hashable, cast

from epp.http1.response import LENGTH, ResponseError, ResponseParser

__all__ = ["MetricsHttpClient", "HttpError"]


class HttpError(Exception):
    """The request failed below the HTTP status level (connection, framing, size)."""


class _Conn(asyncio.Protocol):
    """One connection; its responses are parsed one at a time by llhttp into ``waiter``."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.transport: asyncio.Transport | None = None
        self.waiter: asyncio.Future[tuple[int, bytes, bool]] | None = None
        self.closed = False
        self.used = False  # has served a response already (a keep-alive reuse candidate)
        self.got_data = False  # received any byte for the current request
        self._parser = ResponseParser()
        self._body: list[bytes] = []
        self._size = 0
        self._encoding = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # a TCP connection's: a full (read-write) transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if exc is None and self._parser.feed_eof():
            self._finish()  # a body delimited by the end of the connection is complete now
        else:
            self._fail(HttpError(f"connection closed{': ' + str(exc) if exc else ''}"))

    def data_received(self, data: bytes) -> None:
        if self.waiter is None or self.waiter.done():
            self._fail(HttpError("unexpected data between responses"))
            self.abort()
            return
        self.got_data = True
        parser = self._parser
        try:
            head_done = parser.head_done
            body = parser.feed(data)
            if not head_done and parser.head_done:
                self._head(parser)
            if body:
                self._size += len(body)
                if self._size > self.max_bytes:
                    raise HttpError(f"body larger than {self.max_bytes} bytes")
                self._body.append(body)
        except ResponseError as exc:
            self._fail(HttpError(str(exc)))
            self.abort()
        except HttpError as exc:
            self._fail(exc)
            self.abort()
        else:
            if parser.done:
                self._finish()

    def request(self, raw: bytes) -> asyncio.Future[tuple[int, bytes, bool]]:
        assert self.transport is not None
        self._parser.begin()
        self._body, self._size, self._encoding = [], 0, b""
        self.got_data = False
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(raw)
        return self.waiter

    def time_out(self) -> None:
        """The caller's deadline passed: fail the pending response and drop the connection."""
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(TimeoutError())
        self.abort()

    def abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    def _head(self, parser: ResponseParser) -> None:
        """Checks on the head: a body announced larger than allowed fails at once; note the content coding."""
        if parser.framing == LENGTH and parser.content_length is not None and parser.content_length > self.max_bytes:
            raise HttpError(f"body larger than {self.max_bytes} bytes")
        for name, value in parser.headers:
            if len(name) == 16 and name.lower() == b"content-encoding":
                self._encoding = value.lower()

    def _finish(self) -> None:
        body = self._body[0] if len(self._body) == 1 else b"".join(self._body)
        if self._encoding in (b"gzip", b"x-gzip", b"deflate"):
            try:
                body = _inflate(body, self.max_bytes)
            except zlib.error as exc:
                self._fail(HttpError(f"bad {self._encoding.decode()} body: {exc}"))
                return
            except HttpError as exc:
                self._fail(exc)
                return
        elif self._encoding not in (b"", b"identity"):
            self._fail(HttpError(f"unsupported Content-Encoding {self._encoding.decode('latin-1')!r}"))
            return
        if self.waiter is not None and not self.waiter.done():
            self.used = True
            self.waiter.set_result((self._parser.status, body, self._parser.keep_alive))

    def _fail(self, exc: Exception) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(exc)


def _inflate(body: bytes, max_bytes: int) -> bytes:
    """``body`` (gzip or zlib) inflated; ``HttpError`` as soon as it would exceed ``max_bytes``.

    A few KB can inflate to gigabytes: the limit bounds the output, not the input, and inflating stops there
    (this runs on the event loop).
    """
    inflater = zlib.decompressobj(47)  # 32 + 15: gzip or zlib header, auto-detected
    out = inflater.decompress(body, max_bytes + 1)
    if len(out) > max_bytes:
        raise HttpError(f"body inflates to more than {max_bytes} bytes")
    if not inflater.eof:
        raise zlib.error("incomplete or truncated stream")
    return out


class MetricsHttpClient:
    """Keep-alive GET client with one connection per caller key (see the module docstring)."""

    def __init__(self, *, accept: str, compression: bool = False, insecure_skip_verify: bool = True,
                 max_bytes: int = 16 * 1024 * 1024, ssl_context: ssl_module.SSLContext | None = None) -> None:
        """``ssl_context`` is used for ``https`` when given (a CA bundle, a client certificate); otherwise the
        system trust store, or no verification at all with ``insecure_skip_verify``."""
        self._accept = accept
        self._encoding = "gzip" if compression else "identity"
        self._max_bytes = max_bytes
        self._conns: dict[Hashable, _Conn] = {}
        self._requests: dict[tuple[str, str, int, str], bytes] = {}
        self._ssl: ssl_module.SSLContext | None = ssl_context
        self._insecure = insecure_skip_verify

    async def get(self, key: Hashable, scheme: str, host: str, port: int, path: str,
                  timeout: float) -> tuple[int, bytes]:
        """GET ``path``; ``(status, body)``. Raises ``HttpError`` or ``TimeoutError``.

        A reused keep-alive connection that the server closed before answering (idle timeout racing the
        request) is retried once on a fresh connection, as browsers and HTTP libraries do for idempotent GETs.
        """
        raw = self._request(scheme, host, port, path)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        try:
            conn = self._conns.get(key)
            if conn is not None and not conn.closed:
                try:
                    return self._done(key, await self._exchange(loop, conn, raw, deadline))
                except HttpError:
                    if conn.got_data or not conn.used:
                        raise
            async with asyncio.timeout_at(deadline):
                conn = await self._connect(scheme, host, port)
            self._conns[key] = conn
            return self._done(key, await self._exchange(loop, conn, raw, deadline))
        except BaseException:
            self.close(key)
            raise

    @staticmethod
    async def _exchange(loop: asyncio.AbstractEventLoop, conn: _Conn, raw: bytes,
                        deadline: float) -> tuple[int, bytes, bool]:
        # A plain timer on the response future: cheaper than an ``asyncio.timeout`` scope per scrape.
        waiter = conn.request(raw)
        timer = loop.call_at(deadline, conn.time_out)
        try:
            return await waiter
        finally:
            timer.cancel()

    def _done(self, key: Hashable, result: tuple[int, bytes, bool]) -> tuple[int, bytes]:
        status, body, keep_alive = result
        if not keep_alive:
            self.close(key)
        return status, body

    def close(self, key: Hashable) -> None:
        """Drop ``key``'s connection, if any."""
        conn = self._conns.pop(key, None)
        if conn is not None:
            conn.abort()

    async def aclose(self) -> None:
        """Drop every connection."""
        for key in list(self._conns):
            self.close(key)
        await asyncio.sleep(0)  # let the transports run their connection_lost callbacks

    async def _connect(self, scheme: str, host: str, port: int) -> _Conn:
        loop = asyncio.get_running_loop()
        ssl = self._ssl_context() if scheme == "https" else None
        try:
            _, conn = await loop.create_connection(lambda: _Conn(self._max_bytes), host, port, ssl=ssl,
                                                   server_hostname=host if ssl is not None else None)
        except OSError as exc:
            raise HttpError(f"cannot connect to {host}:{port}: {exc.strerror or exc}") from exc
        return conn

    def _request(self, scheme: str, host: str, port: int, path: str) -> bytes:
        key = (scheme, host, port, path)
        raw = self._requests.get(key)
        if raw is None:
            hostport = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
            raw = (f"GET {path} HTTP/1.1\r\nHost: {hostport}\r\nAccept: {self._accept}\r\n"
                   f"Accept-Encoding: {self._encoding}\r\nUser-Agent: epp-scraper\r\n\r\n").encode("latin-1")
            if len(self._requests) > 4096:
                self._requests.clear()
            self._requests[key] = raw
        return raw

    def _ssl_context(self) -> ssl_module.SSLContext:
        if self._ssl is None:
            ctx = ssl_module.create_default_context()
            if self._insecure:
                ctx.check_hostname = False
                ctx.verify_mode = ssl_module.CERT_NONE
            self._ssl = ctx
        return self._ssl
