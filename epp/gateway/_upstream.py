"""The upstream side: which headers cross the gateway, upstream URLs, and the one place aiohttp client
exceptions become :class:`~epp.errors.EppError` (like httpx's ``map_httpcore_exceptions``).

Failures are sorted into two kinds, because the retry rule depends on it:

* :class:`UpstreamUnavailable` (an ``UpstreamError``, 502): the connection failed or broke, or connecting took
  too long. The request may be retried on another endpoint while no byte has reached the client.
* :class:`~epp.errors.UpstreamTimeout` (504): the model server accepted the request but did not answer within
  the upstream timeout. Not retried (the server may still be working on it).
"""

from __future__ import annotations

import asyncio
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Mapping

import aiohttp
from multidict import CIMultiDict
from yarl import URL

from ..endpoint import Endpoint
from ..errors import UpstreamError, UpstreamTimeout
from ..request import FAIRNESS_ID_HEADER, MODEL_REWRITE_HEADER, OBJECTIVE_HEADER, REQUEST_ID_HEADER

__all__ = ["UpstreamLimits", "UpstreamUnavailable", "UPSTREAM_ERRORS", "translate_upstream_error",
           "map_upstream_errors", "upstream_headers", "client_headers", "upstream_url", "make_session", "HOP_BY_HOP",
           "PREFILLER_HEADER"]

PREFILLER_HEADER = "x-prefiller-host-port"

HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection", "te", "trailer",
    "trailers", "transfer-encoding", "upgrade",
})
"""RFC 9110 §7.6.1 connection-specific headers: never forwarded in either direction."""

_REQUEST_DROP = HOP_BY_HOP | {
    "host", "content-length", "expect", "content-type",
    # Responses are read (usage) and sometimes rewritten (P/D cached_tokens, model name), so ask for identity.
    "accept-encoding",
    # EPP's own request headers, consumed here as in ext_proc mode (never echoed upstream there either).
    FAIRNESS_ID_HEADER, OBJECTIVE_HEADER, MODEL_REWRITE_HEADER, "x-gateway-destination-endpoint",
    "x-gateway-destination-endpoint-served", "x-gateway-destination-endpoint-subset",
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
    detail = str(exc) or type(exc).__name__
    return UpstreamUnavailable(f"{where} unreachable: {detail}", reason="upstream_unavailable")


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
    """Headers for the client response: the upstream's minus hop-by-hop, length and the server's own
    ``Date``/``Server`` (aiohttp writes its own), plus ``extra`` (scheduling's response headers)."""
    out: CIMultiDict[str] = CIMultiDict()
    for k, v in upstream.items():
        if k.lower() not in _RESPONSE_DROP:
            out.add(k, v)
    if extra:
        out.update(extra)
    return out


def upstream_url(endpoint: Endpoint, raw_path: str) -> URL:
    """``scheme://address:port`` of ``endpoint`` plus the client's raw (already encoded) path and query."""
    return URL(f"{endpoint.spec.scheme}://{endpoint.hostport}{raw_path}", encoded=True)
