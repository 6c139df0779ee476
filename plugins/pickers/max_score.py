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

from typing import ClassVar

from epp.framework.plugins import CycleState, Picker, ProfileRunResult, ScoredEndpoint
from epp.framework.request import InferenceRequest

from .base import PickerParams, RandomizedPicker

__all__ = ["MaxScorePicker", "PickerParams"]


class MaxScorePicker(RandomizedPicker):
    """Top ``maxNumOfEndpoints`` by score, ties in random order; ``rng`` is injectable for tests."""

    type_name: ClassVar[str] = "max-score-picker"
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
