"""``random-picker``: ignores scores and picks uniformly at random.

Algorithm (reference): shuffle the candidates and take the first ``maxNumOfEndpoints``.

YAML::

    - type: random-picker
      parameters:
        maxNumOfEndpoints: 1
"""

from __future__ import annotations

from typing import ClassVar

from epp.framework.plugins import CycleState, Picker, ProfileRunResult, ScoredEndpoint
from epp.framework.request import InferenceRequest

from .base import RandomizedPicker

__all__ = ["RandomPicker"]


class RandomPicker(RandomizedPicker):
    """``maxNumOfEndpoints`` distinct endpoints in uniformly random order."""

    type_name: ClassVar[str] = "random-picker"
    def pick(self, cycle: CycleState, request: InferenceRequest, scored: list[ScoredEndpoint]) -> ProfileRunResult:
        if not scored:
            return ProfileRunResult([])
        if self._n == 1:
            return ProfileRunResult([self.rng.choice(scored).endpoint])
        chosen = self.rng.sample(scored, min(self._n, len(scored)))
        return ProfileRunResult([s.endpoint for s in chosen])


_check: type[Picker] = RandomPicker
