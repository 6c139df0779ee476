"""``kv-cache-utilization-scorer`` (v0.3.0 name ``kv-cache-scorer``): prefers endpoints with free KV cache.

Formula (``u`` = scraped ``vllm:kv_cache_usage_perc``, 0..1)::

    score = 1 - u

YAML::

    - type: kv-cache-utilization-scorer
"""

from __future__ import annotations

from typing import ClassVar

from epp.framework.endpoint import Endpoint
from epp.framework.plugins import CycleState, Handle, NoParams, Scorer
from epp.framework.request import InferenceRequest

__all__ = ["KvCacheUtilizationScorer"]


class KvCacheUtilizationScorer:
    """``1 - kv_usage`` per endpoint (the scheduler clamps a usage above 1 to a score of 0)."""

    type_name: ClassVar[str] = "kv-cache-utilization-scorer"
    Params = NoParams

    def __init__(self, name: str, params: NoParams, handle: Handle) -> None:
        self.name = name
        self.params = params

    def score(self, cycle: CycleState, request: InferenceRequest, endpoints: list[Endpoint]) -> list[float]:
        return [1.0 - ep.metrics.kv_usage for ep in endpoints]


_check: type[Scorer] = KvCacheUtilizationScorer
