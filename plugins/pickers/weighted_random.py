"""``weighted-random-picker``: picks at random with probability proportional to score (A-Res sampling).

Algorithm (reference, Efraimidis-Spirakis A-Res)::

    key_i = U_i ** (1 / score_i)    with U_i uniform in (0, 1); key 0 when score_i <= 0
    take the maxNumOfEndpoints largest keys (target first)
    if no score is > 0: behave as random-picker

For one endpoint this picks endpoint i with probability score_i / sum(scores).

YAML::

    - type: weighted-random-picker
      parameters:
        maxNumOfEndpoints: 1
"""

from __future__ import annotations

from typing import ClassVar

from epp.framework.plugins import CycleState, Picker, ProfileRunResult, ScoredEndpoint
from epp.framework.request import InferenceRequest

from .base import RandomizedPicker

__all__ = ["WeightedRandomPicker"]


class WeightedRandomPicker(RandomizedPicker):
    """A-Res weighted sampling without replacement over the scored candidates."""

    type_name: ClassVar[str] = "weighted-random-picker"
    def pick(self, cycle: CycleState, request: InferenceRequest, scored: list[ScoredEndpoint]) -> ProfileRunResult:
        rng = self.rng
        if not any(s.score > 0 for s in scored):
            if not scored:
                return ProfileRunResult([])
            return ProfileRunResult([s.endpoint for s in rng.sample(scored, min(self._n, len(scored)))])
        keyed: list[tuple[float, int]] = []
        for i, s in enumerate(scored):
            if s.score <= 0:
                keyed.append((0.0, i))
            else:
                u = rng.random() or 1e-10
                keyed.append((u ** (1.0 / s.score), i))
        keyed.sort(reverse=True)
        return ProfileRunResult([scored[i].endpoint for _, i in keyed[:self._n]])


_check: type[Picker] = WeightedRandomPicker
