"""One inference request through the gateway: read, parse, route, (prefill,) forward, relay, complete.

The request's life is the Director's (one code path with ext_proc); this module is the HTTP front end. The body is
forwarded byte for byte unless the model is rewritten or P/D needs ``kv_transfer_params``. A connection failure or
a 5xx answer *before any byte reached the client* is retried once on the next endpoint, never after streaming
started. JSON answers are read whole; SSE answers pass through as they arrive, one client write per upstream read,
with backpressure. Untrusted headers are stripped before anything reads or forwards them. The client side is a
:class:`~epp.gateway._downstream.Downstream`, so EPP's own HTTP/1.1 server and aiohttp's carry the same life.
``response_complete`` runs exactly once on every exit path, a client that went away included (status 499).
With tracing or the access log on, each request has an :class:`~epp.observability.Observation`: each upstream
attempt is a span whose ``traceparent`` the model server gets.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Mapping

from multidict import CIMultiDict

from epp.errors import EppError, InternalError, UpstreamError, UpstreamTimeout, error_body, error_headers
from epp.framework.endpoint import Endpoint
from epp.framework.plugins import CLIENT_GONE, Outcome, ResponseInfo, outcome_of_status
from epp.framework.request import (
    REQUEST_ID_HEADER,
    ApiKind,
    InferenceRequest,
    header_text,
    is_messages_path,
    new_request_id,
)
from epp.gateway._downstream import Downstream
from epp.gateway._encoding import decode_content
from epp.gateway._pd import decode_body, parse_prefill_response, prefill_body, prefill_status_is_final, with_model
from epp.gateway._upstream import Upstream, UpstreamResponse, UpstreamUnavailable, client_headers, upstream_headers
from epp.usage import NO_USAGE, Usage, messages_usage_from_body, usage_from_body
from epp.usage import MessagesUsageReader as MessagesSseUsageTracker
from epp.usage import ResponseRestorer as SseLineRewriter
from epp.usage import UsageReader as SseUsageTracker
from epp.usage import restore_body as rewrite_json_body

if TYPE_CHECKING:
    from epp.observability import Observation
    from epp.scheduling.director import RequestContext, RequestPath

__all__ = ["ProxySettings", "Proxy", "send_error", "CLIENT_GONE"]

log = logging.getLogger("epp.gateway")

_JSON = "application/json"
_MESSAGES = ApiKind.MESSAGES


@dataclass(frozen=True, slots=True)
class ProxySettings:
    """Per-request behaviour of the gateway (see :func:`epp.gateway.make_gateway_app` for the meaning)."""

    body_limit: int = 10 * 1024 * 1024
    retries: int = 1
    pd_orchestration: bool = True


async def send_error(down: Downstream, err: EppError, request_id: str | None = None, *,
                     anthropic: bool = False) -> None:
    """Answer with ``err`` as a JSON error (the shared status table) and its headers
    (:func:`~epp.errors.error_headers`): Anthropic's envelope when ``anthropic`` (a Messages API request), else
    OpenAI's; a client that went away is not an error here."""
    headers = {"Content-Type": _JSON, **dict(error_headers(err))}
    if request_id:
        headers[REQUEST_ID_HEADER] = request_id
    try:
        await down.respond(err.status, headers, error_body(err, anthropic=anthropic))
    except ConnectionResetError:
        pass


_ANSWERED = object()
"""``_Exchange._prefill``'s outcome when the prefiller's final answer has already gone to the client."""


class _Retry(Exception):
    """Internal: this attempt failed before anything reached the client.

    ``error`` is what the client gets if no other endpoint is available; ``moved``: the attempt already moved the
    request to the endpoint to retry on (a 5xx answer is only dropped once a replacement is known).
    """

    def __init__(self, error: EppError, moved: bool = False) -> None:
        self.error = error
        self.moved = moved


class Proxy:
    """Handles ``POST /v1/{completions,chat/completions,responses,embeddings,messages}`` through a Director."""

    def __init__(self, director: RequestPath, settings: ProxySettings, upstream: Upstream) -> None:
        self.director = director
        self.settings = settings
        self.upstream = upstream

    async def handle(self, down: Downstream) -> None:
        """Serve one request: every outcome is sent to ``down`` as an HTTP response, never raised (except
        cancellation, when the client went away)."""
        parsed: InferenceRequest | None = None
        trust = self.director.header_trust
        trust.strip(down.headers)  # untrusted headers are neither read nor forwarded (upstream_headers drops the rest)
        observer = self.director.observer
        obs = observer.start("gateway", down.headers, down.path) if observer is not None else None
        ctx: RequestContext | None = None
        try:
            body = await self._read_body(down, obs)
            if obs is None:
                parsed = self.director.parse(down.path, body, down.headers)
                ctx = await self.director.route(parsed, trust.subset(down.headers))
            else:
                parsed = self.director.parse(down.path, body, down.headers, obs)
                ctx = await self.director.route(parsed, trust.subset(down.headers), obs)
        except EppError as exc:
            await send_error(down, exc, parsed.request_id if parsed is not None else answer_request_id(down.headers),
                             anthropic=is_messages_path(down.path))
            return
        except Exception:
            log.exception("request failed before it was routed")
            err = InternalError("internal error")
            if obs is not None:
                obs.refused(err, parsed)
            await send_error(down, err, parsed.request_id if parsed is not None else answer_request_id(down.headers),
                             anthropic=is_messages_path(down.path))
            return
        finally:
            if obs is not None and ctx is None:  # refused (already ended) or cancelled before it was routed
                obs.close()
        exchange = _Exchange(self, down, ctx, body)
        try:
            await exchange.run()
        finally:
            self.director.response_complete(ctx, exchange.info)


    async def _read_body(self, down: Downstream, obs: Observation | None = None) -> bytes:
        """The request body, decoded when it has a ``Content-Encoding`` (:func:`decode_content`); a body over the limit
        or undecodable is counted as a rejection (parse and route count their own)."""
        limit = self.settings.body_limit
        try:
            body = await down.read_body(limit)
            coding = down.headers.get("content-encoding")
            return decode_content(body, coding, limit) if coding else body
        except EppError as exc:
            self.director.record_rejection(exc, None, obs)
            raise


class _Exchange:
    """The upstream half of one routed request; ``info`` is what ``response_complete`` reports."""

    __slots__ = ("proxy", "director", "down", "ctx", "body", "info", "tried", "model_back", "cached_tokens",
                 "orchestrate_pd", "messages")

    def __init__(self, proxy: Proxy, down: Downstream, ctx: RequestContext, body: bytes) -> None:
        self.proxy = proxy
        self.director = proxy.director
        self.down = down
        self.ctx = ctx
        self.body = body
        self.info = ResponseInfo(status=CLIENT_GONE, error=True)
        self.tried: list[Endpoint] = []
        req = ctx.request
        # The client sees the model name it asked for, as the reference's ext_proc response path does.
        self.model_back = req.model if req.target_model != req.model and req.model_rewritable else None
        self.cached_tokens: int | None = None
        self.orchestrate_pd = proxy.settings.pd_orchestration
        self.messages = req.api is _MESSAGES  # Anthropic's shapes for usage, model and errors

    async def run(self) -> None:
        req = self.ctx.request
        rewrite = req.target_model if self.model_back is not None else None
        body = self.body
        if rewrite is not None:
            body = with_model(req.body, rewrite)
        if self.ctx.prefill is not None and self.orchestrate_pd and req.api is not ApiKind.EMBEDDINGS:
            outcome = await self._prefill(self.ctx.prefill, rewrite)
            if outcome is _ANSWERED:
                return
            if isinstance(outcome, bytes):
                body = outcome
        try:
            await self._forward(body)
        except EppError as exc:
            self.info = ResponseInfo(status=exc.status, error=True)
            await send_error(self.down, exc, req.request_id, anthropic=self.messages)

    # -- prefill --------------------------------------------------------------------------------------------

    async def _prefill(self, endpoint: Endpoint, model: str | None) -> object:
        """Run the prefill step. Returns ``_ANSWERED`` when a final (400–451) prefill answer went to the client,
        the decode body on success, or None to go decode-only with the original body."""
        req = self.ctx.request
        hdrs = self._upstream_headers()
        obs = self.ctx.obs
        if obs is not None:
            obs.upstream_start(endpoint, hdrs, "prefill")
        try:
            resp = await self.proxy.upstream.post(endpoint, self.down.raw_path,
                                                  prefill_body(req.body, req.api, model), hdrs)
            try:
                data = await resp.read()
            finally:
                resp.close()
            status, resp_headers = resp.status, resp.headers
        except EppError as exc:
            log.warning("prefill on %s failed (%s); decoding without remote prefill", endpoint.hostport, exc)
            self.director.upstream_outcome(self.ctx, endpoint, _failure(exc))
            if obs is not None:
                obs.upstream_end(exc.status)
            return None
        self.director.upstream_outcome(self.ctx, endpoint, outcome_of_status(status))
        if obs is not None:
            obs.upstream_end(status)
        if prefill_status_is_final(status):
            self.info = ResponseInfo(status=status, error=True)
            await self._send_json(status, self._client_headers(status, resp_headers, endpoint), data)
            return _ANSWERED
        outcome = parse_prefill_response(data) if 200 <= status < 300 else None
        if outcome is None:
            log.warning("prefill on %s answered %d; decoding without remote prefill", endpoint.hostport, status)
            return None
        if not self.messages:
            self.cached_tokens = outcome.cached_tokens
        return decode_body(req.body, outcome.kv_transfer_params, model)

    # -- forward with retry -----------------------------------------------------------------------------------

    async def _forward(self, body: bytes) -> None:
        attempts = self.proxy.settings.retries + 1
        while True:
            endpoint = self.ctx.target
            self.tried.append(endpoint)
            last = len(self.tried) >= attempts
            try:
                return await self._attempt(endpoint, body, last)
            except _Retry as retry:
                if not retry.moved and (last or self.director.retry(self.ctx, self.tried,
                                                                    _failure(retry.error)) is None):
                    raise retry.error from None
                log.info("retrying request %s on %s: %s", self.ctx.request.request_id, self.ctx.target.hostport,
                         retry.error.message)

    async def _attempt(self, endpoint: Endpoint, body: bytes, last: bool) -> None:
        """One upstream attempt; raises ``_Retry`` for a retryable failure before anything reached the client."""
        headers = self._upstream_headers()
        if self.ctx.obs is not None:
            self.ctx.obs.upstream_start(endpoint, headers)
        try:
            resp = await self.proxy.upstream.post(endpoint, self.down.raw_path, body, headers)
        except EppError as exc:
            raise _retry_or_raise(exc) from exc
        try:
            if resp.sse:
                self._retry_on_5xx(endpoint, resp.status, last)  # before its body: nothing reached the client
                return await self._stream(endpoint, resp)
            try:
                data = await resp.read()  # read whole first, so the connection goes back to the pool
            except EppError as exc:
                raise _retry_or_raise(exc) from exc
            self._retry_on_5xx(endpoint, resp.status, last)
            await self._relay_json(resp, data)
        finally:
            resp.close()  # no-op when fully read (the connection is back in the pool); aborts it otherwise

    def _retry_on_5xx(self, endpoint: Endpoint, status: int, last: bool) -> None:
        """Raise ``_Retry`` for a 5xx answer when another attempt is allowed and an endpoint is left for it (the
        request is moved there)."""
        if status >= 500 and not last and self.director.retry(self.ctx, self.tried,
                                                              Outcome.ERROR_STATUS) is not None:
            raise _Retry(UpstreamError(f"model server {endpoint.hostport} answered {status}"), moved=True)

    # -- relay ------------------------------------------------------------------------------------------------

    async def _relay_json(self, resp: UpstreamResponse, data: bytes) -> None:
        """Send a complete (non-SSE) answer; usage and bookkeeping happen after the bytes left, off the
        client's critical path."""
        status = resp.status
        plain = status < 300 and resp.headers.get("Content-Encoding", "identity") == "identity"
        if plain and (self.model_back is not None or self.cached_tokens is not None):
            data = rewrite_json_body(data, model=self.model_back, cached=self.cached_tokens)
        if not await self._send_json(status, self._client_headers(status, resp.headers, self.ctx.target),
                                     data):
            status = CLIENT_GONE
        self._started()
        usage = NO_USAGE if not plain else messages_usage_from_body(data) if self.messages else usage_from_body(data)
        self._record(status, usage, streamed=False,
                     response_bytes=len(data) if status != CLIENT_GONE else None)

    async def _send_json(self, status: int, headers: CIMultiDict[str], data: bytes) -> bool:
        """Send a complete answer; False when the client had gone away."""
        headers[REQUEST_ID_HEADER] = self.ctx.request.request_id
        try:
            await self.down.respond(status, headers, data)
        except ConnectionResetError:
            return False
        return True

    async def _stream(self, endpoint: Endpoint, resp: UpstreamResponse) -> None:
        """Relay an SSE answer through a :class:`_ClientSink`: the client's head goes out with the first bytes,
        the rest from the upstream client's read callbacks straight into the client's transport, and the last
        bytes together with the end-of-stream marker."""
        if resp.status >= 500:
            log.warning("model server %s streamed an error answer (%d)", endpoint.hostport, resp.status)
        headers = self._client_headers(resp.status, resp.headers, endpoint)
        headers[REQUEST_ID_HEADER] = self.ctx.request.request_id
        rewriter = None  # the tracker reads what the client gets (rewritten: the prefiller's cached_tokens)
        if self.model_back is not None or self.cached_tokens is not None:
            rewriter = SseLineRewriter(model=self.model_back, cached=self.cached_tokens,
                                       inner_key="message" if self.messages else "response")
        tracker = MessagesSseUsageTracker() if self.messages else SseUsageTracker()
        sink = _ClientSink(self.down, resp.status, headers, tracker, rewriter, self._started, self.director,
                           self.ctx)
        try:
            tail = await self._pump(endpoint, resp, sink)
            if tail is None:
                return
            tail = sink.last(tail)
            if sink.transport is None:  # the whole answer came in one read: one write with the end marker
                await self.down.open_stream(resp.status, headers, tail, end=True)
                self._started()
            else:
                await self.down.end_stream(tail)
        except ConnectionResetError:  # the client went away; closing ``resp`` aborts the upstream request
            self._record(CLIENT_GONE, sink.tracker.usage(), streamed=True)
            return
        self._record(resp.status, sink.tracker.usage(), streamed=True, response_bytes=sink.sent)

    async def _pump(self, endpoint: Endpoint, resp: UpstreamResponse, sink: _ClientSink) -> bytes | None:
        """Relay the body into ``sink``; returns the bytes that came with its end, or None when the upstream
        broke after the client's stream had started (recorded, and the client's connection dropped). A failure
        before that raises ``_Retry`` or the final error: nothing reached the client yet."""
        try:
            if not self.down.opens_now:  # the front end opens a stream with an await: take the first bytes here
                first = await resp.first()
                if resp.at_eof():
                    return first
                await sink.open(first)
            return await resp.pump(sink, self.down.drain)
        except EppError as exc:
            if sink.transport is None:
                raise _retry_or_raise(exc) from exc
            log.warning("stream from %s broke after it started: %s", endpoint.hostport, exc.message)
            self._record(exc.status, sink.tracker.usage(), streamed=True)
            self.down.abort()
            return None

    def _started(self) -> None:
        self.director.response_started(self.ctx)

    # -- helpers ------------------------------------------------------------------------------------------

    def _client_headers(self, status: int, upstream: Mapping[str, str], served: Endpoint) -> CIMultiDict[str]:
        """The client's answer headers: the upstream's, plus what plugins add (PreRequest hooks when scheduling,
        ResponseHeaderProcessor hooks now, told that ``served`` answered)."""
        return client_headers(upstream, self.director.response_header(self.ctx, status, served.hostport))

    def _upstream_headers(self) -> dict[str, str]:
        return upstream_headers(self.down.headers, self.ctx.upstream_headers, self.ctx.request.request_id,
                                drop_prefiller=self.orchestrate_pd)

    def _record(self, status: int, usage: Usage, *, streamed: bool, response_bytes: int | None = None) -> None:
        prompt, completion, cached = usage
        self.info = ResponseInfo(status=status, prompt_tokens=prompt, completion_tokens=completion,
                                 cached_tokens=cached, error=status >= 400, streamed=streamed,
                                 response_bytes=response_bytes)


def answer_request_id(headers: Mapping[str, str]) -> str:
    """The client's ``x-request-id`` (from its ``headers``) for an answer EPP makes before the body was parsed,
    else a new one (every answer carries one)."""
    try:
        return header_text(headers, REQUEST_ID_HEADER) or new_request_id()
    except EppError:  # not valid UTF-8: never echoed
        return new_request_id()


def _failure(err: EppError) -> Outcome:
    """How an upstream attempt that raised ``err`` failed, for passive health."""
    return Outcome.TIMEOUT if isinstance(err, UpstreamTimeout) else Outcome.CONNECT_FAILURE


def _retry_or_raise(err: EppError) -> _Retry | EppError:
    """A connection failure becomes ``_Retry``; a timeout is final (504)."""
    return _Retry(err) if isinstance(err, UpstreamUnavailable) else err


class _ClientSink:
    """Writes a relayed stream's reads straight to the client (one write per upstream read).

    Called from the upstream client's read callback. The first bytes open the client's stream (its head and
    those bytes in one write, then ``started``), unless the front end cannot open from a callback and the proxy
    did it with :meth:`open`. Each read feeds the usage tracker, goes through the line rewriter when one is
    needed, is framed for chunked transfer (or forwarded with the upstream's own framing when the read was made
    of whole chunks and nothing is rewritten); a call returns True when the client's write buffer is above its
    high-water mark (the relay then pauses reading upstream until it drains: backpressure). Raises
    ``ConnectionResetError`` when the client's connection is closing. ``transport`` is None until the stream
    is open.
    """

    __slots__ = ("chunked", "ctx", "director", "down", "headers", "high", "rewriter", "sent", "started", "status",
                 "tracker", "transport")

    def __init__(self, down: Downstream, status: int, headers: CIMultiDict[str], tracker: SseUsageTracker,
                 rewriter: SseLineRewriter | None, started: Callable[[], None], director: RequestPath,
                 ctx: RequestContext) -> None:
        self.down = down
        self.director = director
        self.ctx = ctx
        self.sent = 0  # body bytes given to the client
        self.status = status
        self.headers = headers
        self.tracker = tracker
        self.rewriter = rewriter
        self.started = started
        self.transport: asyncio.Transport | None = None
        self.chunked = False
        self.high = 64 * 1024

    async def open(self, first: bytes) -> None:
        """Open the client's stream with ``first`` (front ends that cannot do it from a callback)."""
        first = self._feed(first)
        await self.down.open_stream(self.status, self.headers, first, end=False)
        self.sent += len(first)
        self._opened()

    def last(self, tail: bytes) -> bytes:
        """What the client gets of the bytes that came with the end of the body (tracked and counted)."""
        tail = self._feed(tail, end=True)
        self.sent += len(tail)
        return tail

    def chunk(self, read: bytes, start: int) -> bool:
        """One whole chunk as received (the per-token path): forwarded as is when nothing is rewritten."""
        transport = self.transport
        if self.rewriter is not None or not self.chunked or transport is None:  # also a read before the stream opened
            return self(read[start:-2], read)
        self.tracker.feed_chunk(read, start)
        if transport.is_closing():
            raise ConnectionResetError("the client went away")
        transport.write(read)
        self.sent += len(read) - start - 2
        self.director.stream_chunk(self.ctx)
        return transport.get_write_buffer_size() > self.high

    def __call__(self, payload: bytes, framed: bytes | None) -> bool:
        if self.rewriter is not None:
            framed = None
        payload = self._feed(payload)
        if not payload:  # the rewriter holds a partial line
            return False
        transport = self.transport
        if transport is None:
            self.down.open_stream_now(self.status, self.headers, payload)
            self.sent += len(payload)
            return self._opened()
        if transport.is_closing():
            raise ConnectionResetError("the client went away")
        self.sent += len(payload)
        self.director.stream_chunk(self.ctx)
        if not self.chunked:
            transport.write(payload)
        elif framed is not None:
            transport.write(framed)
        else:
            transport.write(b"%x\r\n%b\r\n" % (len(payload), payload))
        return transport.get_write_buffer_size() > self.high

    def _feed(self, payload: bytes, *, end: bool = False) -> bytes:
        """What the client gets of ``payload`` (rewritten when needed; with ``end``, what the rewriter held),
        fed to the usage tracker."""
        if self.rewriter is not None:
            payload = self.rewriter.feed(payload) + (self.rewriter.flush() if end else b"")
        self.tracker.feed(payload)
        return payload

    def _opened(self) -> bool:
        """The stream is open: take the client's transport, tell the Director; True when its buffer is full."""
        transport = self.down.transport
        if transport is None:
            raise ConnectionResetError("the client went away")
        self.transport, self.chunked = transport, self.down.chunked
        try:
            self.high = transport.get_write_buffer_limits()[1]
        except (AttributeError, NotImplementedError):
            pass
        self.started()
        return transport.get_write_buffer_size() > self.high
