"""``ExtProcServer``: the ``envoy.service.ext_proc.v3.ExternalProcessor`` gRPC service plus its health port.

Usage (what ``epp serve`` does)::

    server = ExtProcServer(director, port=9002, health_port=9003)       # TLS with a self-signed certificate
    await server.start()                                                 # binds; .port / .health_port are set
    ...
    await server.stop()                                                  # readiness off, drain streams, close

Each gRPC stream is one HTTP request, driven through :class:`~epp.extproc.stream.Exchange` as on the native
transport. A failure inside one stream becomes
that request's ``ImmediateResponse``; it never touches other streams. A protocol violation (a message Envoy never
sends at that point, or one that does not decode) ends the call with ``INVALID_ARGUMENT`` instead, as on the
native transport. Messages are upb protobufs; constant replies are pre-serialized bytes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Literal

import grpc

from epp.config.tls import TlsPolicy
from epp.extproc.h2.connection import H2Limits
from epp.extproc.h2.server import NativeServer
from epp.extproc.health import HealthService
from epp.extproc.protocol import SERVICE_NAME, BodySendMode, serialize
from epp.extproc.stream import GRPC_OK, Exchange, Reply, StreamSettings
from epp.extproc.stream_metrics import UNKNOWN, StreamMetrics
from epp.extproc.tls import CertWatcher, KeyPair, TlsFiles, check_key_pair, load_key_pair, self_signed
from epp.framework.request import DEFAULT_BODY_LIMIT

if TYPE_CHECKING:
    from epp.scheduling.director import Director

__all__ = ["DEFAULT_BODY_LIMIT", "ExtProcServer", "RequestMode", "ResponseMode", "Transport"]

log = logging.getLogger("epp.extproc")
_GRPC_INT_MAX = 2**31 - 1  # grpc's channel arguments are C ints
_STATUS_CODES = {code.value[0]: code for code in grpc.StatusCode}



class RequestMode(StrEnum):
    """How request bodies reach EPP: as Envoy announces it (``auto``), or forced."""

    AUTO = "auto"
    FULL_DUPLEX = "full-duplex"
    BUFFERED = "buffered"


class Transport(StrEnum):
    """What serves the gRPC ``Process`` method: EPP's own HTTP/2 transport (:mod:`epp.extproc.h2.server`, the
    default: a quarter to a third of the CPU per request of grpc.aio) or grpc.aio."""

    NATIVE = "native"
    GRPCIO = "grpcio"


class ResponseMode(StrEnum):
    """How response bodies reach EPP: as Envoy announces it (``auto``), or forced."""

    AUTO = "auto"
    FULL_DUPLEX = "full-duplex"
    STREAMED = "streamed"
    BUFFERED = "buffered"
    NONE = "none"


_REQUEST_MODES = {RequestMode.AUTO: None, RequestMode.FULL_DUPLEX: BodySendMode.FULL_DUPLEX_STREAMED,
                  RequestMode.BUFFERED: BodySendMode.BUFFERED}
_RESPONSE_MODES = {ResponseMode.AUTO: None, ResponseMode.FULL_DUPLEX: BodySendMode.FULL_DUPLEX_STREAMED,
                   ResponseMode.STREAMED: BodySendMode.STREAMED, ResponseMode.BUFFERED: BodySendMode.BUFFERED,
                   ResponseMode.NONE: BodySendMode.NONE}


class ExtProcServer:
    """The ext_proc service on ``host:port`` and the gRPC health service on ``host:health_port``.

    TLS: ``tls`` names a certificate and key; without it a self-signed pair is generated at :meth:`start`
    (the reference's default); ``plaintext=True`` serves without TLS. Port 0 binds a free port; read
    :attr:`port` / :attr:`health_port` after :meth:`start`. ``health_port=None`` serves no health service.
    ``body_limit`` refuses larger request bodies with 413 before parsing. ``max_recv_message`` /
    ``max_send_message`` bound one gRPC message each way (0: ``body_limit`` plus 1 MiB, since a BUFFERED body
    arrives in one message); a larger one ends its stream with RESOURCE_EXHAUSTED, on either transport.
    ``stream_metrics`` records every ``Process`` stream (``--enable-grpc-stream-metrics``; None: nothing is
    recorded). ``tls_policy`` sets the minimum TLS version and TLS <= 1.2 ciphers (``--tls-min-version``,
    ``--tls-cipher-suites``); only the native transport can (grpcio exposes neither): ``ValueError`` otherwise.
    ``emit_scores`` adds the primary profile's per-endpoint scores to ``envoy.lb`` (``--emit-endpoint-scores``).
    """

    def __init__(self, director: Director, *, host: str = "0.0.0.0", port: int = 9002,
                 health_port: int | None = 9003, tls: TlsFiles | None = None, plaintext: bool = False,
                 body_limit: int = DEFAULT_BODY_LIMIT, mode: RequestMode | str = RequestMode.AUTO,
                 response_mode: ResponseMode | str = ResponseMode.AUTO,
                 transport: Transport | str = Transport.NATIVE, shutdown_grace: float | None = 30.0,
                 cert_reload: bool = False, health: HealthService | None = None,
                 stream_metrics: StreamMetrics | None = None, max_recv_message: int = 0,
                 max_send_message: int = 0, tls_policy: TlsPolicy | None = None, emit_scores: bool = False,
                 h2_limits: H2Limits | None = None) -> None:
        if body_limit <= 0:
            raise ValueError("body_limit must be positive")
        self.tls_policy = tls_policy or TlsPolicy()
        if not self.tls_policy.is_default and Transport(transport) is not Transport.NATIVE:
            raise ValueError("--tls-min-version and --tls-cipher-suites need the native ext_proc transport "
                             "(grpcio cannot set them)")
        self.director = director
        self.host = host
        self.port = port
        self.health_port = health_port
        self.tls = tls
        self.plaintext = plaintext
        self.body_limit = body_limit
        self.mode = RequestMode(mode)
        self.response_mode = ResponseMode(response_mode)
        self.transport = Transport(transport)
        self.shutdown_grace = shutdown_grace
        self.max_recv_message = max_recv_message or body_limit + (1 << 20)
        self.max_send_message = max_send_message or body_limit + (1 << 20)
        self.settings = StreamSettings(director, body_limit, _REQUEST_MODES[self.mode],
                                       _RESPONSE_MODES[self.response_mode], emit_scores=emit_scores)
        self.health = health or HealthService(director.datastore)
        if cert_reload and (tls is None or plaintext):
            raise ValueError("certificate reload needs a certificate and key, and TLS")
        self.cert_reload = cert_reload
        self.stream_metrics = stream_metrics
        self.h2_limits = h2_limits
        self.cert_watcher: CertWatcher | None = None
        self._pending_pair: KeyPair | None = None
        self.key_pair: KeyPair | None = None
        self._grpcio_streams = 0
        self._grpcio_idle = asyncio.Event()
        self._grpcio_idle.set()
        self._server: grpc.aio.Server | None = None
        self._native: NativeServer | None = None
        self._health_server: grpc.aio.Server | None = None

    async def start(self) -> None:
        """Bind both ports and start serving (``RuntimeError`` if a port cannot be bound)."""
        if not self.plaintext:
            self.key_pair = load_key_pair(self.tls) if self.tls is not None else self_signed([self.host])
        if self.transport is Transport.NATIVE:
            await self._start_native()
        else:
            await self._start_grpcio()
        if self.health_port is not None:
            await self._start_health()
        if self.cert_reload:
            assert self.tls is not None
            self.cert_watcher = CertWatcher(self.tls, self._reload_tls)
            self.cert_watcher.start()
        log.info("ext_proc listening on %s:%d (%s, %s transport), health on %s", self.host, self.port,
                 "plaintext" if self.plaintext else "TLS", self.transport.value, self.health_port)

    async def _start_native(self) -> None:
        native = NativeServer(self.settings, self.max_recv_message, self.max_send_message, self.stream_metrics,
                              self.h2_limits)
        try:
            self.port = await native.start(self.host, self.port, self.key_pair, self.tls_policy)
        except OSError as exc:
            raise RuntimeError(f"cannot bind the ext_proc port {self.host}:{self.port}: {exc}") from exc
        self._native = native

    @property
    def active_streams(self) -> int:
        """ext_proc streams open now (on whichever transport serves them)."""
        return self._native.active if self._native is not None else self._grpcio_streams

    async def _start_grpcio(self) -> None:
        options = [("grpc.max_receive_message_length", min(self.max_recv_message, _GRPC_INT_MAX)),
                   ("grpc.max_send_message_length", min(self.max_send_message, _GRPC_INT_MAX)),
                   ("grpc.so_reuseport", 0)]
        server = grpc.aio.server(options=options)
        server.add_generic_rpc_handlers([self._handler()])
        address = f"{_host(self.host)}:{self.port}"
        if self.key_pair is None:
            bound = server.add_insecure_port(address)
        elif self.cert_reload:
            creds = grpc.dynamic_ssl_server_credentials(_cert_config(self.key_pair), self._next_cert_config)
            bound = server.add_secure_port(address, creds)
        else:
            creds = grpc.ssl_server_credentials([(self.key_pair.key_pem, self.key_pair.cert_pem)])
            bound = server.add_secure_port(address, creds)
        if bound == 0:
            raise RuntimeError(f"cannot bind the ext_proc port {address}")
        self.port = bound
        await server.start()
        self._server = server

    async def _start_health(self) -> None:
        health = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
        health.add_generic_rpc_handlers([self.health.handler()])
        health_address = f"{_host(self.host)}:{self.health_port}"
        bound = health.add_insecure_port(health_address)
        if bound == 0:
            await self.stop(None)
            raise RuntimeError(f"cannot bind the health port {health_address}")
        self.health_port = bound
        await health.start()
        self._health_server = health

    async def stop(self, grace: float | None | Literal["default"] = "default") -> None:
        """Graceful shutdown: readiness goes NOT_SERVING, new streams are refused (GOAWAY on the native
        transport), running streams get ``grace`` seconds to finish (None: wait for all; by default the
        constructor's ``shutdown_grace``, 30 s, Kubernetes' default termination grace period), then the ext_proc
        server closes; the health service answers (NOT_SERVING) until then and closes last. Each step is logged."""
        if grace == "default":
            grace = self.shutdown_grace
        self.health.set_draining()
        if self.cert_watcher is not None:
            await self.cert_watcher.stop()
            self.cert_watcher = None
        if self._native is not None or self._server is not None:
            await self._stop_serving(grace)
        if self._health_server is not None:
            await self._health_server.stop(None)
            self._health_server = None

    async def _stop_serving(self, grace: float | None) -> None:
        """Refuse new streams, wait up to ``grace`` for the open ones, close; log what happened."""
        loop = asyncio.get_running_loop()
        begun, open_streams = loop.time(), self.active_streams
        log.info("ext_proc: refusing new streams (GOAWAY) and closing the listener; %d stream(s) open, waiting "
                 "up to %s for them", open_streams, "ever" if grace is None else f"{grace:g}s")
        if self._native is not None:
            await self._native.stop(grace)  # logs a warning naming the streams it had to cut
            self._native = None
        if self._server is not None:
            stopping = asyncio.ensure_future(self._server.stop(grace))  # refuses new calls at once
            try:
                if self._grpcio_streams:  # wait_for(..., 0) times out before an already-set event is seen
                    await asyncio.wait_for(self._grpcio_idle.wait(), grace)
            except TimeoutError:  # grpc cancels the rest now
                log.warning("ext_proc: %d stream(s) still open after %.1f s; closing", self._grpcio_streams,
                            grace or 0)
            await stopping
            self._server = None
        log.info("ext_proc stopped after %.2fs (%d stream(s) were open when it began)", loop.time() - begun,
                 open_streams)

    def _reload_tls(self, key_pair: KeyPair) -> None:
        """Use ``key_pair`` for new TLS handshakes (``ssl.SSLError`` if it is not a matching pair)."""
        if self._native is not None:
            self._native.reload_tls(key_pair)
        else:
            check_key_pair(key_pair)
            self._pending_pair = key_pair  # grpc asks for it at its next handshake
        self.key_pair = key_pair

    def _next_cert_config(self) -> Any:
        """grpc's certificate fetcher: the reloaded pair once, then None (no change)."""
        pair, self._pending_pair = self._pending_pair, None
        return None if pair is None else _cert_config(pair)

    async def wait_for_termination(self) -> None:
        """Block until the ext_proc server stops."""
        if self._native is not None:
            await self._native.wait_for_termination()
        if self._server is not None:
            await self._server.wait_for_termination()

    def _handler(self) -> grpc.GenericRpcHandler:
        # No request deserializer: process() decodes each message itself, so that bytes which are no
        # ProcessingRequest end the call with INVALID_ARGUMENT (as on the native transport) instead of
        # surfacing from grpc's iterator as an unexpected error.
        process = grpc.stream_stream_rpc_method_handler(self.process, response_serializer=serialize)
        return grpc.method_handlers_generic_handler(SERVICE_NAME, {"Process": process})

    async def process(self, requests: AsyncIterator[bytes],
                      context: grpc.aio.ServicerContext) -> AsyncIterator[Reply]:
        """The ``Process`` RPC: one stream per HTTP request, its messages as raw bytes, through an
        :class:`~epp.extproc.stream.Exchange` (as on the native transport). The next message is read only once
        the previous one is answered, routing included.

        A protocol violation (an undecodable message included) ends the call with ``INVALID_ARGUMENT``; any other
        failure answers the request with a 500 ``ImmediateResponse``. Either way the request is released.
        """
        side = _GrpcioSide()
        exchange = Exchange(self.settings, side)
        self._grpcio_streams += 1
        self._grpcio_idle.clear()
        if self.stream_metrics is not None:
            _measure(self.stream_metrics, context)
        try:
            async for data in requests:
                routing = exchange.receive(data)
                if routing is not None:
                    await routing
                if side.replies:
                    replies, side.replies = side.replies, []
                    for reply in replies:
                        yield reply
                if exchange.done:
                    break
            else:
                exchange.half_close()
            if side.status != GRPC_OK:
                await context.abort(_STATUS_CODES[side.status], side.message)
        except grpc.aio.AbortError:
            raise
        except Exception as exc:  # a failure of the transport's own (an error in a message is the exchange's)
            exchange.fail(exc)
            for reply in side.replies:
                yield reply
        finally:
            self._grpcio_streams -= 1
            if not self._grpcio_streams:
                self._grpcio_idle.set()
            exchange.close()


class _GrpcioSide:
    """grpc.aio's :class:`~epp.extproc.stream.CallSide`: replies are collected for the handler to yield, and the
    end's status for it to abort with."""

    __slots__ = ("message", "replies", "status")

    def __init__(self) -> None:
        self.replies: list[Reply] = []
        self.status = GRPC_OK
        self.message = ""

    def send(self, replies: list[Reply]) -> None:
        self.replies.extend(replies)

    def consumed(self, size: int) -> None:
        """grpc.aio does its own flow control."""

    def end(self, status: int, message: str) -> None:
        self.status, self.message = status, message


def _measure(meter: StreamMetrics, context: grpc.aio.ServicerContext) -> None:
    """Record a grpc.aio ``Process`` stream: open now, ended when grpc's task for the call ends (whatever ends
    it) with the status sent: an abort's code, else OK. No status sent (the client cancelled while EPP was routing,
    the server stopped) counts as ``Unknown``, as in the reference. A client reset while EPP waits for the next
    message reaches the handler as the end of the request stream (grpc.aio merges the two) and counts as OK."""
    begun = meter.started()

    def ended(ctx: grpc.aio.ServicerContext) -> None:
        code = ctx.code()
        meter.finished(code.value[0] if code is not None else 0 if ctx.done() else UNKNOWN, begun)

    context.add_done_callback(ended)


def _host(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def _cert_config(pair: KeyPair) -> Any:
    return grpc.ssl_server_certificate_configuration([(pair.key_pem, pair.cert_pem)])
