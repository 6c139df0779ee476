"""The scheduler engine: filter order, weighted clamped scores, pickers, handler loop, and its errors."""

from __future__ import annotations

import pytest

from epp.errors import NoCandidates, SchedulingFailed
from epp.scheduling.scheduler import Scheduler, SchedulerProfile, WeightedScorer, producer_order

from .helpers import DropFilter, FixedScorer, RunAllHandler, TopPicker, endpoint, request


def _scheduler(*profiles: SchedulerProfile, primary: str = "default") -> Scheduler:
    return Scheduler({p.name: p for p in profiles}, RunAllHandler(primary))


def test_total_is_weighted_sum_of_clamped_scores() -> None:
    picker = TopPicker()
    prof = SchedulerProfile("default", scorers=[
        WeightedScorer(FixedScorer("a", {"x": 0.5, "y": 2.0, "z": -1.0}), 2.0),
        WeightedScorer(FixedScorer("b", {"x": 0.25, "y": 0.0, "z": 1.0}), 3.0),
    ], picker=picker)
    eps = [endpoint("x"), endpoint("y"), endpoint("z")]
    result = _scheduler(prof).schedule(request(), eps)
    # x: 2*0.5 + 3*0.25 = 1.75; y: 2*1 (clamped from 2) + 0 = 2.0; z: 2*0 (clamped) + 3*1 = 3.0
    assert dict(picker.seen[0]) == {"x": 1.75, "y": 2.0, "z": 3.0}
    assert result.target.name == "z"


def test_zero_weight_scorer_has_no_effect() -> None:
    picker = TopPicker()
    prof = SchedulerProfile("default", scorers=[WeightedScorer(FixedScorer("a", {"x": 1.0}), 0.0),
                                                WeightedScorer(FixedScorer("b", {"y": 0.1}), 1.0)], picker=picker)
    assert _scheduler(prof).schedule(request(), [endpoint("x"), endpoint("y")]).target.name == "y"


def test_filters_run_in_order_and_empty_filter_fails_profile() -> None:
    picker = TopPicker()
    prof = SchedulerProfile("default", filters=[DropFilter("f1", {"x"}), DropFilter("f2", {"y"})], picker=picker)
    result = _scheduler(prof).schedule(request(), [endpoint("x"), endpoint("y"), endpoint("z")])
    assert [e.name for e in result.endpoints] == ["z"]
    failing = SchedulerProfile("default", filters=[DropFilter("all", {"x", "y"})], picker=TopPicker())
    with pytest.raises(SchedulingFailed) as info:
        _scheduler(failing).schedule(request(), [endpoint("x"), endpoint("y")])
    assert info.value.status == 429


def test_no_candidates_is_503() -> None:
    prof = SchedulerProfile("default", picker=TopPicker())
    with pytest.raises(NoCandidates) as info:
        _scheduler(prof).schedule(request(), [])
    assert info.value.status == 503


def test_picker_fallback_list_is_ordered() -> None:
    prof = SchedulerProfile("default", scorers=[WeightedScorer(FixedScorer("a", {"x": 0.2, "y": 0.9, "z": 0.5}))],
                            picker=TopPicker(n=3))
    result = _scheduler(prof).schedule(request(), [endpoint("x"), endpoint("y"), endpoint("z")])
    assert [e.name for e in result.endpoints] == ["y", "z", "x"]


def test_every_profile_runs_and_primary_is_named_by_handler() -> None:
    decode = SchedulerProfile("decode", filters=[DropFilter("d", {"p"})], picker=TopPicker("t1"))
    prefill = SchedulerProfile("prefill", filters=[DropFilter("p", {"d"})], picker=TopPicker("t2"))
    sched = Scheduler({"decode": decode, "prefill": prefill}, RunAllHandler("decode"))
    result = sched.schedule(request(), [endpoint("p"), endpoint("d")])
    result.prefill_profile = "prefill"
    assert result.target.name == "d" and result.prefill is not None and result.prefill.name == "p"


def test_scorer_returning_wrong_length_is_a_bug_not_a_silent_pick() -> None:
    class Short(FixedScorer):
        def score(self, cycle, request, endpoints):  # type: ignore[no-untyped-def]
            return [1.0]

    prof = SchedulerProfile("default", scorers=[WeightedScorer(Short("s", {}))], picker=TopPicker())
    with pytest.raises(ValueError, match="returned 1 scores for 2"):
        _scheduler(prof).schedule(request(), [endpoint("x"), endpoint("y")])


def test_plugin_timer_sees_each_extension_point() -> None:
    seen: list[tuple[str, str]] = []
    prof = SchedulerProfile("default", filters=[DropFilter("f", set())],
                            scorers=[WeightedScorer(FixedScorer("s", {}))], picker=TopPicker())
    sched = Scheduler({"default": prof}, RunAllHandler(), timer=lambda p, t, n, s: seen.append((p, n)))
    sched.schedule(request(), [endpoint("x")])
    assert seen == [("Filter", "f"), ("Scorer", "s"), ("Picker", "top")]


class _Producer:
    """A producer stub for ordering: only its type and what it consumes matter."""

    def __init__(self, type_name: str, *consumes: str) -> None:
        self.type_name, self.consumes = type_name, consumes

    def produce(self, cycle: object, request: object, endpoints: object) -> None:
        pass


def test_producers_run_after_the_producers_they_consume() -> None:
    a, b, c = _Producer("a", "c"), _Producer("b"), _Producer("c", "b")
    assert producer_order([a, b, c]) == [b, c, a]
    assert Scheduler({}, RunAllHandler(), [a, b, c]).producers == [b, c, a]


def test_a_producer_cycle_keeps_the_given_order() -> None:
    a, b, free = _Producer("a", "b"), _Producer("b", "a"), _Producer("free")
    assert producer_order([a, b, free]) == [free, a, b]
    assert producer_order([]) == []
