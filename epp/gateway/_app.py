"""The gateway application: routes, shared upstream session, health and readiness, and the aiohttp front end.

Routes: ``POST /v1/completions``, ``/v1/chat/completions``, ``/v1/responses``, ``/v1/embeddings`` and the
Anthropic Messages API's ``/v1/messages`` (proxied through the Director); ``GET /v1/models`` (the pool's models
and adapters); ``GET /health`` (the process is up) and ``GET /ready`` (discovery has synced and the pool has at
least one endpoint). Anything else is a 404 in OpenAI error format (Anthropic's for the ``/v1/messages`` path, as
every error EPP answers there). The application (an aiohttp ``Application``) holds the proxy, the model catalogue
and the start-up and clean-up hooks; it is served by EPP's own HTTP server (``_frontend``) or by aiohttp's, both
dispatch from one route table (:data:`ROUTES`, :func:`route`), so the two front ends cannot drift apart; on aiohttp's, malformed requests
are answered in the same OpenAI error format (``_aiohttp_server``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from functools import partial
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, AsyncIterator, Mapping

import aiohttp
import orjson
from aiohttp import web
from aiohttp.abc import AbstractStreamWriter

from epp.errors import EppError, InternalError, NotFound, PayloadTooLarge, error_body
from epp.framework.request import DEFAULT_BODY_LIMIT, is_messages_path
from epp.gateway._aiohttp_server import closing_error_response, refusal
from epp.gateway._client import LeanUpstream
from epp.gateway._downstream import Downstream, HeaderItems
from epp.gateway._models import ModelCatalog
from epp.gateway._proxy import Proxy, ProxySettings
from epp.gateway._upstream import TRANSPORTS, AiohttpUpstream, Upstream, UpstreamLimits, make_session
from epp.scheduling.director import Director

if TYPE_CHECKING:
    from epp.datalayer.datastore import Datastore

__all__ = ["make_gateway_app", "DEFAULT_BODY_LIMIT", "INFERENCE_PATHS", "DIRECTOR_KEY", "PROXY_KEY",
           "SESSION_KEY", "CATALOG_KEY", "AIOHTTP_HANDLER_ARGS", "AiohttpDownstream", "GET_PATHS", "get_answer",
           "no_route", "set_draining", "Handler", "ROUTES", "route"]

INFERENCE_PATHS = ("/v1/completions", "/v1/chat/completions", "/v1/responses", "/v1/embeddings", "/v1/messages")

DIRECTOR_KEY = web.AppKey("epp.scheduling.director", Director)
PROXY_KEY = web.AppKey("epp.proxy", Proxy)
SESSION_KEY = web.AppKey("epp.session", aiohttp.ClientSession)
CATALOG_KEY = web.AppKey("epp.models", ModelCatalog)
LEADERSHIP_KEY = web.AppKey("epp.leadership", object)
DRAINING_KEY = web.AppKey("epp.draining", asyncio.Event)

_JSON = "application/json"
_JSON_HEADERS: HeaderItems = MappingProxyType({"Content-Type": _JSON})

AIOHTTP_HANDLER_ARGS: Mapping[str, Any] = MappingProxyType({"max_field_size": 65536, "auto_decompress": False})
"""aiohttp ``RequestHandler`` arguments for the gateway: header values up to 64 KiB (aiohttp's default is 8 KiB;
long bearer tokens and trace baggage exceed it), and request bodies as received (the proxy decodes a
``Content-Encoding`` itself, as on EPP's own server: :mod:`epp.gateway._encoding`)."""


def make_gateway_app(director: Director, *, session: aiohttp.ClientSession | None = None,
                     limits: UpstreamLimits = UpstreamLimits(), body_limit: int = DEFAULT_BODY_LIMIT,
                     upstream_timeout: float | None = 300.0, connect_timeout: float = 5.0, retries: int = 1,
                     pd_orchestration: bool = True, models_ttl: float = 5.0,
                     transport: str = "lean", leadership: Any = None) -> web.Application:
    """Build the OpenAI-compatible gateway over ``director``.

    * ``session``: a shared upstream ``ClientSession`` owned by the caller; when None the app creates one on
      start-up (pool sized by ``limits``) and closes it on clean-up.
    * ``body_limit``: larger request bodies get 413.
    * ``upstream_timeout``: seconds to wait for a model server's answer to start, and between two chunks of a
      stream (None: no limit); before the client got a byte it becomes 504.
    * ``connect_timeout``: seconds to connect to a model server (a failure is retried like a refused connection).
    * ``retries``: how many other endpoints a request may be retried on after a connection failure or 5xx
      before any byte reached the client (the issue's rule is once).
    * ``pd_orchestration``: run the prefill step here when the profile picked a prefill endpoint; False
      forwards ``x-prefiller-host-port`` to the decode endpoint instead (for llm-d's routing sidecar).
    * ``models_ttl``: seconds ``GET /v1/models`` answers are cached.
    * ``leadership``: in HA mode, the replica's :class:`~epp.datalayer.leader.LeaderElector`; ``/ready`` then
      also needs this replica to lead, as the gRPC readiness does.
    * ``transport``: the upstream HTTP client for proxied requests: ``"lean"`` (``epp.gateway._client`` and
      ``_http1``, a pooled HTTP/1.1 client built for the relay; ``https`` endpoints go through the aiohttp session)
      or ``"aiohttp"`` (the ``ClientSession``; also ``https``). Both honour ``limits`` and the timeouts.
      ``GET /v1/models`` always uses the aiohttp session.

    Serve it with :class:`epp.gateway.GatewayServer` (or any ``AppRunner`` with ``handler_cancellation=True``,
    so a client that disconnects while EPP waits for the model server cancels the upstream request).
    """
    if transport not in TRANSPORTS:
        raise ValueError(f"unknown upstream transport {transport!r}; expected one of {', '.join(TRANSPORTS)}")
    app = web.Application(client_max_size=body_limit, handler_args=dict(AIOHTTP_HANDLER_ARGS))
    app[DIRECTOR_KEY] = director
    app[LEADERSHIP_KEY] = leadership
    app[DRAINING_KEY] = asyncio.Event()
    settings = ProxySettings(body_limit=body_limit, retries=retries, pd_orchestration=pd_orchestration)

    async def upstream_ctx(app: web.Application) -> AsyncIterator[None]:
        owned = session is None
        shared = make_session(limits, connect_timeout=connect_timeout, upstream_timeout=upstream_timeout) \
            if session is None else session
        app[SESSION_KEY] = shared
        upstream: Upstream = AiohttpUpstream(shared) if transport == "aiohttp" else LeanUpstream(
            limits, connect_timeout=connect_timeout, upstream_timeout=upstream_timeout,
            tls=AiohttpUpstream(shared))
        app[PROXY_KEY] = Proxy(director, settings, upstream)
        app[CATALOG_KEY] = ModelCatalog(director.datastore, lambda: shared, ttl=models_ttl)
        try:
            yield
        finally:
            await upstream.close()
            if owned:
                await shared.close()

    app.cleanup_ctx.append(upstream_ctx)
    app.router.add_route("*", "/{tail:.*}", _aiohttp_serve)  # every request goes through route(), as on EPP's own
    return app


GET_PATHS = ("/v1/models", "/health", "/ready")
"""The routes answered by :func:`get_answer` (``GET``, and ``HEAD`` with the same head)."""

Handler = Callable[[web.Application, Downstream], Awaitable[None]]
"""A route's handler, the same on both front ends: it answers the request on its
:class:`~epp.gateway._downstream.Downstream`."""


async def _proxied(app: web.Application, down: Downstream) -> None:
    await app[PROXY_KEY].handle(down)


async def _get_route(app: web.Application, down: Downstream) -> None:
    status, body = await get_answer(app, down.path)
    await down.respond(status, _JSON_HEADERS, body)


async def _no_route(method: str, app: web.Application, down: Downstream) -> None:
    err = no_route(method, down.path)
    observer = app[DIRECTOR_KEY].observer
    if observer is not None:  # the access log's line (and a span) for the 404
        observer.start("gateway", down.headers, down.path).refused(err)
    await down.respond(err.status, _JSON_HEADERS, error_body(err, anthropic=is_messages_path(down.path)))


ROUTES: Mapping[tuple[str, str], Handler] = MappingProxyType({
    **{("POST", path): _proxied for path in INFERENCE_PATHS},
    **{(method, path): _get_route for path in GET_PATHS for method in ("GET", "HEAD")},
})
"""The gateway's route table, ``(method, path) -> handler``: the one both front ends dispatch from
(:func:`route`). A ``HEAD`` answer is the ``GET`` one without its body (each front end drops the body)."""


def route(method: str, path: str) -> Handler:
    """The handler of ``method path`` (``path`` percent-decoded, without the query) in :data:`ROUTES`, else one that
    answers 404 (:func:`no_route`)."""
    handler = ROUTES.get((method, path))
    return handler if handler is not None else partial(_no_route, method)


async def get_answer(app: web.Application, path: str) -> tuple[int, bytes]:
    """Status and JSON body of ``GET path`` for a path in :data:`GET_PATHS`, on either front end:

    * ``/health``: 200 while the process is up;
    * ``/ready``: 200 once discovery has synced and the pool has an endpoint (and, in HA mode, this replica
      leads) until :func:`set_draining`, else 503 with the reason;
    * ``/v1/models``: the pool's models and adapters, as OpenAI's list object.
    """
    if path == "/health":
        return 200, b'{"status":"ok"}'
    if path == "/ready":
        return _ready_answer(app[DIRECTOR_KEY].datastore, app[LEADERSHIP_KEY], app[DRAINING_KEY].is_set())
    return 200, orjson.dumps({"object": "list", "data": await app[CATALOG_KEY].models()})


def set_draining(app: web.Application) -> None:
    """EPP is shutting down: ``/ready`` answers 503 from now on, while requests are still served."""
    app[DRAINING_KEY].set()


def _ready_answer(datastore: Datastore, leadership: Any, draining: bool) -> tuple[int, bytes]:
    count = len(datastore.endpoints())
    if draining:
        status, reason = 503, "shutting down (draining)"
    elif not datastore.synced.is_set():
        status, reason = 503, "endpoint discovery has not synced (yet, or its InferencePool was deleted)"
    elif leadership is not None and not leadership.is_leader:
        status, reason = 503, "another replica holds the pool's leader Lease (HA mode)"
    elif count == 0:
        status, reason = 503, "the pool has no endpoints"
    else:
        status, reason = 200, None
    body: dict[str, object] = {"status": "ready" if status == 200 else "not ready", "endpoints": count}
    if reason is not None:
        body["reason"] = reason
    return status, orjson.dumps(body)


def no_route(method: str, path: str) -> EppError:
    """The error for a request no route serves (404; its envelope by the path, :func:`epp.framework.request.is_messages_path`)."""
    return NotFound(f"no route for {method} {path}")


# -- aiohttp front end ---------------------------------------------------------------------------------------


async def _aiohttp_serve(request: web.Request) -> web.StreamResponse:
    """aiohttp's one handler: first what EPP's own server refuses in a head but aiohttp's parser accepts
    (``refusal``), then the route's handler (:func:`route`) on an :class:`AiohttpDownstream`."""
    if (err := refusal(request)) is not None:
        return closing_error_response(err, anthropic=is_messages_path(request.path))
    down = AiohttpDownstream(request)
    await route(request.method, request.path)(request.app, down)
    if down.response is None:  # every handler answers; never leave aiohttp without a response
        return _error_response(InternalError("the request ended without a response"), request.path)
    return down.response


def _error_response(err: EppError, path: str) -> web.Response:
    return web.Response(status=err.status, body=error_body(err, anthropic=is_messages_path(path)), content_type=_JSON)


class _RelayResponse(web.StreamResponse):
    """The client side of a relayed stream: its headers leave together with the first body bytes.

    :meth:`AiohttpDownstream.open_stream` prepares it only with the upstream's first chunk in hand and writes
    that chunk at once, so buffering the headers delays nothing; it saves a send and, more importantly for time
    to first token, a separate wake-up of the client for a header-only packet. aiohttp's ``StreamResponse``
    sends headers at ``prepare()`` (only ``Response`` coalesces; aiohttp#10991); this class flag selects the
    coalescing path, and if a future aiohttp drops it the response simply falls back to sending headers at
    ``prepare()``.
    """

    _send_headers_immediately = False


class AiohttpDownstream:
    """A request on aiohttp's server as a :class:`~epp.gateway._downstream.Downstream`; the handler returns
    :attr:`response` (already prepared) to aiohttp."""

    __slots__ = ("_writer", "chunked", "headers", "path", "raw_path", "request", "response", "transport")

    opens_now = False  # preparing an aiohttp response is awaited

    def __init__(self, request: web.Request) -> None:
        self.request = request
        self.path = request.path
        self.raw_path = request.raw_path
        self.headers = {k.lower(): v for k, v in request.headers.items()}
        self.response: web.StreamResponse | None = None
        self.transport: asyncio.Transport | None = None
        self.chunked = False
        self._writer: AbstractStreamWriter | None = None

    async def read_body(self, limit: int) -> bytes:
        request = self.request
        if request.content_length is not None and request.content_length > limit:
            raise PayloadTooLarge(f"request body of {request.content_length} bytes exceeds the limit of {limit}")
        try:
            return await request.read()
        except web.HTTPRequestEntityTooLarge as exc:
            raise PayloadTooLarge(f"request body exceeds the limit of {limit} bytes") from exc

    async def respond(self, status: int, headers: HeaderItems, body: bytes) -> None:
        out = self.response = web.Response(status=status, body=body, headers=headers)
        await out.prepare(self.request)  # a Response sends its head and body in one write
        await out.write_eof()

    async def open_stream(self, status: int, headers: HeaderItems, first: bytes, *, end: bool) -> None:
        out = self.response = _RelayResponse(status=status, headers=headers)
        writer = await out.prepare(self.request)  # buffered: the headers go out together with the first chunk
        if end:
            await out.write_eof(first)
            return
        await out.write(first)
        transport = self.request.transport
        if transport is None or writer is None:
            raise ConnectionResetError("the client went away")
        self.transport, self._writer = transport, writer
        self.chunked = bool(getattr(writer, "chunked", False))

    def open_stream_now(self, status: int, headers: HeaderItems, first: bytes) -> None:
        raise NotImplementedError("aiohttp's server opens a stream with open_stream (opens_now is False)")

    async def drain(self) -> None:
        if self._writer is not None:
            await self._writer.drain()

    async def end_stream(self, tail: bytes) -> None:
        assert self.response is not None
        await self.response.write_eof(tail)

    def abort(self) -> None:
        transport = self.request.transport
        if transport is not None:
            transport.abort()
