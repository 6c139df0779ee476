"""``slo-headroom-tier-filter``: keeps the candidates predicted to meet the request's SLOs, exploring the others now
and then.

Reads the per-endpoint predictions of ``predicted-latency-producer`` (:func:`epp.latency.predictions_of`) and splits
the candidates into two tiers::

    keep all   if len(endpoints) <= 1, or no candidate has a prediction
    positive = candidates whose TTFT and TPOT headroom are both >= 0 (validity flags are not read: an invalid
               prediction has a negative headroom by the producer's convention)
    negative = every other candidate, those without a prediction included (their SLO cannot be confirmed)
    both tiers non-empty: keep negative with probability epsilonExploreNeg, else positive
    one tier empty: keep the other

The kept tier stays in candidate order; the draws come from the plugin's own ``random.Random``.

YAML::

    - type: slo-headroom-tier-filter
      parameters:
        epsilonExploreNeg: 0.01
"""

from __future__ import annotations

import random
from typing import Any, ClassVar

from pydantic import Field

from epp.framework.endpoint import Endpoint
from epp.framework.plugins import CycleState, Filter, Handle
from epp.framework.plugins import Params as PluginParams
from epp.framework.request import InferenceRequest
from epp.latency import PRODUCER_TYPE, predictions_of

from ..latency_reader import check_latency_producer_name

__all__ = ["SloHeadroomTierFilter"]


class SloHeadroomTierFilter:
    """A Filter: keeps the candidates with non-negative predicted TTFT and TPOT headroom, or (with probability
    ``epsilonExploreNeg``, or when there are none) the rest; keeps all when no candidate has a prediction. Never
    empties a non-empty candidate list."""

    type_name: ClassVar[str] = "slo-headroom-tier-filter"
    consumes: ClassVar[tuple[str, ...]] = (PRODUCER_TYPE,)

    class Params(PluginParams):
        epsilon_explore_neg: float = Field(0.01, alias="epsilonExploreNeg", ge=0.0, le=1.0)
        latency_prediction_info_producer_name: str | None = Field(None, alias="latencyPredictionInfoProducerName")

    def __init__(self, name: str, params: Params, handle: Handle, *, rng: random.Random | None = None) -> None:
        self.name = name
        self.params = params
        self.rng = rng if rng is not None else random.Random()
        self._explore = params.epsilon_explore_neg

    @classmethod
    def producer_params(cls, params: Any) -> dict[str, Any]:
        """No producer parameters of its own: an auto-created producer uses its defaults."""
        return {}

    def bind(self, handle: Handle) -> None:
        """Check ``latencyPredictionInfoProducerName``."""
        check_latency_producer_name(self, handle, self.params.latency_prediction_info_producer_name)

    def filter(self, cycle: CycleState, request: InferenceRequest, endpoints: list[Endpoint]) -> list[Endpoint]:
        if len(endpoints) <= 1:
            return endpoints
        predictions = predictions_of(cycle)
        positive: list[Endpoint] = []
        negative: list[Endpoint] = []
        predicted = False
        for ep in endpoints:
            info = predictions.get(ep.name)
            predicted = predicted or info is not None
            meets = info is not None and info.ttft_headroom >= 0 and info.tpot_headroom >= 0
            (positive if meets else negative).append(ep)
        if not predicted:
            return endpoints
        if positive and negative:
            explore = self._explore > 0 and self.rng.random() < self._explore
            return negative if explore else positive
        return positive or negative


_check: type[Filter] = SloHeadroomTierFilter
