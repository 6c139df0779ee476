"""Shared builders for the profile-handler tests: a fixed-answer decider, prefill/decode schedulers, a P/D pool."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any, ClassVar

from epp.framework.endpoint import Endpoint
from epp.framework.plugins import CycleState, NoParams
from epp.framework.request import InferenceRequest
from epp.plugins.filters.decode_filter import DecodeFilter
from epp.plugins.filters.prefill_filter import PrefillFilter
from epp.plugins.pickers.max_score import MaxScorePicker
from epp.plugins.scorers.queue import QueueScorer
from epp.scheduling.scheduler import Scheduler, SchedulerProfile, WeightedScorer

from .helpers import ep, make

__all__ = ["FIXTURES", "POOL", "FixedDecider", "pd_scheduler", "profile"]

FIXTURES = Path(__file__).parent.parent / "fixtures" / "configs" / "llmd"


class FixedDecider:
    """A decider with a fixed answer that records the decode endpoints it was asked about."""

    type_name: ClassVar[str] = "fixed-decider"
    Params = NoParams

    def __init__(self, name: str, answer: bool) -> None:
        self.name, self.answer, self.asked = name, answer, []

    def disaggregate(self, cycle: CycleState, request: InferenceRequest, decode_endpoint: Endpoint) -> bool:
        self.asked.append(decode_endpoint.name)
        return self.answer


def profile(name: str, flt: Any, seed: int = 0) -> SchedulerProfile:
    return SchedulerProfile(name, [flt], [WeightedScorer(make(QueueScorer), 1.0)],
                            make(MaxScorePicker, rng=random.Random(seed)))


def pd_scheduler(handler: Any, producers: tuple = (), extra: dict | None = None) -> Scheduler:
    profiles = {"prefill": profile("prefill", make(PrefillFilter)), "decode": profile("decode", make(DecodeFilter))}
    profiles.update(extra or {})
    return Scheduler(profiles, handler, list(producers))


POOL = [ep("p1", role="prefill", waiting=3), ep("p2", role="prefill", waiting=1),
        ep("d1", role="decode", waiting=2), ep("d2", role="decode", waiting=0),
        ep("e1", role="encode", address="fd00::1", port=9000)]
