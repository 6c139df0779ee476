"""The upstream side: which headers cross the gateway, upstream URLs, and the one place aiohttp client
exceptions become :class:`~epp.errors.EppError` (like httpx's ``map_httpcore_exceptions``).

Failures are sorted into two kinds, because the retry rule depends on it:

* :class:`UpstreamUnavailable` (an ``UpstreamError``, 502): the connection failed or broke, or connecting took
  too long. The request may be retried on another endpoint while no byte has reached the client.
* :class:`~epp.errors.UpstreamTimeout` (504): the model server accepted the request but did not answer within
  the upstream timeout. Not retried (the server may still be working on it).

A malformed answer counts as the first kind: it is found in the response head (a status line, framing or, with
:func:`check_transfer_coding`, a transfer coding EPP did not ask for), so nothing has reached the client yet.
"""

from __future__ import annotations

import asyncio
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Awaitable, Callable, Iterator, Mapping, Protocol

import aiohttp
from multidict import CIMultiDict
from yarl import URL

from epp.errors import UpstreamError, UpstreamTimeout
from epp.framework.endpoint import Endpoint
from epp.framework.request import REQUEST_ID_HEADER
from epp.headers import (
    DESTINATION_HEADER,
    FAIRNESS_ID_HEADER,
    MODEL_REWRITE_HEADER,
    OBJECTIVE_HEADER,
    SERVED_HEADER,
    SUBSET_HEADER,
    header_names,
)

__all__ = ["UpstreamLimits", "UpstreamUnavailable", "UPSTREAM_ERRORS", "translate_upstream_error", "unavailable",
           "map_upstream_errors", "upstream_headers", "client_headers", "upstream_url", "make_session", "HOP_BY_HOP",
           "PREFILLER_HEADER", "Sink", "UpstreamResponse", "Upstream", "AiohttpUpstream", "AiohttpResponse",
           "TRANSPORTS", "check_transfer_coding"]

TRANSPORTS = ("lean", "aiohttp")
"""Upstream HTTP clients the gateway can use for proxied requests: ``lean`` (``_client``, the default) or
aiohttp's ``ClientSession``."""

class Sink(Protocol):
    """Where a relayed stream goes, one upstream read at a time. Both methods return True when the client's
    buffer is full (the relay then waits for it to drain before reading more)."""

    def __call__(self, payload: bytes, framed: bytes | None) -> bool:
        """One read's body bytes; ``framed``: the same bytes with their chunked framing, when the read was made
        of whole chunks, else None."""

    def chunk(self, read: bytes, start: int) -> bool:
        """A read that is exactly one whole chunk, as received: its payload is ``read[start:-2]``. The per-token
        fast path of a relayed SSE stream (servers write one event per chunk), so no copy of the payload is
        made unless the sink needs one."""


class UpstreamResponse(Protocol):
    """An upstream answer as the proxy uses it, whichever client produced it. Body methods raise
    :class:`UpstreamUnavailable` or :class:`~epp.errors.UpstreamTimeout` on upstream failures."""

    @property
    def status(self) -> int: ...

    @property
    def headers(self) -> Mapping[str, str]: ...

    @property
    def sse(self) -> bool:
        """Whether the answer is a server-sent event stream (relayed as it arrives)."""
        ...

    async def read(self) -> bytes:
        """The whole body."""

    async def first(self) -> bytes:
        """The first body bytes available (``b""`` at the end of the body)."""

    def at_eof(self) -> bool:
        """Whether the body has been handed out completely."""

    async def pump(self, sink: Sink, drain: Callable[[], Awaitable[None]]) -> bytes:
        """Relay the rest of the body into ``sink``; returns bytes that arrived with the end of the body."""

    def close(self) -> None:
        """Release the answer (aborts the upstream request if it was not read to the end)."""


class Upstream(Protocol):
    """A pooled upstream HTTP client."""

    async def post(self, endpoint: Endpoint, raw_path: str, body: bytes,
                   headers: Mapping[str, str]) -> UpstreamResponse:
        """Send the request; returns once the answer started (see each implementation)."""

    async def close(self) -> None:
        """Close every connection."""

PREFILLER_HEADER = "x-prefiller-host-port"

HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection", "te", "trailer",
    "trailers", "transfer-encoding", "upgrade",
})
"""RFC 9110 §7.6.1 connection-specific headers: never forwarded in either direction."""

_REQUEST_DROP = HOP_BY_HOP | {
    "host", "content-length", "expect", "content-type",
    "content-encoding",  # the body goes upstream decoded (epp.gateway._encoding)
    # Responses are read (usage) and sometimes rewritten (P/D cached_tokens, model name), so ask for identity.
    "accept-encoding",
} | {  # EPP's own request headers under both names, consumed here as in ext_proc mode (never echoed upstream there)
    name for header in (FAIRNESS_ID_HEADER, OBJECTIVE_HEADER, MODEL_REWRITE_HEADER, DESTINATION_HEADER, SERVED_HEADER,
                        SUBSET_HEADER) for name in header_names(header)
}
_RESPONSE_DROP = HOP_BY_HOP | {"content-length", "date", "server"}


@dataclass(frozen=True, slots=True)
class UpstreamLimits:
    """Connection pool of the shared upstream ``ClientSession``.

    ``max_connections`` bounds all upstream connections (0 = unbounded), ``max_per_endpoint`` those to one model
    server (0 = unbounded); idle keep-alive connections close after ``keepalive_timeout`` seconds.
    """

    max_connections: int = 4096
    max_per_endpoint: int = 0
    keepalive_timeout: float = 60.0


class UpstreamUnavailable(UpstreamError):
    """The model server could not be reached, or the connection broke before the response was complete."""


def make_session(limits: UpstreamLimits, *, connect_timeout: float, upstream_timeout: float | None
                 ) -> aiohttp.ClientSession:
    """The shared upstream session: keep-alive pool, no cookies, bytes passed through undecoded.

    ``upstream_timeout`` bounds the wait for the response and every gap between two chunks (``sock_read``);
    ``connect_timeout`` bounds connecting. There is no total deadline, so long generations can stream.
    """
    connector = aiohttp.TCPConnector(limit=limits.max_connections, limit_per_host=limits.max_per_endpoint,
                                     keepalive_timeout=limits.keepalive_timeout, ttl_dns_cache=300)
    timeout = aiohttp.ClientTimeout(total=None, connect=None, sock_connect=connect_timeout,
                                    sock_read=upstream_timeout)
    return aiohttp.ClientSession(connector=connector, timeout=timeout, auto_decompress=False,
                                 cookie_jar=aiohttp.DummyCookieJar(), raise_for_status=False,
                                 skip_auto_headers=("User-Agent", "Accept-Encoding", "Content-Type"))


UPSTREAM_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError)
"""What an upstream call may raise; :func:`translate_upstream_error` turns each into an EPP error."""


def translate_upstream_error(endpoint: Endpoint, exc: BaseException) -> UpstreamError | UpstreamTimeout:
    """The EPP error for an aiohttp client failure talking to ``endpoint`` (see the module docstring)."""
    where = f"model server {endpoint.hostport}"
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return UpstreamUnavailable(f"{where} did not accept a connection in time", reason="upstream_unavailable")
    if isinstance(exc, (aiohttp.ServerTimeoutError, asyncio.TimeoutError)):
        return UpstreamTimeout(f"{where} did not respond within the upstream timeout", reason="upstream_timeout")
    return unavailable(endpoint.hostport, str(exc) or type(exc).__name__)


def unavailable(hostport: str, detail: str) -> UpstreamUnavailable:
    """The retryable error for a model server that could not be reached or broke the connection."""
    return UpstreamUnavailable(f"model server {hostport} unreachable: {detail}", reason="upstream_unavailable")


def check_transfer_coding(hostport: str, coding: str) -> None:
    """Pass a response's ``Transfer-Encoding`` (its lines joined with commas) that is ``chunked`` alone (any case,
    blanks and empty list elements ignored); raise :class:`UpstreamUnavailable` for anything else.

    Why refuse rather than decode: EPP never sends ``TE``, so the only transfer coding a model server may apply is
    chunked (RFC 9112 §7.4, RFC 9110 §10.1.4); Transfer-Encoding is hop-by-hop and not forwarded, so relaying the
    bytes would hand the client, say, gzip data with nothing saying so. The check runs once per response head,
    never per chunk, and the answer is retried on another endpoint like any malformed answer."""
    if coding != "chunked" and [c.strip() for c in coding.lower().split(",") if c.strip()] != ["chunked"]:
        raise unavailable(hostport, f"unsupported Transfer-Encoding {coding[:40]!r} (only chunked is accepted)")


@contextmanager
def map_upstream_errors(endpoint: Endpoint) -> Iterator[None]:
    """Raise :func:`translate_upstream_error` of any aiohttp client failure inside the block."""
    try:
        yield
    except UPSTREAM_ERRORS as exc:
        raise translate_upstream_error(endpoint, exc) from exc


def upstream_headers(client: Mapping[str, str], extra: Mapping[str, str], request_id: str, *,
                     drop_prefiller: bool) -> dict[str, str]:
    """Headers for the upstream request: the client's (lower-case names) minus hop-by-hop, EPP-owned and
    ``Connection``-listed ones, plus ``extra`` (PreRequest plugins), ``x-request-id`` and a JSON content type
    (the body parsed as JSON; ``curl -d`` would otherwise announce a form and model servers reject it)."""
    drop = _REQUEST_DROP
    listed = client.get("connection")
    if listed:
        drop = drop | {t.strip().lower() for t in listed.split(",")}
    out = {k: v for k, v in client.items() if k not in drop}
    if extra:
        out.update(extra)
    if drop_prefiller:
        out.pop(PREFILLER_HEADER, None)
    out[REQUEST_ID_HEADER] = request_id
    out["content-type"] = "application/json"
    return out


def client_headers(upstream: Mapping[str, str], extra: Mapping[str, str]) -> CIMultiDict[str]:
    """Headers for the client response: the upstream's minus hop-by-hop, ``Connection``-listed ones, length and
    the server's own ``Date``/``Server`` (aiohttp writes its own), plus ``extra`` (scheduling's response
    headers)."""
    out: CIMultiDict[str] = CIMultiDict()
    listed = ""
    for k, v in upstream.items():
        low = k.lower()
        if low not in _RESPONSE_DROP:
            out.add(k, v)
        elif low == "connection":
            listed = f"{listed},{v}"
    if listed:  # RFC 9110 §7.6.1: the headers a Connection header names are hop-by-hop too
        for name in listed.split(","):
            out.popall(name.strip(), None)
    if extra:
        out.update(extra)
    return out


def upstream_url(endpoint: Endpoint, raw_path: str) -> URL:
    """``scheme://address:port`` of ``endpoint`` plus the client's raw (already encoded) path and query."""
    return URL(f"{endpoint.spec.scheme}://{endpoint.hostport}{raw_path}", encoded=True)


class AiohttpResponse:
    """An aiohttp ``ClientResponse`` behind the :class:`UpstreamResponse` interface.

    Every read of the body waits at most ``read_timeout`` seconds (None: no limit), then raises
    :class:`~epp.errors.UpstreamTimeout` as the lean client does. The session's ``sock_read`` timeout is not
    enough on its own: after a malformed chunk, aiohttp's chunk parser stops feeding the body and its
    ``readany()`` never returns, not even when the server closes the connection. Time spent waiting for the
    client to drain does not count.
    """

    __slots__ = ("_endpoint", "_resp", "_timeout", "headers", "sse", "status")

    def __init__(self, endpoint: Endpoint, resp: aiohttp.ClientResponse, read_timeout: float | None = None) -> None:
        self.status = resp.status
        self.headers: Mapping[str, str] = resp.headers
        self.sse = "text/event-stream" in resp.headers.get("Content-Type", "")
        self._resp = resp
        self._endpoint = endpoint
        self._timeout = read_timeout

    async def read(self) -> bytes:
        parts = []
        with map_upstream_errors(self._endpoint):
            while chunk := await self._readany():
                parts.append(chunk)
        return b"".join(parts)

    async def first(self) -> bytes:
        with map_upstream_errors(self._endpoint):
            return await self._readany()

    def at_eof(self) -> bool:
        return self._resp.content.at_eof()

    async def pump(self, sink: Sink, drain: Callable[[], Awaitable[None]]) -> bytes:
        at_eof = self._resp.content.at_eof
        with map_upstream_errors(self._endpoint):
            while True:
                chunk = await self._readany()
                if not chunk or at_eof():
                    return chunk
                if sink(chunk, None):
                    await drain()

    async def _readany(self) -> bytes:
        """The body bytes available, waiting for some (``b""`` at the end) for at most the read timeout
        (``TimeoutError``, which :func:`map_upstream_errors` makes an ``UpstreamTimeout``)."""
        async with asyncio.timeout(self._timeout):
            return await self._resp.content.readany()

    def close(self) -> None:
        self._resp.close()  # no-op when fully read (the connection is back in the pool); aborts it otherwise


class AiohttpUpstream:
    """aiohttp's ``ClientSession`` behind the :class:`Upstream` interface (``transport="aiohttp"``). Each read of
    a body waits at most the session's ``sock_read`` timeout (the upstream timeout, :func:`make_session`; see
    :class:`AiohttpResponse`)."""

    def __init__(self, session: aiohttp.ClientSession) -> None:
        self.session = session
        self.read_timeout: float | None = session.timeout.sock_read

    async def post(self, endpoint: Endpoint, raw_path: str, body: bytes,
                   headers: Mapping[str, str]) -> AiohttpResponse:
        with map_upstream_errors(endpoint):
            resp = await self.session.post(upstream_url(endpoint, raw_path), data=body, headers=headers)
        codings = resp.headers.getall("Transfer-Encoding", None)
        if codings is not None:  # aiohttp decodes chunked only and would pass any other coding on undecoded
            try:
                check_transfer_coding(endpoint.hostport, ",".join(codings))
            except UpstreamUnavailable:
                resp.close()
                raise
        return AiohttpResponse(endpoint, resp, self.read_timeout)

    async def close(self) -> None:
        """The session belongs to the app (or the caller), which closes it."""
