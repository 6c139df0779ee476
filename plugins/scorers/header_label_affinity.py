"""``header-label-affinity-scorer`` (Alpha): soft affinity for endpoints whose label equals a header.

Formula (``h`` = the request's ``headerName`` header, ``l`` = the endpoint's ``labelKey`` pod label)::

    score = 1.0   if h is present and non-empty and l == h
            0.0   otherwise (no header, an unknown value, or no such label: the endpoint stays eligible)

With ``stampResponseHeader`` (default true) it also copies the label of the endpoint that served the request into
the client's response under ``headerName``, so a coordinator can pass it on to a later request. Use one instance per
header-to-label mapping, each with its own profile weight.

YAML::

    - type: header-label-affinity-scorer
      name: slice-affinity
      parameters:
        headerName: x-disagg-slice
        labelKey: disaggregatedset.x-k8s.io/slice
        stampResponseHeader: true      # default; false when the header is input-only
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from epp.framework.endpoint import Endpoint
from epp.framework.plugins import CycleState, Handle, ResponseHeaderProcessor, ResponseHeaders, Scorer
from epp.framework.plugins import Params as PluginParams
from epp.framework.request import InferenceRequest

__all__ = ["HeaderLabelAffinityScorer"]


class HeaderLabelAffinityScorer:
    """1 for endpoints whose ``labelKey`` label equals the ``headerName`` header, else 0; stamps the served one's
    label back."""

    type_name: ClassVar[str] = "header-label-affinity-scorer"

    class Params(PluginParams):
        header_name: str = Field(alias="headerName", min_length=1)
        label_key: str = Field(alias="labelKey", min_length=1)
        stamp_response_header: bool = Field(True, alias="stampResponseHeader")

    def __init__(self, name: str, params: Params, handle: Handle) -> None:
        self.name = name
        self.params = params
        self.header = params.header_name.lower()
        self.label = params.label_key

    def score(self, cycle: CycleState, request: InferenceRequest, endpoints: list[Endpoint]) -> list[float]:
        wanted = request.headers.get(self.header) or ""
        if not wanted:
            return [0.0] * len(endpoints)
        label = self.label
        return [1.0 if ep.labels.get(label) == wanted else 0.0 for ep in endpoints]

    def response_header(self, request: InferenceRequest, response: ResponseHeaders, endpoint: Endpoint) -> None:
        """Stamp the serving endpoint's label under ``headerName`` (when enabled and the endpoint has it)."""
        if not self.params.stamp_response_header:
            return
        value = endpoint.labels.get(self.label)
        if value:
            response.headers[self.header] = value


_check: type[Scorer] = HeaderLabelAffinityScorer
_check_hook: type[ResponseHeaderProcessor] = HeaderLabelAffinityScorer
