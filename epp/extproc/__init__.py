"""EPP's Envoy ext_proc service: the Endpoint Picker protocol over ``envoy.service.ext_proc.v3``.

:class:`ExtProcServer` serves it (with the gRPC health service) on EPP's own HTTP/2 transport
(:mod:`epp.extproc.h2.server`) or grpc.aio; :mod:`epp.extproc.stream` is the per-request state machine;
:mod:`epp.extproc.protocol` has the wire names and message builders; :mod:`epp.runtime.workers` runs several EPP
processes that share in-flight counts, the prefix index and scraped metrics.
"""

from __future__ import annotations

from epp.extproc.protocol import (
                       DESTINATION_HEADER,
                       LB_NAMESPACE,
                       MAX_CHUNK,
                       METHOD_PATH,
                       PREFILLER_HEADER,
                       PRIMARY_KEY,
                       SERVED_HEADER,
                       SERVICE_NAME,
                       SUBSET_HEADER,
                       SUBSET_NAMESPACE,
)
from epp.extproc.server import DEFAULT_BODY_LIMIT, ExtProcServer, RequestMode, ResponseMode, Transport
from epp.extproc.tls import KeyPair, TlsFiles

__all__ = [
    "ExtProcServer", "RequestMode", "ResponseMode", "Transport", "TlsFiles", "KeyPair", "DEFAULT_BODY_LIMIT",
    "SERVICE_NAME", "METHOD_PATH", "DESTINATION_HEADER", "SERVED_HEADER", "SUBSET_HEADER", "SUBSET_NAMESPACE",
    "PREFILLER_HEADER", "PRIMARY_KEY", "LB_NAMESPACE", "MAX_CHUNK",
]
