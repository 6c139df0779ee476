"""The scheduler: profile-handler loop over scheduling profiles of Filter -> Score -> Pick.

One cycle (:meth:`Scheduler.schedule`) is synchronous:

1. every :class:`~epp.framework.plugins.DataProducer` fills the :class:`~epp.framework.plugins.CycleState`
   (:meth:`Scheduler.prepare`; the Director calls it before its admitters, as the reference runs PrepareData
   before admission, and hands the filled state to ``schedule``);
2. the profile handler names profiles to run until it names none; each profile runs its filters in order
   (a filter leaving nothing fails the profile), sums ``weight × clamp(score, 0, 1)`` over its scorers (no
   normalisation by total weight, as the reference), and hands the scored candidates to its picker;
3. the handler's ``process_results`` names the primary profile.

Errors: :class:`~epp.errors.NoCandidates` (503) when there are no candidates at all, and
:class:`~epp.errors.SchedulingFailed` (429) when candidates existed but no endpoint could be chosen.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Sequence

from epp.errors import NoCandidates, SchedulingFailed
from epp.framework.endpoint import Endpoint
from epp.framework.plugins import (
    CycleState,
    DataProducer,
    Filter,
    Picker,
    ProfileHandler,
    ProfileRunResult,
    SchedulingResult,
    ScoredEndpoint,
    Scorer,
)
from epp.framework.request import InferenceRequest

if TYPE_CHECKING:
    from epp.observability.tracing import ProfileTrace, SchedulingTrace

__all__ = ["WeightedScorer", "SchedulerProfile", "Scheduler", "PluginTimer", "producer_order"]

PluginTimer = Callable[[str, str, str, float], None]
"""``timer(extension_point, plugin_type, plugin_name, seconds)``: observes plugin durations (metrics)."""


@dataclass(slots=True)
class WeightedScorer:
    scorer: Scorer
    weight: float = 1.0


@dataclass
class SchedulerProfile:
    """A named pipeline: filters (in order), weighted scorers, and one picker."""

    name: str
    filters: list[Filter] = field(default_factory=list)
    scorers: list[WeightedScorer] = field(default_factory=list)
    picker: Picker | None = None

    def run(self, cycle: CycleState, request: InferenceRequest, candidates: list[Endpoint],
            timer: PluginTimer | None = None, trace: ProfileTrace | None = None) -> ProfileRunResult | None:
        """Run the pipeline; None if a filter left nothing or the picker chose nothing. ``trace`` (tracing on)
        hears each filter's survivors and each scorer's scores."""
        endpoints = candidates
        for flt in self.filters:
            endpoints = _call(timer, "Filter", flt, flt.filter, cycle, request, endpoints)
            if trace is not None:
                trace.filtered(flt, endpoints)
            if not endpoints:
                return None
        totals = self._score(cycle, request, endpoints, timer, trace)
        scored = [ScoredEndpoint(ep, s) for ep, s in zip(endpoints, totals)]
        assert self.picker is not None, f"profile {self.name} has no picker"
        result = _call(timer, "Picker", self.picker, self.picker.pick, cycle, request, scored)
        if result is None or not result.endpoints:
            return None
        result.scored = scored
        return result

    def _score(self, cycle: CycleState, request: InferenceRequest, endpoints: list[Endpoint],
               timer: PluginTimer | None, trace: ProfileTrace | None = None) -> list[float]:
        totals = [0.0] * len(endpoints)
        for ws in self.scorers:
            scores = _call(timer, "Scorer", ws.scorer, ws.scorer.score, cycle, request, endpoints)
            if len(scores) != len(endpoints):
                raise ValueError(f"scorer {ws.scorer.name} returned {len(scores)} scores for {len(endpoints)} "
                                 f"endpoints")
            w = ws.weight
            if trace is not None:
                trace.scored(ws.scorer, w, endpoints, scores)
            totals = [t + w * (0.0 if s < 0.0 else 1.0 if s > 1.0 else s) for t, s in zip(totals, scores)]
        return totals


class Scheduler:
    """Runs scheduling cycles over a fixed set of profiles, producers and one profile handler. Producers run in
    :func:`producer_order`."""

    def __init__(self, profiles: dict[str, SchedulerProfile], handler: ProfileHandler,
                 producers: Sequence[DataProducer] = (), timer: PluginTimer | None = None) -> None:
        self.profiles = profiles
        self.handler = handler
        self.producers = producer_order(producers)
        self.timer = timer

    def prepare(self, request: InferenceRequest, candidates: list[Endpoint]) -> CycleState:
        """A new cycle state filled by every data producer, in order, for ``request`` over ``candidates``."""
        cycle = CycleState()
        for producer in self.producers:
            _call(self.timer, "PrepareData", producer, producer.produce, cycle, request, candidates)
        return cycle

    def schedule(self, request: InferenceRequest, candidates: list[Endpoint],
                 cycle: CycleState | None = None, trace: SchedulingTrace | None = None) -> SchedulingResult:
        """Choose endpoint(s) for ``request`` among ``candidates``; raises NoCandidates / SchedulingFailed.
        ``cycle``: the state :meth:`prepare` filled for the same request and candidates (else it is made here);
        ``trace`` (tracing on): a span per profile run."""
        if not candidates:
            raise NoCandidates("failed to find endpoint candidates for serving the request")
        if cycle is None:
            cycle = self.prepare(request, candidates)
        results: dict[str, ProfileRunResult | None] = {}
        for _ in range(len(self.profiles) + 1):
            names = self.handler.pick_profiles(cycle, request, self.profiles, results)
            if not names:
                break
            for name in names:
                if trace is None:
                    results[name] = self.profiles[name].run(cycle, request, candidates, self.timer)
                else:
                    results[name] = self._traced_run(trace, name, cycle, request, candidates)
        result = self.handler.process_results(cycle, request, results)
        if not result.endpoints:
            raise SchedulingFailed("failed to find target endpoint")
        result.cycle = cycle
        return result

    def _traced_run(self, trace: SchedulingTrace, name: str, cycle: CycleState, request: InferenceRequest,
                    candidates: list[Endpoint]) -> ProfileRunResult | None:
        profile = trace.profile(name, len(candidates))
        result = None
        try:
            result = self.profiles[name].run(cycle, request, candidates, self.timer, profile)
        finally:
            profile.end(result)
        return result


def _call(timer: PluginTimer | None, point: str, plugin: Any, method: Callable[..., Any], *args: Any) -> Any:
    """``method(*args)``, reported to ``timer`` under (point, plugin type, plugin name) when there is one."""
    if timer is None:
        return method(*args)
    start = time.perf_counter()
    try:
        return method(*args)
    finally:
        timer(point, plugin.type_name, plugin.name, time.perf_counter() - start)


def producer_order(producers: Sequence[DataProducer]) -> list[DataProducer]:
    """``producers`` in the given (config) order, except that one consuming another's type (its ``consumes``)
    runs after it: the reference orders its data producers by what they consume and produce, so a producer may
    read what an earlier one put in the cycle state (``predicted-latency-producer`` reads the prefix producer's
    match). A dependency cycle keeps the given order for the producers in it."""
    ordered: list[DataProducer] = []
    pending = list(producers)
    while pending:
        for plugin in pending:
            needs = set(getattr(plugin, "consumes", ()))
            if not any(other is not plugin and other.type_name in needs for other in pending):
                break
        else:
            ordered.extend(pending)
            break
        ordered.append(plugin)
        pending.remove(plugin)
    return ordered
