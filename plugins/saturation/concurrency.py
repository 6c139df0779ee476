"""``concurrency-detector``: pool saturation from EPP's own in-flight counts (no scrape lag).

Saturation over the candidate endpoints (``concurrencyMode: requests`` counts requests, ``tokens`` counts the
estimated tokens the ``inflight-load-producer`` booked, ``hybrid`` takes the larger of the two ratios)::

    saturation = Σ inflight / (len(endpoints) · maxConcurrency)      # or maxTokenConcurrency; 1.0 if empty

As a Filter it keeps endpoints with ``inflight < int(max·(1+headroom))`` (both limits in ``hybrid``) and has **no**
fallback: the result may be empty, which fails the profile.

YAML::

    plugins:
    - type: concurrency-detector
      parameters: {concurrencyMode: requests, maxConcurrency: 100, maxTokenConcurrency: 1000000, headroom: 0.2}
    saturationDetector: {pluginRef: concurrency-detector}
"""

from __future__ import annotations

from typing import ClassVar, Literal, Sequence

from pydantic import Field

from epp.framework.endpoint import Endpoint
from epp.framework.plugins import CycleState, Filter, Handle, SaturationDetector
from epp.framework.plugins import Params as PluginParams
from epp.framework.request import InferenceRequest

from ..producers.inflight_load import check_load_producer_name

__all__ = ["ConcurrencyDetector"]


class ConcurrencyDetector:
    """In-flight requests (or tokens) against a per-endpoint capacity."""

    type_name: ClassVar[str] = "concurrency-detector"

    class Params(PluginParams):
        concurrency_mode: Literal["requests", "tokens", "hybrid"] = Field("requests", alias="concurrencyMode")
        max_concurrency: int = Field(100, alias="maxConcurrency", gt=0)
        max_token_concurrency: int = Field(1_000_000, alias="maxTokenConcurrency", gt=0)
        headroom: float = Field(0.0, ge=0)
        in_flight_load_producer_name: str | None = Field(None, alias="inFlightLoadProducerName")

    def __init__(self, name: str, params: Params, handle: Handle | None = None) -> None:
        self.name = name
        self.params = params
        mode = params.concurrency_mode
        # (counts tokens, capacity) per evaluated dimension; hybrid evaluates both
        self._dims = [(tokens, params.max_token_concurrency if tokens else params.max_concurrency)
                      for tokens in ((False, True) if mode == "hybrid" else (mode == "tokens",))]
        self._limits = [(tokens, int(cap * (1.0 + params.headroom))) for tokens, cap in self._dims]

    def bind(self, handle: Handle) -> None:
        check_load_producer_name(self, handle, self.params.in_flight_load_producer_name)

    @staticmethod
    def _load(endpoint: Endpoint, tokens: bool) -> int:
        return endpoint.inflight_tokens if tokens else endpoint.inflight_requests

    def saturation(self, endpoints: Sequence[Endpoint]) -> float:
        """Σ in-flight / Σ capacity over ``endpoints`` (1.0 when there are none); the larger ratio in hybrid."""
        if not endpoints:
            return 1.0
        return max(sum(self._load(ep, tokens) for ep in endpoints) / (cap * len(endpoints))
                   for tokens, cap in self._dims)

    def filter(self, cycle: CycleState, request: InferenceRequest, endpoints: list[Endpoint]) -> list[Endpoint]:
        """Endpoints below ``int(capacity·(1+headroom))`` in every evaluated dimension; may be empty."""
        return [ep for ep in endpoints if all(self._load(ep, tokens) < limit for tokens, limit in self._limits)]


_check_detector: type[SaturationDetector] = ConcurrencyDetector
_check_filter: type[Filter] = ConcurrencyDetector
