"""What every built-in picker shares: the ``maxNumOfEndpoints`` parameter and an injectable random source."""

from __future__ import annotations

import random

from pydantic import Field

from epp.framework.plugins import Handle, Params

from ..fallback import fall_back

__all__ = ["PickerParams", "RandomizedPicker"]


class PickerParams(Params):
    """``maxNumOfEndpoints``: how many endpoints a pick returns (the first is the target); 0 or less means 1,
    with a warning (llm-d ``NewMaxScorePicker``/``NewRandomPicker``/``NewWeightedRandomPicker``)."""

    max_num_of_endpoints: int = Field(1, alias="maxNumOfEndpoints")


class RandomizedPicker:
    """Base for pickers: stores ``name``/``params``, the count ``_n`` and ``rng`` (seedable in tests)."""

    Params = PickerParams

    def __init__(self, name: str, params: PickerParams, handle: Handle, *,
                 rng: random.Random | None = None) -> None:
        self.name = name
        self.params = params
        self.rng = rng or random.Random()
        n = params.max_num_of_endpoints
        self._n = fall_back(self, "maxNumOfEndpoints", n, 1, n > 0)
