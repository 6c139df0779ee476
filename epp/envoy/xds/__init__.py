"""EPP as Envoy's source of the pool's endpoints: an xDS server with the EDS service.

``epp serve --xds-port PORT`` runs :class:`XdsServer`; the bootstrap ``epp envoy-config`` writes (``--lb
override-host``, the default) makes the pool an EDS cluster fed by it, so that the hosts EPP names in ``envoy.lb``
are cluster members, which Envoy's ``override_host`` load-balancing policy needs to walk EPP's fallbacks on
retries. :mod:`epp.envoy.xds.eds` is the service, :mod:`epp.envoy.xds.server` its grpc.aio server.
"""

from __future__ import annotations

from epp.envoy.xds.eds import CLA_TYPE, EDS_SERVICE, EdsService
from epp.envoy.xds.server import XdsServer

__all__ = ["XdsServer", "EdsService", "EDS_SERVICE", "CLA_TYPE"]
