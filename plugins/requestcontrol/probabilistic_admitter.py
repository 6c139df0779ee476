"""``probabilistic-admitter``: sheds sheddable requests with a probability that climbs steeply with pool saturation.

Requests with priority >= 0 are always admitted, and so is every request when there are no candidate endpoints. A
sheddable request (priority < 0) is denied with probability::

    per endpoint: max(waiting / queueDepthThreshold, kv_usage / kvCacheUtilThreshold)
                  = 1.0 if it was never scraped (the reference's endpoint without metrics)
    saturation  = mean over the candidate endpoints
    p           = min(saturation ** power * k, 1.0)

A denial ends the request as every Admitter's does (500). It runs after the saturation gate (the legacy admission
or flow control); to let it make every shedding decision, neuter that gate, as the example below does.

YAML::

    apiVersion: llm-d.ai/v1
    kind: EndpointPickerConfig
    plugins:
    - type: probabilistic-admitter
      parameters: {queueDepthThreshold: 5, kvCacheUtilThreshold: 0.8, power: 5.0, k: 300.0}
    - type: random-picker
    - type: utilization-detector
      parameters: {queueDepthThreshold: 999999999, kvCacheUtilThreshold: 1.0}
    flowControl:
      saturationDetector: {pluginRef: utilization-detector}
    schedulingProfiles:
    - name: default
      plugins: [{pluginRef: random-picker}]
"""

from __future__ import annotations

import random
from typing import ClassVar, Sequence

from pydantic import Field

from epp.framework.endpoint import Endpoint
from epp.framework.plugins import Admitter, CycleState, Handle
from epp.framework.plugins import Params as PluginParams
from epp.framework.request import InferenceRequest

__all__ = ["ProbabilisticAdmitter", "shed_probability"]


def shed_probability(saturation: float, power: float, k: float) -> float:
    """The chance a sheddable request is denied at ``saturation``: ``min(saturation ** power * k, 1)``."""
    return min(saturation ** power * k, 1.0)


class ProbabilisticAdmitter:
    """An Admitter: never denies priority >= 0 or an empty candidate set; denies a sheddable request with
    probability :func:`shed_probability` of the candidates' mean roofline saturation. ``rng`` draws the decisions
    (a seeded ``random.Random`` makes them reproducible)."""

    type_name: ClassVar[str] = "probabilistic-admitter"

    class Params(PluginParams):
        queue_depth_threshold: int = Field(5, alias="queueDepthThreshold", gt=0)
        kv_cache_util_threshold: float = Field(0.8, alias="kvCacheUtilThreshold", gt=0)
        power: float = Field(5.0, gt=0)
        k: float = Field(300.0, gt=0)

    def __init__(self, name: str, params: Params, handle: Handle | None = None, *,
                 rng: random.Random | None = None) -> None:
        self.name = name
        self.params = params
        self.rng = rng if rng is not None else random.Random()

    def saturation(self, endpoints: Sequence[Endpoint]) -> float:
        """Mean per-endpoint roofline saturation; an endpoint never scraped counts 1.0 (``endpoints`` non-empty)."""
        p, total = self.params, 0.0
        for ep in endpoints:
            m = ep.metrics
            if m.update_time <= 0:
                total += 1.0
                continue
            total += max(m.waiting / p.queue_depth_threshold, m.kv_usage / p.kv_cache_util_threshold)
        return total / len(endpoints)

    def admit_request(self, request: InferenceRequest, endpoints: Sequence[Endpoint],
                      cycle: CycleState) -> str | None:
        """None to admit; for a denied sheddable request, the saturation and probability that denied it."""
        if not request.sheddable or not endpoints:
            return None
        saturation = self.saturation(endpoints)
        prob = shed_probability(saturation, self.params.power, self.params.k)
        if self.rng.random() < prob:
            return f"{self.type_name}: rejected, saturation={saturation:.3f} prob={prob:.2f}"
        return None


_check: type[Admitter] = ProbabilisticAdmitter
