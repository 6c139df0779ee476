"""Helpers for the data-layer tests: a switchable /metrics server, and asking an EPP's gRPC health port."""

from __future__ import annotations

import asyncio
import ssl

import grpc
from aiohttp import web

from epp._pb.grpc.health.v1 import health_pb2


class MetricsServer:
    """A real aiohttp server serving ``/metrics`` whose behaviour tests switch at will.

    Modes: ``page`` (200 with ``body``), ``status`` (``status`` code with ``body``), ``hang`` (never answers
    within the scraper's timeout), ``drop`` (closes the connection without a response). ``stop()`` makes it
    disappear (connection refused); ``start()`` brings it back on the same port. With ``ssl_context`` it
    speaks only TLS.
    """

    def __init__(self, ssl_context: ssl.SSLContext | None = None) -> None:
        self.ssl_context = ssl_context
        self.mode = "page"
        self.body = b""
        self.status = 200
        self.hits = 0
        self.last_path = ""
        self.accept_encoding: str | None = None
        self.port = 0
        self._runner: web.AppRunner | None = None

    async def _metrics(self, request: web.Request) -> web.StreamResponse:
        self.hits += 1
        self.last_path = request.path
        self.accept_encoding = request.headers.get("Accept-Encoding")
        if self.mode == "hang":
            await asyncio.sleep(30)
        if self.mode == "drop":
            assert request.transport is not None
            request.transport.close()
            return web.Response()
        status = self.status if self.mode == "status" else 200
        resp = web.Response(body=self.body, status=status, content_type="text/plain")
        if "gzip" in (self.accept_encoding or ""):
            resp.enable_compression(web.ContentCoding.gzip)  # as prometheus_client's handlers do
        return resp

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/custom/path", self._metrics)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1, handler_cancellation=True)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port, reuse_address=True, ssl_context=self.ssl_context)
        await site.start()
        self.port = self._runner.addresses[0][1]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def serve(self, body: bytes, status: int = 200) -> None:
        self.body, self.status = body, status
        self.mode = "page" if status == 200 else "status"


async def grpc_health(port: int, service: str) -> int | None:
    """The gRPC health answer for ``service`` on 127.0.0.1:``port`` (as the kubelet's ``grpc`` probe asks), or None
    while nothing answers."""
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            check = channel.unary_unary("/grpc.health.v1.Health/Check",
                                        request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
                                        response_deserializer=health_pb2.HealthCheckResponse.FromString)
            reply = await asyncio.wait_for(check(health_pb2.HealthCheckRequest(service=service)), 2)
            return int(reply.status)
    except (grpc.aio.AioRpcError, asyncio.TimeoutError):
        return None
