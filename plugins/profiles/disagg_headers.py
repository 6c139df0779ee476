"""``disagg-headers-handler`` (v0.3.0 name ``prefill-header-handler``): tells the P/D sidecar where to prefill.

A PreRequest hook. When the prefill profile chose an endpoint it sets, on the upstream request,
``x-prefiller-host-port: <ip>:<port>`` (IPv6 bracketed); when the encode profile chose endpoints it sets
``x-encoder-hosts-ports: <ip:port>,<ip:port>...``. ``disagg-profile-handler`` does the same by itself, so this
plugin is only needed with the deprecated ``pd-profile-handler`` configs (and is harmless next to either).

YAML::

    - type: prefill-header-handler
      parameters:
        prefillProfile: prefill
        encodeProfile: encode
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from epp.framework.plugins import Handle, PreRequest, SchedulingResult
from epp.framework.plugins import Params as PluginParams
from epp.framework.request import InferenceRequest

__all__ = ["DisaggHeadersHandler", "PREFILL_HEADER", "ENCODER_HEADER", "set_disagg_headers"]

PREFILL_HEADER = "x-prefiller-host-port"
ENCODER_HEADER = "x-encoder-hosts-ports"


def set_disagg_headers(result: SchedulingResult, prefill_profile: str, encode_profile: str) -> None:
    """Write the prefill and encoder routing headers for whatever those profiles chose."""
    prefill = result.profile_results.get(prefill_profile)
    if prefill is not None and prefill.endpoints:
        result.headers[PREFILL_HEADER] = prefill.endpoints[0].hostport
    encode = result.profile_results.get(encode_profile)
    if encode is not None and encode.endpoints:
        result.headers[ENCODER_HEADER] = ",".join(ep.hostport for ep in encode.endpoints)


class DisaggHeadersHandler:
    """Sets ``x-prefiller-host-port`` / ``x-encoder-hosts-ports`` from the prefill / encode profile results."""

    type_name: ClassVar[str] = "disagg-headers-handler"

    class Params(PluginParams):
        prefill_profile: str = Field("prefill", alias="prefillProfile", min_length=1)
        encode_profile: str = Field("encode", alias="encodeProfile", min_length=1)

    def __init__(self, name: str, params: Params, handle: Handle) -> None:
        self.name = name
        self.params = params
        self._prefill = params.prefill_profile
        self._encode = params.encode_profile

    def pre_request(self, request: InferenceRequest, result: SchedulingResult) -> None:
        set_disagg_headers(result, self._prefill, self._encode)


_check: type[PreRequest] = DisaggHeadersHandler
