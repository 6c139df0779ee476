"""The EDS service: ``envoy.service.endpoint.v3.EndpointDiscoveryService/StreamEndpoints`` (state of the world).

Every stream gets a ``ClusterLoadAssignment`` of the datastore's endpoints for each cluster name it asks for (one
pool per EPP: every name gets the pool; no name, the wildcard, gets :attr:`EdsService.default_name`), again
whenever the datastore adds or removes an endpoint, and again when the stream asks for other names. Versions are
``<epoch>-<n>``: ``n`` counts datastore changes, the epoch tells one EPP run from the next. A request whose
``response_nonce`` is not the last one sent is stale and ignored, as the xDS protocol says; an ACK changes
nothing; a NACK (``error_detail`` set) is logged and that version is not sent again (a later change is). Only IP
endpoints are served: Envoy refuses a host name in EDS, which would block every later update.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import grpc

from epp._pb.envoy.config.endpoint.v3 import endpoint_pb2
from epp._pb.envoy.service.discovery.v3 import discovery_pb2
from epp.datalayer.datastore import Datastore
from epp.framework.endpoint import Endpoint

__all__ = ["EdsService", "EDS_SERVICE", "CLA_TYPE"]

log = logging.getLogger("epp.envoy.xds")

EDS_SERVICE = "envoy.service.endpoint.v3.EndpointDiscoveryService"
CLA_TYPE = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"


@dataclass
class _Subscription:
    """One stream's state: the names asked for (None: not asked yet) and what was sent last."""

    names: tuple[str, ...] | None = None
    node: str = "?"
    sent_names: tuple[str, ...] | None = None
    sent_version: str = ""
    nonce: int = 0
    refused: set[str] = field(default_factory=set)
    """Versions Envoy NACKed on this stream: not sent again."""

    def due(self, version: str) -> bool:
        """Whether a response must go out: names asked for and not answered yet, or a version not sent."""
        if self.names is None or version in self.refused:
            return False
        return self.names != self.sent_names or version != self.sent_version


class EdsService:
    """Serves the datastore's endpoints to any number of Envoys; :meth:`handler` goes on a grpc.aio server."""

    def __init__(self, datastore: Datastore, default_name: str) -> None:
        self.datastore = datastore
        self.default_name = default_name
        self._epoch = secrets.token_hex(4)
        self._changes = 0
        self._changed = asyncio.Event()
        self._skipped: set[str] = set()
        datastore.subscribe(self._on_change)

    @property
    def version(self) -> str:
        """The version of the current endpoint set."""
        return f"{self._epoch}-{self._changes}"

    def _on_change(self, added: list[Endpoint], removed: list[Endpoint]) -> None:
        self._changes += 1
        self._changed.set()
        self._changed = asyncio.Event()  # later waiters wait for the next change

    def load_assignment(self, name: str) -> endpoint_pb2.ClusterLoadAssignment:
        """The pool's endpoints as cluster ``name``'s assignment (one locality, IP endpoints only)."""
        cla = endpoint_pb2.ClusterLoadAssignment(cluster_name=name)
        group = cla.endpoints.add()
        for ep in self.datastore.endpoints():
            if not _is_ip(ep.address):
                self._skip(ep)
                continue
            address = group.lb_endpoints.add().endpoint.address.socket_address
            address.address = ep.address
            address.port_value = ep.port
        return cla

    def _skip(self, ep: Endpoint) -> None:
        if ep.hostport not in self._skipped:  # once per address, not once per push
            self._skipped.add(ep.hostport)
            log.warning("EDS: endpoint %s (%s) is left out: Envoy takes only IP addresses in EDS", ep.name,
                        ep.hostport)

    def _response(self, sub: _Subscription) -> discovery_pb2.DiscoveryResponse:
        assert sub.names is not None
        sub.nonce += 1
        sub.sent_names, sub.sent_version = sub.names, self.version
        response = discovery_pb2.DiscoveryResponse(version_info=sub.sent_version, type_url=CLA_TYPE,
                                                   nonce=str(sub.nonce))
        for name in sub.names or (self.default_name,):
            response.resources.add().Pack(self.load_assignment(name))
        return response

    async def stream_endpoints(self, requests: AsyncIterator[discovery_pb2.DiscoveryRequest],
                               context: grpc.aio.ServicerContext) -> AsyncIterator[discovery_pb2.DiscoveryResponse]:
        """The ``StreamEndpoints`` RPC: reads requests in a task, sends whenever :meth:`_Subscription.due`."""
        sub = _Subscription()
        asked = asyncio.Event()
        reader = asyncio.ensure_future(self._read(requests, sub, asked))
        try:
            while True:
                changed = self._changed  # both taken before looking, so nothing that happens meanwhile is missed
                asked.clear()
                if sub.due(self.version):
                    yield self._response(sub)
                    continue
                if reader.done():
                    reader.result()  # Envoy closed its side (or the read failed): end the call
                    return
                waits = [asyncio.ensure_future(changed.wait()), asyncio.ensure_future(asked.wait())]
                try:
                    await asyncio.wait([*waits, reader], return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for wait in waits:
                        wait.cancel()
        finally:
            reader.cancel()

    async def _read(self, requests: AsyncIterator[discovery_pb2.DiscoveryRequest], sub: _Subscription,
                    asked: asyncio.Event) -> None:
        async for request in requests:
            if request.type_url and request.type_url != CLA_TYPE:
                log.warning("EDS: ignoring a request for %s (this stream serves %s)", request.type_url, CLA_TYPE)
                continue
            if request.HasField("node"):  # Envoy sends it on the first request only
                sub.node = request.node.id or sub.node
            if request.response_nonce and request.response_nonce != str(sub.nonce):
                continue  # stale: answers a response that a newer one replaced
            if request.HasField("error_detail"):
                sub.refused.add(sub.sent_version)
                log.warning("EDS: Envoy (node %s) refused version %s: %s", sub.node, sub.sent_version,
                            request.error_detail.message)
            sub.names = tuple(request.resource_names)
            asked.set()

    def handler(self) -> grpc.GenericRpcHandler:
        """The generic handler to add to a ``grpc.aio`` server."""
        method = grpc.stream_stream_rpc_method_handler(
            self.stream_endpoints, request_deserializer=discovery_pb2.DiscoveryRequest.FromString,
            response_serializer=discovery_pb2.DiscoveryResponse.SerializeToString)
        return grpc.method_handlers_generic_handler(EDS_SERVICE, {"StreamEndpoints": method})


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True
