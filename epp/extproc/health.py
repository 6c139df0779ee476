"""The gRPC health service (``grpc.health.v1.Health``) with the reference EPP's service names.

``liveness`` is SERVING while the process runs. ``readiness``, the ext_proc service name and ``""`` are SERVING
while the datastore is synced (:attr:`~epp.datastore.Datastore.synced`: set after discovery's first sync,
cleared while the InferencePool is deleted, as the reference's ``PoolHasSynced``) and until draining starts.
Any other name is ``NOT_FOUND`` (``Check``) or ``SERVICE_UNKNOWN`` (``Watch``), as the gRPC health spec says.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc

from epp._pb.grpc.health.v1 import health_pb2
from epp.datastore import Datastore

from .protocol import SERVICE_NAME

__all__ = ["HealthService", "HEALTH_SERVICE", "LIVENESS", "READINESS"]

HEALTH_SERVICE = "grpc.health.v1.Health"
LIVENESS = "liveness"
READINESS = "readiness"
_READY_NAMES = frozenset({READINESS, SERVICE_NAME, ""})
_Status = health_pb2.HealthCheckResponse.ServingStatus


class HealthService:
    """Answers ``Check`` and ``Watch``; :meth:`set_draining` flips readiness to NOT_SERVING for good."""

    def __init__(self, datastore: Datastore) -> None:
        self.datastore = datastore
        self.draining = False
        self._changed = asyncio.Event()

    def status(self, service: str) -> int:
        """The serving status of ``service`` (``SERVICE_UNKNOWN`` for names the reference does not serve)."""
        if service == LIVENESS:
            return _Status.SERVING
        if service in _READY_NAMES:
            ready = self.datastore.synced.is_set() and not self.draining
            return _Status.SERVING if ready else _Status.NOT_SERVING
        return _Status.SERVICE_UNKNOWN

    def set_draining(self) -> None:
        """Report NOT_SERVING on readiness from now on (graceful shutdown)."""
        self.draining = True
        self._changed.set()

    async def check(self, request: health_pb2.HealthCheckRequest,
                    context: grpc.aio.ServicerContext) -> health_pb2.HealthCheckResponse:
        status = self.status(request.service)
        if status == _Status.SERVICE_UNKNOWN:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service {request.service!r}")
        return health_pb2.HealthCheckResponse(status=status)

    async def watch(self, request: health_pb2.HealthCheckRequest,
                    context: grpc.aio.ServicerContext) -> AsyncIterator[health_pb2.HealthCheckResponse]:
        last = None
        while True:
            draining = self.draining  # read before the status, so the status sent last is the draining one
            status = self.status(request.service)
            if status != last:
                last = status
                yield health_pb2.HealthCheckResponse(status=status)
            if draining:
                return  # the server is going away; the final status was sent
            waits = [asyncio.ensure_future(self._changed.wait()),
                     asyncio.ensure_future(self.datastore.sync_changed())]
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waits:
                    w.cancel()

    def handler(self) -> grpc.GenericRpcHandler:
        """The generic handler to add to a ``grpc.aio`` server."""
        return grpc.method_handlers_generic_handler(HEALTH_SERVICE, {
            "Check": grpc.unary_unary_rpc_method_handler(
                self.check, request_deserializer=health_pb2.HealthCheckRequest.FromString,
                response_serializer=health_pb2.HealthCheckResponse.SerializeToString),
            "Watch": grpc.unary_stream_rpc_method_handler(
                self.watch, request_deserializer=health_pb2.HealthCheckRequest.FromString,
                response_serializer=health_pb2.HealthCheckResponse.SerializeToString),
        })
