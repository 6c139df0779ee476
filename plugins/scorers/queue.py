"""``queue-scorer``: prefers endpoints with shorter waiting queues (the reference's ``queue-scorer``).

Formula, over the candidates of one cycle (``q`` = scraped ``vllm:num_requests_waiting``)::

    score = (max_q - q) / (max_q - min_q)        # 1.0 for every endpoint when all queues are equal

Scores use the latest scrape whatever its age (staleness is the saturation detector's business).

YAML::

    - type: queue-scorer
"""

from __future__ import annotations

from typing import ClassVar

from epp.framework.endpoint import Endpoint
from epp.framework.plugins import CycleState, Handle, NoParams, Scorer
from epp.framework.request import InferenceRequest

__all__ = ["QueueScorer", "min_max_scores"]


def min_max_scores(values: list[int]) -> list[float]:
    """``(max - v) / (max - min)`` for each value: the smallest gets 1, the largest 0; all 1.0 if all equal."""
    if not values:
        return []
    hi, lo = max(values), min(values)
    if hi == lo:
        return [1.0] * len(values)
    span = hi - lo
    return [(hi - v) / span for v in values]


class QueueScorer:
    """Min-max normalised waiting-queue length: the shortest queue among the candidates scores 1."""

    type_name: ClassVar[str] = "queue-scorer"
    Params = NoParams

    def __init__(self, name: str, params: NoParams, handle: Handle) -> None:
        self.name = name
        self.params = params

    def score(self, cycle: CycleState, request: InferenceRequest, endpoints: list[Endpoint]) -> list[float]:
        return min_max_scores([ep.metrics.waiting for ep in endpoints])


_check: type[Scorer] = QueueScorer
