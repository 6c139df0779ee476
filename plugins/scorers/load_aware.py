"""``load-aware-scorer`` (llm-d): half credit for an empty queue, less as the queue grows to ``threshold``.

Formula (``q`` = scraped waiting queue, ``T`` = ``threshold``)::

    score = 0.5                          if q == 0
            0.5 * (1 - min(q, T) / T)    otherwise

``threshold`` 0 or less means 128, with a warning (llm-d ``NewLoadAware``).

YAML::

    - type: load-aware-scorer
      parameters:
        threshold: 128
"""

from __future__ import annotations

from typing import ClassVar

from epp.framework.endpoint import Endpoint
from epp.framework.plugins import CycleState, Handle, Scorer
from epp.framework.plugins import Params as PluginParams
from epp.framework.request import InferenceRequest

from ..fallback import fall_back

__all__ = ["LoadAwareScorer"]


class LoadAwareScorer:
    """0.5 for an empty queue, falling linearly to 0 at ``threshold`` waiting requests."""

    type_name: ClassVar[str] = "load-aware-scorer"

    class Params(PluginParams):
        threshold: int = 128

    def __init__(self, name: str, params: Params, handle: Handle) -> None:
        self.name = name
        self.params = params
        self._threshold = fall_back(self, "threshold", params.threshold, 128, params.threshold > 0)

    def score(self, cycle: CycleState, request: InferenceRequest, endpoints: list[Endpoint]) -> list[float]:
        t = self._threshold
        out: list[float] = []
        for ep in endpoints:
            q = ep.metrics.waiting
            out.append(0.5 if q <= 0 else 0.5 * (1.0 - min(q, t) / t))
        return out


_check: type[Scorer] = LoadAwareScorer
