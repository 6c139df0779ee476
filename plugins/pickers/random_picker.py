"""``random-picker``: ignores scores and picks uniformly at random.

Algorithm (reference): shuffle the candidates and take the first ``maxNumOfEndpoints``.

YAML::

    - type: random-picker
      parameters:
        maxNumOfEndpoints: 1
"""

from __future__ import annotations

import random
from typing import ClassVar

from epp.framework import CycleState, Handle, Picker, ProfileRunResult, ScoredEndpoint
from epp.request import InferenceRequest

from .max_score import PickerParams

__all__ = ["RandomPicker"]


class RandomPicker:
    """``maxNumOfEndpoints`` distinct endpoints in uniformly random order."""

    type_name: ClassVar[str] = "random-picker"
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
            return ProfileRunResult([self.rng.choice(scored).endpoint])
        chosen = self.rng.sample(scored, min(self._n, len(scored)))
        return ProfileRunResult([s.endpoint for s in chosen])


_check: type[Picker] = RandomPicker
