"""One ext_proc stream (one HTTP request through Envoy): the protocol state machine (:class:`Stream`) and the
:class:`Exchange` both transports drive it through (message order while routing, backlog, half-close, errors).

Request side: in FULL_DUPLEX_STREAMED mode (the reference's) the request-headers reply is held until the body is
complete, then EPP routes and sends the headers reply (destination header, ``envoy.lb`` metadata) followed by the
body in chunks; in BUFFERED mode the headers get CONTINUE and the single body message gets the routing reply. A
request without a body goes to a random pool endpoint. Untrusted headers are dropped before anything reads them.
Response side: headers give the status and the served endpoint; body chunks feed the usage reader (and are
rewritten back when the model was rewritten); the first chunk is the Director's ``response_started``. The end of
the body completes the request; any other end (reset, cancel, error) completes it as an error in
:meth:`Stream.close` — exactly once, since the Director's ``response_complete`` is idempotent. With tracing or
the access log on, the stream has an :class:`~epp.observability.Observation` from its request headers on; the
routing reply sets the upstream span's ``traceparent`` for Envoy to forward to the model server.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Coroutine
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol, cast

import orjson
from google.protobuf.message import DecodeError

from epp.errors import EppError, InternalError, PayloadTooLarge
from epp.extproc.protocol import (
    CONTINUE_REQUEST_HEADERS,
    CONTINUE_REQUEST_TRAILERS,
    CONTINUE_RESPONSE_BODY,
    CONTINUE_RESPONSE_TRAILERS,
    PREFILLER_HEADER,
    RESPONSE_HEADERS_REPLY,
    SUBSET_KEYS,
    SUBSET_NAMESPACE,
    BodySendMode,
    filter_metadata,
    first_field,
    immediate_error,
    pb,
    read_headers,
    routing_metadata,
    routing_mutation,
    served_endpoint,
    set_headers,
    streamed_body,
)
from epp.framework.plugins import ResponseInfo
from epp.framework.request import REQUEST_ID_HEADER, ApiKind, is_messages_path, new_request_id
from epp.usage import MessagesUsageReader, UsageReader
from epp.usage import ResponseRestorer as ModelRestorer

if TYPE_CHECKING:
    from epp.observability import Observation
    from epp.scheduling.director import RequestContext, RequestPath

__all__ = ["StreamSettings", "Notices", "Stream", "Reply", "ProtocolViolation", "decode_request", "FULL_DUPLEX",
           "BUFFERED", "STREAMED", "NONE", "Exchange", "CallSide", "GRPC_OK", "GRPC_INVALID_ARGUMENT"]

log = logging.getLogger("epp.extproc")

FULL_DUPLEX = BodySendMode.FULL_DUPLEX_STREAMED
BUFFERED = BodySendMode.BUFFERED
BUFFERED_PARTIAL = BodySendMode.BUFFERED_PARTIAL
STREAMED = BodySendMode.STREAMED
NONE = BodySendMode.NONE

Reply = pb.ProcessingResponse | bytes
_MESSAGES = ApiKind.MESSAGES
_NO_REPLY: list[Reply] = []


class ProtocolViolation(Exception):
    """A message Envoy never sends at this point of a stream (a second request, a body after the body ended), or
    bytes that are no ``ProcessingRequest`` at all (:func:`decode_request`).

    Not an HTTP error: the transport ends the gRPC call with ``INVALID_ARGUMENT`` and :meth:`Stream.close`
    releases whatever the stream holds. It never reaches a client as a status.
    """


def decode_request(data: bytes) -> pb.ProcessingRequest:
    """One gRPC message of the ``Process`` call as a ``ProcessingRequest``; :class:`ProtocolViolation` if it does
    not decode. Both transports decode through here, so an undecodable message ends the call the same way on each
    (``INVALID_ARGUMENT``), before or after routing."""
    try:
        return pb.ProcessingRequest.FromString(data)
    except DecodeError:
        raise ProtocolViolation("cannot decode ProcessingRequest") from None


class Notices:
    """Warnings a server logs once, not once per stream: a misconfigured Envoy repeats them on every request."""

    __slots__ = ("_seen",)

    def __init__(self) -> None:
        self._seen: set[str] = set()

    def first(self, key: str) -> bool:
        """True the first time ``key`` is seen, False after."""
        if key in self._seen:
            return False
        self._seen.add(key)
        return True


@dataclass(frozen=True, slots=True)
class StreamSettings:
    """What every stream of one server shares.

    ``request_mode``/``response_mode`` of None mean "as Envoy announces in ``protocol_config``", falling back to
    FULL_DUPLEX_STREAMED when Envoy does not send it. ``emit_scores``: add the scheduler's per-endpoint scores to
    ``envoy.lb`` (``--emit-endpoint-scores``). ``notices`` remembers the warnings already logged.
    """

    director: RequestPath
    body_limit: int = 10 << 20
    request_mode: int | None = None
    response_mode: int | None = None
    emit_scores: bool = False
    notices: Notices = field(default_factory=Notices, compare=False)


class Stream:
    """State of one ext_proc stream; feed each ``ProcessingRequest`` to :meth:`handle`, then call :meth:`close`.

    :meth:`handle` returns the replies to send now. When it sets :attr:`route_pending`, the caller must
    ``await`` :meth:`route` and send its replies (routing may wait in flow control). After :attr:`closed` is set
    (an ``ImmediateResponse`` went out) no further message needs an answer.
    """

    __slots__ = ("settings", "director", "request_mode", "response_mode", "headers", "drop", "path", "subset",
                 "parts", "size", "route_pending", "routed", "trailers", "closed", "ctx", "status", "sse", "usage",
                 "restorer", "response_bytes", "_started", "obs")

    def __init__(self, settings: StreamSettings) -> None:
        self.settings = settings
        self.director = settings.director
        self.request_mode: int | None = None
        self.response_mode: int = FULL_DUPLEX
        self.headers: dict[str, str] = {}
        self.drop: list[str] = []  # request headers removed upstream (epp.headers.HeaderTrust.strip)
        self.path = "/"
        self.subset: list[str] | None = None
        self.parts: list[bytes] = []
        self.size = 0
        self.route_pending = False
        self.routed = False  # the routing decision was made (the request body, if any, has ended)
        self.trailers = False
        self.closed = False
        self.ctx: RequestContext | None = None
        self.status = 0
        self.sse = False
        self.usage: UsageReader | None = None
        self.restorer: ModelRestorer | None = None
        self.response_bytes = 0
        self._started = False
        self.obs: Observation | None = None

    # -- dispatch -------------------------------------------------------------------------------------------

    def handle(self, req: pb.ProcessingRequest) -> list[Reply]:
        """Process one message from Envoy; returns the replies to send (maybe none)."""
        kind = req.WhichOneof("request")
        if kind == "request_body":
            return self._request_body(req)
        if kind == "response_body":
            return self._response_body(req)
        if kind == "request_headers":
            return self._request_headers(req)
        if kind == "response_headers":
            return self._response_headers(req)
        if kind == "request_trailers":
            return self._request_trailers()
        if kind == "response_trailers":
            return self._response_trailers()
        return _NO_REPLY

    def _fail(self, err: EppError) -> list[Reply]:
        self.closed = True
        self.route_pending = False
        return [immediate_error(err, anthropic=is_messages_path(self.path))]

    def _reject(self, err: EppError) -> list[Reply]:
        """:meth:`_fail` for an error the Director did not see (it counts its own): counted, then answered."""
        self.director.record_rejection(err, None, self.obs)
        return self._fail(err)

    def internal_error(self, exc: BaseException) -> list[Reply]:
        """A failure while handling a message (a bug, never a protocol violation): the request gets a 500
        ``ImmediateResponse``, counted; no reply when the stream has already answered."""
        if self.closed:
            return _NO_REPLY
        return self._reject(InternalError(f"internal error: {type(exc).__name__}"))

    # -- request --------------------------------------------------------------------------------------------

    def _request_headers(self, req: pb.ProcessingRequest) -> list[Reply]:
        if self.headers or self.routed or self.parts:
            raise ProtocolViolation("a second request_headers message on one ext_proc stream")
        self._modes(req)
        msg = req.request_headers
        self.headers = headers = read_headers(msg.headers)
        self.drop = self.director.header_trust.strip(headers)  # before anything reads them
        self.path = headers.get(":path", "/")
        observer = self.director.observer
        if observer is not None:
            self.obs = observer.start("extproc", headers, self.path)
        self._read_subset(req)
        mode = self.request_mode
        if msg.end_of_stream or mode == NONE:
            return self._route_without_body()
        length = headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > self.settings.body_limit:
            return self._reject(_too_large(self.settings.body_limit))
        if mode == FULL_DUPLEX:
            return _NO_REPLY  # held until the body ends
        if mode in (BUFFERED, BUFFERED_PARTIAL):
            return [CONTINUE_REQUEST_HEADERS]
        return self._reject(InternalError(
            "ext_proc request_body_mode STREAMED cannot carry a routing decision; configure Envoy with "
            "FULL_DUPLEX_STREAMED or BUFFERED (see `epp envoy-config`)"))

    def _request_body(self, req: pb.ProcessingRequest) -> list[Reply]:
        if self.closed:
            return _NO_REPLY
        if self.routed or self.route_pending:
            raise ProtocolViolation("request_body after the request body ended")
        if self.request_mode is None:
            self._modes(req)
        if self.subset is None:
            self._read_subset(req)
        msg = req.request_body
        chunk = msg.body
        self.size += len(chunk)
        if self.size > self.settings.body_limit:
            self.parts = []
            return self._reject(_too_large(self.settings.body_limit))
        if chunk:
            self.parts.append(chunk)
        if msg.end_of_stream or self.request_mode == BUFFERED:
            # BUFFERED: Envoy sends the whole body in this one message (a body over its buffer never reaches
            # EPP: Envoy answers 413 itself); end_of_stream is false only when request trailers follow.
            self.route_pending = True
        elif self.request_mode == BUFFERED_PARTIAL:
            return self._reject(PayloadTooLarge("request body is larger than Envoy's buffer for ext_proc "
                                              "(raise per_connection_buffer_limit_bytes)"))
        return _NO_REPLY

    def _request_trailers(self) -> list[Reply]:
        if self.closed or self.ctx is not None:
            return [CONTINUE_REQUEST_TRAILERS]
        # Trailers end the body in FULL_DUPLEX_STREAMED: route now, answer the trailers after the body.
        self.trailers = True
        self.route_pending = True
        return _NO_REPLY

    async def route(self) -> list[Reply]:
        """Parse the collected body, route it through the Director, and build the routing replies."""
        self.route_pending = False
        self.routed = True
        body = b"".join(self.parts) if len(self.parts) != 1 else self.parts[0]
        self.parts = []
        director = self.director
        obs = self.obs
        try:
            # (obs passed only when there is one: the Director's two-argument calls stay as they were)
            request = director.parse(self.path, body, self.headers) if obs is None else director.parse(
                self.path, body, self.headers, obs)
            subset = self.subset  # Envoy's envoy.lb.subset_hint wins over a trusted subset header
            if subset is None and director.header_trust.trusts_subset:
                subset = director.header_trust.subset(self.headers)
            ctx = await (director.route(request, subset) if obs is None else director.route(request, subset, obs))
        except EppError as exc:
            return self._fail(exc)
        except Exception as exc:  # a plugin bug fails this request only, never the stream's neighbours
            log.exception("routing failed for %s %s", self.headers.get(":method", ""), self.path)
            err = InternalError(f"internal error while routing: {type(exc).__name__}")
            if obs is not None:
                obs.refused(err)
            return self._fail(err)
        self.ctx = ctx
        if self.response_mode == NONE:
            director.first_byte_unseen(ctx)  # no response body comes this way: no first byte to wait for
        out = body
        if request.target_model != request.model and request.model_rewritable:
            rewritten = dict(request.body)
            rewritten["model"] = request.target_model
            out = orjson.dumps(rewritten)
        hosts = ctx.target.hostport if not ctx.fallbacks else ",".join(
            [ctx.target.hostport, *(ep.hostport for ep in ctx.fallbacks)])
        extra = ctx.upstream_headers
        if request.request_id != self.headers.get(REQUEST_ID_HEADER):  # EPP made it up: the upstream sees it too
            extra = {**extra, REQUEST_ID_HEADER: request.request_id}
        if ctx.prefill is not None and PREFILLER_HEADER not in extra:
            extra = {**extra, PREFILLER_HEADER: ctx.prefill.hostport}
        if obs is not None:  # Envoy forwards the upstream span's traceparent to the model server
            extra = dict(extra)
            obs.upstream_start(ctx.target, extra)
        scores = ctx.result.endpoint_scores() if self.settings.emit_scores else None
        if self.request_mode == FULL_DUPLEX:
            extra = {**extra, "content-length": str(len(out))}
            head = pb.ProcessingResponse()
            routing_mutation(head.request_headers.response, hosts, extra, self.headers, self.drop)
            routing_metadata(head, hosts, ctx.target.hostport, scores)
            replies: list[Reply] = [head, *streamed_body(out, request=True, end_of_stream=not self.trailers)]
            if self.trailers:
                replies.append(CONTINUE_REQUEST_TRAILERS)
            return replies
        reply = pb.ProcessingResponse()
        common = reply.request_body.response
        if out is not body:
            extra = {**extra, "content-length": str(len(out))}
            common.body_mutation.body = out
        routing_mutation(common, hosts, extra, self.headers, self.drop)
        routing_metadata(reply, hosts, ctx.target.hostport, scores)
        return [reply]

    def _route_without_body(self) -> list[Reply]:
        """A request without a body: a random pool endpoint, as the reference (no scheduling, nothing to parse,
        and no subset hint: the reference's ``GetRandomEndpoint`` draws from the whole pool)."""
        self.routed = True
        endpoint = self.director.any_endpoint()
        if endpoint is None:
            return self._reject(InternalError("no endpoint available for a request without a body"))
        target = endpoint.hostport
        reply = pb.ProcessingResponse()
        common = reply.request_headers.response
        extra = {} if self.headers.get(REQUEST_ID_HEADER) else {REQUEST_ID_HEADER: new_request_id()}
        routing_mutation(common, target, extra, self.headers, self.drop)
        routing_metadata(reply, target, target)
        return [reply]

    def _read_subset(self, req: pb.ProcessingRequest) -> None:
        """The subset hint, as the reference reads it: under the current key, else the deprecated one (the first
        key present decides); a value that is not a list counts as absent (every endpoint is a candidate), entries
        that are not strings are skipped."""
        if not req.HasField("metadata_context"):
            return
        md = req.metadata_context.filter_metadata
        if SUBSET_NAMESPACE in md:
            fields = md[SUBSET_NAMESPACE].fields
            value = first_field(fields, SUBSET_KEYS)
            if value is not None and value.HasField("list_value"):
                values = value.list_value.values
                self.subset = [v.string_value for v in values if v.HasField("string_value")]

    def _modes(self, req: pb.ProcessingRequest) -> None:
        settings = self.settings
        announced = req.protocol_config if req.HasField("protocol_config") else None
        if settings.request_mode is not None:
            self.request_mode = settings.request_mode
        else:
            self.request_mode = announced.request_body_mode if announced is not None else FULL_DUPLEX
        if settings.response_mode is not None:
            self.response_mode = settings.response_mode
        elif announced is not None:
            self.response_mode = announced.response_body_mode

    # -- response -------------------------------------------------------------------------------------------

    def _response_headers(self, req: pb.ProcessingRequest) -> list[Reply]:
        msg = req.response_headers
        ctype = ""
        for h in msg.headers.headers:
            key = h.key
            if key == ":status":
                value = h.raw_value or h.value.encode()
                self.status = int(value) if value.isdigit() else 0
            elif key == "content-type":
                ctype = (h.raw_value or h.value.encode()).decode("latin-1")
        self.sse = "text/event-stream" in ctype
        ctx = self.ctx
        if ctx is None:  # a request routed without a body: nothing to follow, only the reference's marker
            return [RESPONSE_HEADERS_REPLY]
        served = served_endpoint(req)
        if self.obs is not None:
            self.obs.event("response_headers")
        director = self.director
        if not director.served_by(ctx, served):
            log.warning("request %s: Envoy reports served endpoint %s, which is not in the pool",
                        ctx.request.request_id, served)
        request = ctx.request
        self.usage = director.usage_reader(request, self.sse) or (  # a parser with its own answers, else the API's
            UsageReader(self.sse) if request.api is not _MESSAGES else MessagesUsageReader(self.sse))
        reply: Reply = RESPONSE_HEADERS_REPLY
        rewrite = request.target_model != request.model and request.model_rewritable and self.response_mode != NONE
        # e.g. session-affinity's x-session-token, and what ResponseHeaderProcessor hooks add
        added = director.response_header(ctx, self.status, served, partial(filter_metadata, req))
        if rewrite or added:
            mutated = pb.ProcessingResponse.FromString(RESPONSE_HEADERS_REPLY)  # the marker first, then ours
            mutation = mutated.response_headers.response.header_mutation
            set_headers(mutation, added)
            if rewrite:
                self.restorer = ModelRestorer(request.target_model, request.model, self.sse)
                mutation.remove_headers.append("content-length")
            reply = mutated
        if msg.end_of_stream:
            self._complete()
        return [reply]

    def _response_body(self, req: pb.ProcessingRequest) -> list[Reply]:
        msg = req.response_body
        chunk = msg.body
        eos = msg.end_of_stream
        ctx = self.ctx
        if ctx is not None and chunk:
            self.response_bytes += len(chunk)
            if not self._started:
                self._started = True
                self.director.response_started(ctx)
            elif self.sse:
                self.director.stream_chunk(ctx)
            if self.usage is not None:
                self.usage.feed(chunk)
        data = chunk if self.restorer is None else self.restorer.feed(chunk, eos)
        metadata = self._complete() if eos else None
        if self.response_mode == FULL_DUPLEX:
            if not data and not eos:
                return _NO_REPLY
            # (a list of messages is a list of replies: no copy for the invariant list type)
            replies = cast("list[Reply]", streamed_body(data, request=False, end_of_stream=eos))
        elif self.restorer is None:
            replies = [CONTINUE_RESPONSE_BODY]
        else:
            reply = pb.ProcessingResponse()
            mutation = reply.response_body.response.body_mutation
            if data:
                mutation.body = data
            else:
                mutation.clear_body = True
            replies = [reply]
        return _with_metadata(replies, metadata)

    def _response_trailers(self) -> list[Reply]:
        replies: list[Reply] = []
        if self.restorer is not None and self.response_mode == FULL_DUPLEX:
            rest = self.restorer.feed(b"", True)
            if rest:
                replies.extend(streamed_body(rest, request=False, end_of_stream=False))
        metadata = self._complete()
        replies.append(CONTINUE_RESPONSE_TRAILERS)
        return _with_metadata(replies, metadata)

    def _complete(self) -> dict[str, dict[str, float]] | None:
        """Complete the request (once); returns the dynamic metadata its ``ResponseComplete`` hooks reported."""
        ctx = self.ctx
        if ctx is None or ctx.done:
            return None
        prompt, completion, cached = self.usage.usage() if self.usage is not None else (None, None, None)
        info = ResponseInfo(
            status=self.status, prompt_tokens=prompt, completion_tokens=completion, cached_tokens=cached,
            error=self.status >= 400 or self.status == 0, streamed=self.sse, response_bytes=self.response_bytes)
        self.director.response_complete(ctx, info)
        return info.dynamic_metadata

    def close(self) -> None:
        """The stream ended: a request still in flight completes now.

        With a response body mode other than NONE, an end before the response body finished (reset, cancel,
        EPP error) is an error; grpc.aio ends the request iterator the same way for a half-close and a cancel, so
        they cannot be told apart. With response body mode NONE (``epp envoy-config --mode buffered
        --response-mode none``) the stream's end is the normal end of the request: no usage, and the status only
        if headers were sent. With a FULL_DUPLEX_STREAMED request body as well, Envoy ends the stream right after
        the routing reply, long before the request is over: the request is released all the same (nothing
        reports its end) and a WARNING says so, once per server.
        """
        if self.obs is not None:
            self._close_observation()
        ctx = self.ctx
        if ctx is None or ctx.done:
            return
        if self.response_mode == NONE:
            # Envoy keeps a BUFFERED stream open until the HTTP request is over, so its end is the request's end
            # (status known only if response headers were sent).
            if self.request_mode == FULL_DUPLEX and self.settings.notices.first("full-duplex-response-none"):
                log.warning(_EARLY_END_WARNING)
            self.director.response_complete(ctx, ResponseInfo(status=self.status, error=self.status >= 400,
                                                              streamed=self.sse))
            return
        self.director.response_complete(ctx, ResponseInfo(status=self.status, error=True, streamed=self.sse))

    def _close_observation(self) -> None:
        """End the observation of a request the Director will not complete (no body, or never routed); one it
        routed ends in ``response_complete``."""
        ctx = self.ctx
        if self.obs is not None and (ctx is None or ctx.done):
            self.obs.close()


GRPC_OK = 0
GRPC_INVALID_ARGUMENT = 3


class CallSide(Protocol):
    """What a transport does for an :class:`Exchange`: its half of one ``Process`` call."""

    def send(self, replies: list[Reply]) -> None:
        """Send ``replies`` in order (as one write where it can)."""

    def consumed(self, size: int) -> None:
        """The message whose framed size the transport gave :meth:`Exchange.receive` went to the Stream now."""

    def end(self, status: int, message: str) -> None:
        """End the call with a gRPC ``status`` (``GRPC_OK`` or ``GRPC_INVALID_ARGUMENT``) and ``message``; called
        once, and never after :meth:`Exchange.close`."""


class Exchange:
    """One ``Process`` call's messages through its :class:`Stream`: the handshake both transports run.

    The transport gives each message's bytes to :meth:`receive` and the client's half-close to :meth:`half_close`;
    replies leave through ``side.send``. When a message needs routing, :meth:`receive` returns the routing
    coroutine: the transport awaits it, or runs it as a task, and messages that arrive meanwhile wait behind it,
    in order (each is ``consumed`` when the Stream takes it). ``side.end`` ends the call exactly once: OK when the
    Stream closed (an ``ImmediateResponse`` went out) or the client half-closed with nothing pending,
    INVALID_ARGUMENT on a :class:`ProtocolViolation`. Any other failure answers the request with a 500
    ``ImmediateResponse`` and ends the call OK. :meth:`close` is for a call that went away (cancel, reset): the
    request is released and nothing is sent. Either way the request is released (:meth:`Stream.close`).
    """

    __slots__ = ("backlog", "busy", "done", "half_closed", "side", "stream")

    def __init__(self, settings: StreamSettings, side: CallSide) -> None:
        self.stream = Stream(settings)
        self.side = side
        self.backlog: deque[tuple[pb.ProcessingRequest, int]] = deque()  # decoded, with its framed size
        self.busy = False  # routing is in flight
        self.half_closed = False
        self.done = False

    def receive(self, data: bytes, size: int = 0) -> Coroutine[Any, Any, None] | None:
        """One message of the call (``size``: its framed size, handed back to ``side.consumed``); returns the
        routing coroutine when this message needs routing."""
        if self.done:
            return None
        try:
            req = decode_request(data)
        except ProtocolViolation as exc:
            self.end(GRPC_INVALID_ARGUMENT, str(exc))
            return None
        if self.busy:
            self.backlog.append((req, size))
            return None
        return self._handle(req, size)

    def half_close(self) -> None:
        """The client sent all its messages: the call ends once nothing is pending."""
        if self.done:
            return
        self.half_closed = True
        if not self.busy:
            self.end(GRPC_OK, "")

    def end(self, status: int, message: str) -> None:
        """End the call (once) and release the request."""
        if self.done:
            return
        self.done = True
        side, self.side = self.side, _ENDED  # no cycle with the transport left for the GC to find
        side.end(status, message)
        self.stream.close()

    def close(self) -> None:
        """The call went away: release the request, send nothing."""
        if not self.done:
            self.done = True
            self.side = _ENDED
            self.stream.close()

    def fail(self, exc: BaseException) -> None:
        """An internal error: the request gets a 500 ``ImmediateResponse``; the call ends normally."""
        log.error("ext_proc stream failed", exc_info=exc)
        if self.done:
            return
        replies = self.stream.internal_error(exc)
        if replies:
            self.side.send(replies)
        self.end(GRPC_OK, "")

    def _handle(self, req: pb.ProcessingRequest, size: int) -> Coroutine[Any, Any, None] | None:
        self.side.consumed(size)
        stream = self.stream
        try:
            replies = stream.handle(req)
        except ProtocolViolation as exc:
            self.end(GRPC_INVALID_ARGUMENT, str(exc))
            return None
        except Exception as exc:  # noqa: BLE001 -- a bug fails this request only, never the connection's others
            self.fail(exc)
            return None
        if stream.route_pending:
            self.busy = True
            return self._route()
        if replies:
            self.side.send(replies)
        if stream.closed:
            self.end(GRPC_OK, "")
        return None

    async def _route(self) -> None:
        """Await routing, send its replies, then handle what arrived meanwhile."""
        try:
            replies = await self.stream.route()
        except Exception as exc:  # noqa: BLE001 -- as in _handle
            self.busy = False
            return self.fail(exc)
        self.busy = False
        if self.done:  # the call ended while routing: release what was just routed
            self.stream.close()
            return
        self.side.send(replies)
        if self.stream.closed:
            return self.end(GRPC_OK, "")
        while self.backlog and not self.done:
            routing = self._handle(*self.backlog.popleft())
            if routing is not None:  # (a Stream routes once: a second request is a violation, never a route)
                await routing
        if self.half_closed:
            self.half_close()


class _Ended:
    """The side of an exchange that has ended: nothing more goes out."""

    def send(self, replies: list[Reply]) -> None:
        return None

    def consumed(self, size: int) -> None:
        return None

    def end(self, status: int, message: str) -> None:
        return None


_ENDED = _Ended()

_EARLY_END_WARNING = (
    "Envoy ended an ext_proc stream right after EPP routed its request: the request body mode is "
    "FULL_DUPLEX_STREAMED and the response body mode NONE, and in that combination Envoy closes the stream once "
    "the request body is answered. EPP releases such requests at once (in-flight counts, flow-control slots and "
    "running requests are low, request durations near zero) while the model servers are still answering. Fix: "
    "configure Envoy with request_body_mode BUFFERED for response_body_mode NONE (`epp envoy-config --mode "
    "buffered --response-mode none`), or send the response phase (`--response-mode streamed`). Logged once.")


def _with_metadata(replies: list[Reply], metadata: dict[str, dict[str, float]] | None) -> list[Reply]:
    """``replies`` with ``metadata`` set as ``dynamic_metadata`` on the last one (decoded first when it is a
    pre-serialized constant), as the reference attaches response plugins' metadata to the last chunk."""
    if not metadata:
        return replies
    last = replies[-1]
    if isinstance(last, bytes):
        last = pb.ProcessingResponse.FromString(last)
    for namespace, values in metadata.items():
        fields = last.dynamic_metadata.fields[namespace].struct_value.fields
        for key, value in values.items():
            fields[key].number_value = value
    return [*replies[:-1], last]


def _too_large(limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(f"request body exceeds the {limit}-byte limit")

