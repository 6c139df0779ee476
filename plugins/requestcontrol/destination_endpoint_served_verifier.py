"""``destination-endpoint-served-verifier`` (the reference's conformance-test hook): tells the client which
endpoint the proxy reports it served the request from, in the ``x-conformance-test-served-endpoint`` response
header.

When the answer's headers arrive it sets that header to the served ``host:port`` the proxy reported
(:attr:`~epp.framework.plugins.ResponseHeaders.served`: behind Envoy the ``envoy.lb`` served-endpoint metadata, which a
conforming gateway sends, else the ``upstream.address`` attribute ``epp envoy-config`` asks for; in EPP's HTTP
gateway the endpoint it proxied to). Without one it writes the reference's failure text,
``fail: missing envoy lb metadata`` (no ``envoy.lb`` metadata at all) or ``fail: missing destination endpoint
served metadata``, so a conformance check that compares the header with the endpoint it selected fails. The value
is the proxy's report, never EPP's own pick. No parameters; for test configs (with ``header-based-testing-filter``).

YAML::

    - type: destination-endpoint-served-verifier
"""

from __future__ import annotations

from typing import ClassVar

from epp.framework.endpoint import Endpoint
from epp.framework.plugins import Handle, NoParams, ResponseHeaderProcessor, ResponseHeaders
from epp.framework.request import InferenceRequest

__all__ = ["DestinationEndpointServedVerifier", "RESULT_HEADER", "MISSING_LB", "MISSING_SERVED"]

RESULT_HEADER = "x-conformance-test-served-endpoint"
MISSING_LB = "fail: missing envoy lb metadata"
MISSING_SERVED = "fail: missing destination endpoint served metadata"


class DestinationEndpointServedVerifier:
    """Copies the proxy's served endpoint into ``x-conformance-test-served-endpoint`` on every answer."""

    type_name: ClassVar[str] = "destination-endpoint-served-verifier"
    Params = NoParams

    def __init__(self, name: str, params: NoParams, handle: Handle) -> None:
        self.name = name
        self.params = params

    def response_header(self, request: InferenceRequest, response: ResponseHeaders, endpoint: Endpoint) -> None:
        if response.served:
            value = response.served
        elif "envoy.lb" not in response.metadata:
            value = MISSING_LB
        else:
            value = MISSING_SERVED
        response.headers[RESULT_HEADER] = value


_check: type[ResponseHeaderProcessor] = DestinationEndpointServedVerifier
