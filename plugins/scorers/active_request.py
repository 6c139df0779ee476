"""``active-request-scorer``: prefers endpoints with fewer requests in flight from this EPP.

Formula (``c`` = :attr:`Endpoint.inflight_requests`, ``max_c`` = the largest ``c`` among the candidates)::

    score = 1.0                                   if c <= idleThreshold
            (max_c - c) / max_c * maxBusyScore    otherwise

In-flight counts are released when the response ends, however it ends. ``inFlightLoadProducerName`` names the
producer to read; it must be a configured ``inflight-load-producer``.

YAML::

    - type: active-request-scorer
      parameters:
        idleThreshold: 0
        maxBusyScore: 1.0
        inFlightLoadProducerName: inflight-load-producer   # optional
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from epp.framework.endpoint import Endpoint
from epp.framework.plugins import CycleState, Handle, Scorer
from epp.framework.plugins import Params as PluginParams
from epp.framework.request import InferenceRequest

from ..fallback import fall_back
from ..producers.inflight_load import check_load_producer_name

__all__ = ["ActiveRequestScorer"]


class ActiveRequestScorer:
    """Idle endpoints score 1; busy ones scale from ``maxBusyScore`` (least busy) down to 0 (busiest)."""

    type_name: ClassVar[str] = "active-request-scorer"

    class Params(PluginParams):
        idle_threshold: int = Field(0, alias="idleThreshold")
        max_busy_score: float = Field(1.0, alias="maxBusyScore")
        request_timeout: str | None = Field(None, alias="requestTimeout", description="accepted, ignored")
        in_flight_load_producer_name: str | None = Field(None, alias="inFlightLoadProducerName")

    def __init__(self, name: str, params: Params, handle: Handle) -> None:
        self.name = name
        self.params = params
        idle, busy = params.idle_threshold, params.max_busy_score
        self._idle = fall_back(self, "idleThreshold", idle, 0, idle >= 0)
        self._max_busy = fall_back(self, "maxBusyScore", busy, 1.0, 0.0 <= busy <= 1.0)

    def bind(self, handle: Handle) -> None:
        check_load_producer_name(self, handle, self.params.in_flight_load_producer_name)

    def score(self, cycle: CycleState, request: InferenceRequest, endpoints: list[Endpoint]) -> list[float]:
        counts = [ep.inflight_requests for ep in endpoints]
        top = max(counts, default=0)
        idle, busy = self._idle, self._max_busy
        return [1.0 if c <= idle else (top - c) / top * busy for c in counts]


_check: type[Scorer] = ActiveRequestScorer
