"""EPP's own gRPC transport for the ext_proc ``Process`` method, on :class:`~epp.extproc.h2.connection.H2Connection`.

It exists because grpc.aio costs several times more CPU per proxied request (docs/benchmarks.md). It serves the one
bidirectional-streaming method Envoy calls with the gRPC-over-HTTP/2 wire format (length-prefixed uncompressed
messages, ``grpc-status`` trailers), and hands every message to the same :class:`~epp.extproc.stream.Exchange` the
grpc.aio server uses, which keeps messages in order while a request is routed; this module keeps only the framing
and HTTP/2. Per call: a client reset or lost connection releases the request's state
(:meth:`Stream.close`); an exception in one call ends that call with an ``ImmediateResponse`` 500, never another.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from dataclasses import replace
from urllib.parse import quote

from epp.config.tls import TlsPolicy
from epp.extproc.h2.connection import H2Connection, H2Limits
from epp.extproc.h2.hpack import encode_headers
from epp.extproc.protocol import METHOD_PATH, serialize
from epp.extproc.stream import GRPC_INVALID_ARGUMENT, GRPC_OK, Exchange, Reply, StreamSettings
from epp.extproc.stream_metrics import UNKNOWN, StreamMetrics
from epp.extproc.tls import KeyPair, check_key_pair, load_pair_into

__all__ = ["GrpcStatus", "NativeServer"]

log = logging.getLogger("epp.extproc")

_RESPONSE_HEADERS = encode_headers([(b":status", b"200"), (b"content-type", b"application/grpc")])
_OK_TRAILERS = encode_headers([(b"grpc-status", b"0")])


class GrpcStatus:
    """The gRPC status codes this transport sends."""

    OK = GRPC_OK
    INVALID_ARGUMENT = GRPC_INVALID_ARGUMENT
    RESOURCE_EXHAUSTED = 8
    UNIMPLEMENTED = 12
    INTERNAL = 13


def _trailers(status: int, message: str, headers_sent: bool) -> bytes:
    if status == GrpcStatus.OK and headers_sent:
        return _OK_TRAILERS
    fields = [] if headers_sent else [(b":status", b"200"), (b"content-type", b"application/grpc")]
    fields.append((b"grpc-status", str(status).encode()))
    if message:
        fields.append((b"grpc-message", quote(message[:512], safe=" ").encode()))
    return encode_headers(fields)


class _Call:
    """One ``Process`` call: gRPC message framing and HTTP/2 around an :class:`~epp.extproc.stream.Exchange` (the
    transport's :class:`~epp.extproc.stream.CallSide`)."""

    __slots__ = (
        "begun",
        "buf",
        "conn",
        "exchange",
        "headers_sent",
        "meter",
        "owner",
        "stream_id",
        "task",
        "want",
    )
    begun: float
    """When the call was accepted (set only with ``meter``)."""

    def __init__(self, owner: _Calls, conn: H2Connection, stream_id: int) -> None:
        self.owner = owner
        self.conn = conn
        self.stream_id = stream_id
        self.exchange = Exchange(owner.server.settings, self)
        self.buf = bytearray()
        self.headers_sent = False
        self.task: asyncio.Task[None] | None = None
        self.meter: StreamMetrics | None = None  # --enable-grpc-stream-metrics: set with begun once accepted
        self.want = 0  # framed size of an incomplete message larger than the stream window (reserved)

    def feed(self, data: bytes, end: bool) -> None:
        """Bytes of the request stream: complete messages go to the exchange, a partial one waits for more. A
        message counts as consumed (its bytes credited to the flow-control windows) once handed to the Stream."""
        buf = self.buf
        buf += data
        server = self.owner.server
        limit = server.max_recv
        exchange = self.exchange
        while len(buf) >= 5 and not exchange.done:
            if buf[0]:
                return self.finish(GrpcStatus.UNIMPLEMENTED, "compressed messages are not supported")
            size = int.from_bytes(buf[1:5], "big")
            if size > limit:  # grpc's status and wording
                return self.finish(GrpcStatus.RESOURCE_EXHAUSTED, f"Received message larger than max ({size} vs. "
                                                                  f"{limit})")
            framed = 5 + size
            if len(buf) < framed:
                if framed > server.limits.initial_stream_window and not self.want:
                    self.want = framed  # more than the stream window can hold: ask for room for all of it
                    self.conn.expect(self.stream_id, framed)
                break
            if self.want:
                self.want = 0
                self.conn.expect(self.stream_id, 0)
            message = bytes(buf[5:framed])
            del buf[:framed]
            routing = exchange.receive(message, framed)
            if routing is not None:  # later messages wait in the exchange until it is done
                self.task = self.conn._loop.create_task(routing)  # no get_running_loop(): a getpid() on 3.11
        if end:
            exchange.half_close()

    # -- CallSide ----------------------------------------------------------------------------------------------

    def consumed(self, size: int) -> None:
        self.conn.consume(self.stream_id, size)

    def send(self, replies: list[Reply]) -> None:
        """Frame ``replies`` as gRPC messages and queue them on the connection as one write; a reply over the send
        limit ends the call with RESOURCE_EXHAUSTED instead (after the replies before it), as grpc does."""
        limit = self.owner.server.max_send
        parts: list[bytes] = []
        for reply in replies:
            data = serialize(reply)
            if len(data) > limit:
                self._write(parts)
                return self.finish(GrpcStatus.RESOURCE_EXHAUSTED,
                                   f"Sent message larger than max ({len(data)} vs. {limit})")
            parts.append(b"\x00" + len(data).to_bytes(4, "big"))
            parts.append(data)
        self._write(parts)

    def end(self, status: int, message: str) -> None:
        """The exchange ends the call: trailers with ``status``."""
        self._forget(status)
        self.conn.finish(self.stream_id, _trailers(status, message, self.headers_sent))

    # -- ending ------------------------------------------------------------------------------------------------

    def finish(self, status: int, message: str) -> None:
        """End the call with ``status`` (a framing or size limit) and release the request's state."""
        self.exchange.end(status, message)

    def abort(self) -> None:
        """The client reset the stream or the connection is gone: release everything, send nothing."""
        if self.exchange.done:
            return
        self._forget(UNKNOWN)  # as the reference's handler returning the stream context's error
        self.exchange.close()

    def _write(self, parts: list[bytes]) -> None:
        if not parts:
            return
        if not self.headers_sent:
            self.headers_sent = True
            self.conn.send_headers(self.stream_id, _RESPONSE_HEADERS)
        self.conn.send_data(self.stream_id, b"".join(parts))

    def _forget(self, status: int) -> None:
        """The call is over: metered, forgotten by its connection, routing still in flight cancelled (never the task
        that is ending the call itself)."""
        if self.meter is not None:
            self.meter.finished(status, self.begun)
        self.owner.forget(self.stream_id)
        task, self.task = self.task, None
        if task is not None and not task.done() and task is not asyncio.current_task():
            task.cancel()


class _Calls:
    """The calls of one connection (the connection's :class:`~epp.extproc.h2.connection.StreamApp`)."""

    __slots__ = ("calls", "conn", "server")

    def __init__(self, server: NativeServer) -> None:
        self.server = server
        self.calls: dict[int, _Call] = {}
        self.conn: H2Connection | None = None

    def headers_received(self, conn: H2Connection, stream_id: int, headers: list[tuple[bytes, bytes]],
                         end_stream: bool) -> None:
        self.conn = conn
        call = _Call(self, conn, stream_id)
        self.calls[stream_id] = call
        self.server.call_started()
        fields = dict(headers)
        path = fields.get(b":path", b"")
        if path != _METHOD or fields.get(b":method") != b"POST":
            return call.finish(GrpcStatus.UNIMPLEMENTED, f"unknown method {path.decode('latin-1')}")
        if not fields.get(b"content-type", b"").startswith(b"application/grpc"):
            return call.finish(GrpcStatus.INTERNAL, "content-type must be application/grpc")
        meter = self.server.stream_metrics
        if meter is not None:
            call.meter, call.begun = meter, meter.started()
        if end_stream:
            call.feed(b"", True)

    def data_received(self, stream_id: int, data: bytes, end_stream: bool) -> None:
        call = self.calls.get(stream_id)
        if call is not None:
            call.feed(data, end_stream)
        elif data and self.conn is not None:  # the call ended before the client stopped sending: drop it
            self.conn.consume(stream_id, len(data))

    def stream_reset(self, stream_id: int) -> None:
        call = self.calls.get(stream_id)
        if call is not None:
            call.abort()

    def forget(self, stream_id: int) -> None:
        if self.calls.pop(stream_id, None) is not None:
            self.server.call_ended()


_METHOD = METHOD_PATH.encode()


class NativeServer:
    """The listener: TCP (or TLS with ALPN ``h2``) on ``host:port``, one :class:`H2Connection` per client.

    ``active`` counts open calls; :meth:`stop` sends GOAWAY, lets open calls finish for ``grace`` seconds and
    then closes every connection. ``max_recv`` / ``max_send`` bound one gRPC message (its length prefix) each way.
    ``stream_metrics`` records each ``Process`` call (None: nothing recorded). ``limits`` bounds what one HTTP/2
    connection may do (None: the production defaults); its ``connection_buffer`` is raised, if need be, to hold
    one ``max_recv`` message besides the initial connection window.
    """

    def __init__(self, settings: StreamSettings, max_recv: int, max_send: int,
                 stream_metrics: StreamMetrics | None = None, limits: H2Limits | None = None) -> None:
        self.settings = settings
        self.max_recv = max_recv
        self.max_send = max_send
        self.stream_metrics = stream_metrics
        limits = limits or H2Limits()
        room = min(5 + max_recv + limits.initial_connection_window, (1 << 31) - 1)
        self.limits = limits if limits.connection_buffer >= room else replace(limits, connection_buffer=room)
        self.active = 0
        self.connections: set[H2Connection] = set()
        self._server: asyncio.Server | None = None
        self.ssl_context: ssl.SSLContext | None = None
        self._idle = asyncio.Event()
        self._idle.set()
        self._stopped = asyncio.Event()

    async def start(self, host: str, port: int, key_pair: KeyPair | None, policy: TlsPolicy | None = None) -> int:
        """Bind and serve (TLS with ``key_pair`` under ``policy``, else plaintext); returns the bound port."""
        ctx = _ssl_context(key_pair, policy or TlsPolicy()) if key_pair is not None else None
        self.ssl_context = ctx
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(self._connection, host, port, ssl=ctx, backlog=1024,
                                                reuse_address=True)
        return int(self._server.sockets[0].getsockname()[1])

    def _connection(self) -> H2Connection:
        conn = H2Connection(_Calls(self), on_close=self.connections.discard, limits=self.limits)
        self.connections.add(conn)
        return conn

    def call_started(self) -> None:
        self.active += 1
        self._idle.clear()

    def call_ended(self) -> None:
        self.active -= 1
        if self.active == 0:
            self._idle.set()

    async def stop(self, grace: float | None) -> None:
        """GOAWAY to every client, wait up to ``grace`` seconds (None: forever) for open calls, then close."""
        if self._server is None:
            return
        self._server.close()
        for conn in list(self.connections):
            conn.goaway()
        if self.active:
            try:
                await asyncio.wait_for(self._idle.wait(), grace)
            except TimeoutError:
                log.warning("ext_proc: %d stream(s) still open after %.1f s; closing", self.active, grace or 0)
        for conn in list(self.connections):
            conn.close()
        await self._server.wait_closed()
        self._server = None
        self._stopped.set()

    async def wait_for_termination(self) -> None:
        """Block until :meth:`stop` finished."""
        await self._stopped.wait()


    def reload_tls(self, key_pair: KeyPair) -> None:
        """Serve new TLS handshakes with ``key_pair`` (open connections keep theirs); ``ssl.SSLError`` if the key
        does not match the certificate, and then nothing changes."""
        if self.ssl_context is None:
            raise RuntimeError("the ext_proc server does not serve TLS")
        check_key_pair(key_pair)
        load_pair_into(self.ssl_context, key_pair)


def _ssl_context(key_pair: KeyPair, policy: TlsPolicy) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    policy.apply(ctx)
    ctx.set_alpn_protocols(["h2"])
    load_pair_into(ctx, key_pair)
    return ctx
