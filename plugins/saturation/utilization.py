"""``utilization-detector``: pool saturation from scraped queue depth and KV-cache use (the reference's default).

Saturation (the flow-control and legacy-admission signal) over the candidate endpoints::

    credit      = max(0, inflight_requests - (waiting + running))   # requests the last scrape has not seen yet
    per endpoint: max((waiting + credit) / queueDepthThreshold, kv_usage / kvCacheUtilThreshold)
                  = 1.0 if its metrics are older than metricsStalenessThreshold (or were never scraped)
    saturation  = mean over endpoints;  1.0 when there are no endpoints

As a Filter it keeps endpoints with fresh metrics, ``waiting < queueDepthThreshold·(1+headroom)`` and
``kv_usage < kvCacheUtilThreshold·(1+headroom)``; if none qualifies it keeps them all.

YAML::

    plugins:
    - type: utilization-detector
      parameters: {queueDepthThreshold: 5, kvCacheUtilThreshold: 0.8, metricsStalenessThreshold: 200ms, headroom: 0,
                   inFlightLoadProducerName: inflight-load-producer}   # the last is optional
    saturationDetector: {pluginRef: utilization-detector}
"""

from __future__ import annotations

import time
from typing import Callable, ClassVar, Sequence

from pydantic import Field

from epp.config.units import Duration
from epp.framework.endpoint import Endpoint
from epp.framework.plugins import CycleState, Filter, Handle, SaturationDetector
from epp.framework.plugins import Params as PluginParams
from epp.framework.request import InferenceRequest

from ..producers.inflight_load import check_load_producer_name

__all__ = ["UtilizationDetector"]


class UtilizationDetector:
    """Queue/KV roofline saturation detector and filter; ``clock`` must match ``Metrics.update_time``."""

    type_name: ClassVar[str] = "utilization-detector"

    class Params(PluginParams):
        queue_depth_threshold: int = Field(5, alias="queueDepthThreshold", gt=0)
        kv_cache_util_threshold: float = Field(0.8, alias="kvCacheUtilThreshold", gt=0, le=1)
        metrics_staleness_threshold: Duration = Field(0.2, alias="metricsStalenessThreshold", gt=0)
        headroom: float = Field(0.0, ge=0)
        in_flight_load_producer_name: str | None = Field(None, alias="inFlightLoadProducerName")

    def __init__(self, name: str, params: Params, handle: Handle | None = None, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.name = name
        self.params = params
        self.clock = clock

    def bind(self, handle: Handle) -> None:
        check_load_producer_name(self, handle, self.params.in_flight_load_producer_name)

    def _fresh(self, endpoint: Endpoint, now: float) -> bool:
        return endpoint.metrics.age(now) <= self.params.metrics_staleness_threshold

    def saturation(self, endpoints: Sequence[Endpoint]) -> float:
        """Mean per-endpoint saturation, queue term corrected by unscraped in-flight requests (stale endpoints
        count 1.0; no endpoints: 1.0)."""
        if not endpoints:
            return 1.0
        p, now, total = self.params, self.clock(), 0.0
        for ep in endpoints:
            if not self._fresh(ep, now):
                total += 1.0
                continue
            m = ep.metrics
            credit = max(0, ep.inflight_requests - (m.waiting + m.running))
            total += max((m.waiting + credit) / p.queue_depth_threshold, m.kv_usage / p.kv_cache_util_threshold)
        return total / len(endpoints)

    def filter(self, cycle: CycleState, request: InferenceRequest, endpoints: list[Endpoint]) -> list[Endpoint]:
        """Fresh endpoints under both thresholds (with headroom); all endpoints if none is."""
        p, now = self.params, self.clock()
        q_limit = p.queue_depth_threshold * (1.0 + p.headroom)
        kv_limit = p.kv_cache_util_threshold * (1.0 + p.headroom)
        kept = [ep for ep in endpoints
                if self._fresh(ep, now) and ep.metrics.waiting < q_limit and ep.metrics.kv_usage < kv_limit]
        return kept or endpoints


_check_detector: type[SaturationDetector] = UtilizationDetector
_check_filter: type[Filter] = UtilizationDetector
