"""``XdsServer``: EPP's xDS port, a grpc.aio server with the EDS service (:mod:`epp.envoy.xds.eds`).

Usage (what ``epp serve --xds-port`` does)::

    server = XdsServer(datastore, port=18000, key_pair=pair)    # pair None: plaintext
    await server.start()                                         # binds; .port is set
    ...
    await server.stop()                                          # ends the streams; Envoy keeps the last endpoints

It carries a handful of long-lived streams (one per Envoy), so grpc.aio's cost per message does not matter here;
the number of concurrent streams is bounded, and keepalive pings drop the streams of Envoys that vanished.
"""

from __future__ import annotations

import logging

import grpc

from epp.datalayer.datastore import Datastore
from epp.envoy.clusters import POOL_CLUSTER
from epp.envoy.xds.eds import EdsService
from epp.extproc.tls import KeyPair

__all__ = ["XdsServer", "MAX_STREAMS"]

log = logging.getLogger("epp.envoy.xds")

MAX_STREAMS = 256
"""Concurrent xDS streams (one per Envoy); more are refused with RESOURCE_EXHAUSTED."""
_OPTIONS = [("grpc.so_reuseport", 0), ("grpc.keepalive_time_ms", 60_000), ("grpc.keepalive_timeout_ms", 20_000)]


class XdsServer:
    """The EDS service for ``datastore`` on ``host:port`` (0: a free port, read :attr:`port` after :meth:`start`),
    over TLS with ``key_pair`` or plaintext without one. Envoy asks for cluster ``cluster_name``."""

    def __init__(self, datastore: Datastore, *, host: str = "0.0.0.0", port: int = 18000,
                 key_pair: KeyPair | None = None, cluster_name: str = POOL_CLUSTER) -> None:
        self.eds = EdsService(datastore, cluster_name)
        self.host, self.port, self.key_pair = host, port, key_pair
        self._server: grpc.aio.Server | None = None

    async def start(self) -> None:
        """Bind and serve (``RuntimeError`` if the port cannot be bound)."""
        server = grpc.aio.server(options=_OPTIONS, maximum_concurrent_rpcs=MAX_STREAMS)
        server.add_generic_rpc_handlers([self.eds.handler()])
        address = f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"
        if self.key_pair is None:
            bound = server.add_insecure_port(address)
        else:
            bound = server.add_secure_port(address, grpc.ssl_server_credentials(
                [(self.key_pair.key_pem, self.key_pair.cert_pem)]))
        if bound == 0:
            raise RuntimeError(f"cannot bind the xDS port {address}")
        self.port = bound
        await server.start()
        self._server = server
        log.info("xDS (EDS) listening on %s:%d (%s)", self.host, self.port,
                 "plaintext" if self.key_pair is None else "TLS")

    async def stop(self) -> None:
        """End every stream at once: Envoy keeps the endpoints it has and reconnects to the next EPP."""
        if self._server is not None:
            await self._server.stop(0)
            self._server = None
