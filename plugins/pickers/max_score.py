"""``max-score-picker`` (the default picker): the highest total score wins; ties are broken at random.

Algorithm (reference): shuffle the candidates, stable-sort them by score descending, take the first
``maxNumOfEndpoints`` (target first, then fallbacks). With ``maxNumOfEndpoints: 1`` it takes a uniform random
choice among the endpoints sharing the top score, which is the same distribution without the sort.

YAML::

    - type: max-score-picker
      parameters:
        maxNumOfEndpoints: 1
"""

from __future__ import annotations

import random
from typing import ClassVar

from pydantic import Field

from epp.framework import CycleState, Handle, Params, Picker, ProfileRunResult, ScoredEndpoint
from epp.request import InferenceRequest

__all__ = ["MaxScorePicker", "PickerParams"]


class PickerParams(Params):
    """``maxNumOfEndpoints``: how many endpoints a pick returns (the first is the target)."""

    max_num_of_endpoints: int = Field(1, alias="maxNumOfEndpoints", ge=1)


class MaxScorePicker:
    """Top ``maxNumOfEndpoints`` by score, ties in random order; ``rng`` is injectable for tests."""

    type_name: ClassVar[str] = "max-score-picker"
    Params = PickerParams

    def __init__(self, name: str, params: PickerParams, handle: Handle, *,
                 rng: random.Random | None = None) -> None:
        self.name = name
        self.params = params
        self.rng = rng or random.Random()
        self._n = params.max_num_of_endpoints

    def pick(self, cycle: CycleState, request: InferenceRequest, scored: list[ScoredEndpoint]) -> ProfileRunResult:
        if not scored:
            return ProfileRunResult([])
        if self._n == 1:
            best = max(s.score for s in scored)
            top = [s.endpoint for s in scored if s.score == best]
            return ProfileRunResult([top[0] if len(top) == 1 else self.rng.choice(top)])
        order = list(scored)
        self.rng.shuffle(order)
        order.sort(key=lambda s: s.score, reverse=True)
        return ProfileRunResult([s.endpoint for s in order[:self._n]])


_check: type[Picker] = MaxScorePicker
