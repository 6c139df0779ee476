"""The gRPC health service (``grpc.health.v1.Health``) with the reference EPP's service names and rules.

*Ready* means the datastore is synced (:attr:`~epp.datalayer.datastore.Datastore.synced`) and draining has not
started. Without leader election every service name is SERVING while ready; ``liveness`` is SERVING while the
process runs. With leader election, ``readiness``, ``""`` and the ext_proc service name need ready **and** leader,
and any other name is ``SERVICE_UNKNOWN``. ``List`` gives the ext_proc service's status (plus ``liveness`` and
``readiness`` with leader election).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Protocol

import grpc

from epp._pb.grpc.health.v1 import health_pb2
from epp.extproc.protocol import SERVICE_NAME

if TYPE_CHECKING:
    from epp.datalayer.datastore import Datastore

__all__ = ["HealthService", "HEALTH_SERVICE", "LIVENESS", "READINESS", "Leadership"]

HEALTH_SERVICE = "grpc.health.v1.Health"
LIVENESS = "liveness"
READINESS = "readiness"
_READY_NAMES = frozenset({READINESS, SERVICE_NAME, ""})
_Status = health_pb2.HealthCheckResponse.ServingStatus


class Leadership(Protocol):
    """Whether this replica leads (:class:`epp.datalayer.leader.LeaderElector`)."""

    @property
    def is_leader(self) -> bool: ...

    async def changed(self) -> None:
        """Resolve at the next change of :attr:`is_leader`."""


class HealthService:
    """Answers ``Check``, ``List`` and ``Watch``; :meth:`set_draining` flips readiness to NOT_SERVING for good."""

    def __init__(self, datastore: Datastore, leadership: Leadership | None = None) -> None:
        self.datastore = datastore
        self.leadership = leadership
        self.draining = False
        self._changed = asyncio.Event()

    def status(self, service: str) -> health_pb2.HealthCheckResponse.ServingStatus:
        """The serving status of ``service`` (see the module docstring)."""
        if service == LIVENESS:
            return _Status.SERVING
        if self.leadership is not None and service not in _READY_NAMES:
            return _Status.SERVICE_UNKNOWN
        ready = self.datastore.synced.is_set() and not self.draining
        if self.leadership is not None:
            ready = ready and self.leadership.is_leader
        return _Status.SERVING if ready else _Status.NOT_SERVING

    def set_draining(self) -> None:
        """Report NOT_SERVING on readiness from now on (graceful shutdown)."""
        self.draining = True
        self._changed.set()

    async def check(self, request: health_pb2.HealthCheckRequest,
                    context: grpc.aio.ServicerContext) -> health_pb2.HealthCheckResponse:
        return health_pb2.HealthCheckResponse(status=self.status(request.service))

    async def list(self, request: health_pb2.HealthListRequest,
                   context: grpc.aio.ServicerContext) -> health_pb2.HealthListResponse:
        """The statuses the reference lists: the ext_proc service's, and with leader election also liveness and
        readiness (each as ``Check`` answers it)."""
        names = [SERVICE_NAME] if self.leadership is None else [SERVICE_NAME, LIVENESS, READINESS]
        return health_pb2.HealthListResponse(
            statuses={n: health_pb2.HealthCheckResponse(status=self.status(n)) for n in names})

    async def watch(self, request: health_pb2.HealthCheckRequest,
                    context: grpc.aio.ServicerContext) -> AsyncIterator[health_pb2.HealthCheckResponse]:
        last: health_pb2.HealthCheckResponse.ServingStatus | None = None
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
            if self.leadership is not None:
                waits.append(asyncio.ensure_future(self.leadership.changed()))
            try:
                # The waits take hold of their events only when they first run: let them, then look again, so a
                # change made while the last status was being sent is not missed.
                await asyncio.sleep(0)
                if self.status(request.service) == last and self.draining == draining:
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
            "List": grpc.unary_unary_rpc_method_handler(
                self.list, request_deserializer=health_pb2.HealthListRequest.FromString,
                response_serializer=health_pb2.HealthListResponse.SerializeToString),
            "Watch": grpc.unary_stream_rpc_method_handler(
                self.watch, request_deserializer=health_pb2.HealthCheckRequest.FromString,
                response_serializer=health_pb2.HealthCheckResponse.SerializeToString),
        })
