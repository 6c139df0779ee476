"""``running-requests-size-scorer``: prefers endpoints running fewer requests (the reference's scorer).

Formula, over the candidates (``r`` = scraped ``vllm:num_requests_running``)::

    score = (max_r - r) / (max_r - min_r)        # 1.0 for every endpoint when all are equal

YAML::

    - type: running-requests-size-scorer
"""

from __future__ import annotations

from typing import ClassVar

from epp.framework.endpoint import Endpoint
from epp.framework.plugins import CycleState, Handle, NoParams, Scorer
from epp.framework.request import InferenceRequest

from .queue import min_max_scores

__all__ = ["RunningRequestsSizeScorer"]


class RunningRequestsSizeScorer:
    """Min-max normalised running-batch size: the least busy candidate scores 1."""

    type_name: ClassVar[str] = "running-requests-size-scorer"
    Params = NoParams

    def __init__(self, name: str, params: NoParams, handle: Handle) -> None:
        self.name = name
        self.params = params

    def score(self, cycle: CycleState, request: InferenceRequest, endpoints: list[Endpoint]) -> list[float]:
        return min_max_scores([ep.metrics.running for ep in endpoints])


_check: type[Scorer] = RunningRequestsSizeScorer
