"""``program-aware-fairness``: parameters and their errors, each strategy's ordering decision, the request hooks'
accounting, eviction and metrics, and the policy driving a real :class:`FlowController` (injected clock)."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from epp.config.loader import build_pipeline, load_raw
from epp.errors import ConfigError
from epp.flowcontrol import FlowControlConfig, FlowController, build_admission
from epp.framework.plugins import Handle, ResponseInfo, SchedulingResult
from epp.plugins.flowcontrol.program_aware import ProgramAwareFairnessPolicy, jain_fairness_index
from epp.plugins.flowcontrol.program_aware_strategies import (
    LasStrategy,
    ProgramMetrics,
    QueueInfo,
    TurnPriorityStrategy,
)
from epp.runtime.builtins import default_registry

from .helpers import Clients, FakeClock, FakeDetector, make_request

TYPE = "program-aware-fairness"


def plugin(params: dict[str, Any] | None = None, clock: FakeClock | None = None) -> ProgramAwareFairnessPolicy:
    validated = default_registry(entry_points=False).validate_params(TYPE, "pa", params)
    return ProgramAwareFairnessPolicy("pa", validated, Handle(), clock=clock or FakeClock())  # type: ignore[arg-type]


def controller(pa: ProgramAwareFairnessPolicy, clock: FakeClock, registry: CollectorRegistry | None = None,
               ) -> FlowController:
    handle = Handle()
    handle.add(pa)
    cfg = FlowControlConfig.model_validate({"defaultPriorityBand": {"fairnessPolicyRef": "pa"}})
    ctrl = build_admission(cfg, {"flowControl"}, FakeDetector(), registry, clock, handle=handle)
    assert isinstance(ctrl, FlowController)
    return ctrl


class _Flow:
    """Stands in for a flow in a strategy's :class:`QueueInfo` (strategies only hand it back)."""

    def __init__(self, name: str) -> None:
        self.name = name


def info(name: str, enqueue: float, dispatched: int | None = None, *, inflight: int = 0,
         last_completion: float | None = None) -> QueueInfo:
    metrics = None
    if dispatched is not None:
        metrics = ProgramMetrics(last_completion=last_completion or 0.0, dispatched=dispatched, inflight=inflight,
                                 completed=last_completion is not None)
    return QueueInfo(_Flow(name), name, metrics, enqueue)  # type: ignore[arg-type]


# -- parameters ------------------------------------------------------------------------------------------------


def test_defaults_are_the_references() -> None:
    pa = plugin()
    p = pa.params
    assert (p.strategy, p.las_weight_service, p.las_weight_head_wait, p.las_half_life_seconds) == ("las", 0.8, 0.2, 60)
    assert (p.turn_priority_time_weight, p.turn_priority_inactivity_seconds) == (0.5, 120)
    assert (p.eviction_ttl_seconds, p.eviction_sweep_seconds) == (3600, 300)
    assert isinstance(pa.strategy, LasStrategy)
    assert isinstance(plugin({"strategy": "turn-priority"}).strategy, TurnPriorityStrategy)
    assert isinstance(plugin({"strategy": ""}).strategy, LasStrategy)  # Go's omitempty: "" is the default


@pytest.mark.parametrize(("params", "field", "message"), [
    ({"evictionTtlSeconds": -1}, "evictionTtlSeconds", "evictionTtlSeconds must be >= 0, got -1"),
    ({"evictionSweepSeconds": 0}, "evictionSweepSeconds", "evictionSweepSeconds must be > 0, got 0"),
    ({"lasWeightService": -0.5}, "lasWeightService", "lasWeightService must be >= 0, got -0.5"),
    ({"lasWeightHeadWait": -1}, "lasWeightHeadWait", "lasWeightHeadWait must be >= 0, got -1"),
    ({"lasHalfLifeSeconds": -2}, "lasHalfLifeSeconds", "lasHalfLifeSeconds must be >= 0, got -2"),
    ({"turnPriorityTimeWeight": -1}, "turnPriorityTimeWeight", "turnPriorityTimeWeight must be >= 0, got -1"),
    ({"turnPriorityInactivitySeconds": -3}, "turnPriorityInactivitySeconds",
     "turnPriorityInactivitySeconds must be >= 0, got -3"),
    ({"strategy": "drr"}, "strategy", 'unknown scoring strategy "drr": only "las" and "turn-priority" are supported'),
], ids=["ttl", "sweep", "w-service", "w-wait", "half-life", "time-weight", "inactivity", "strategy"])
def test_parameter_errors_name_plugin_and_field(params: dict[str, Any], field: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        default_registry(entry_points=False).create(TYPE, "pa", params, Handle())
    assert err.value.plugin == "pa" and err.value.field == field
    assert str(err.value).startswith("plugin 'pa' (type: program-aware-fairness): ") and message in str(err.value)


def test_removed_and_unknown_parameters_are_refused() -> None:
    with pytest.raises(ConfigError) as err:  # lasDecayFactor left the reference with lazy half-life decay
        default_registry(entry_points=False).create(TYPE, "pa", {"lasDecayFactor": 0.99}, Handle())
    assert err.value.field == "lasDecayFactor"


def test_a_config_naming_it_loads_with_flow_control() -> None:
    text = """
featureGates: [flowControl]
plugins:
- type: program-aware-fairness
  parameters: {strategy: turn-priority, turnPriorityTimeWeight: 0.05}
flowControl:
  defaultPriorityBand: {fairnessPolicyRef: program-aware-fairness}
"""
    pipeline = build_pipeline(*load_raw(text, "t.yaml"), default_registry(entry_points=False))
    pa = pipeline.handle.plugin("program-aware-fairness")
    assert isinstance(pa, ProgramAwareFairnessPolicy)
    assert pa in pipeline.pre_request and pa in pipeline.response_complete
    assert pipeline.flow_policies.fairness["program-aware-fairness"] is pa


# -- strategies ------------------------------------------------------------------------------------------------


def test_las_prefers_the_least_attained_service() -> None:
    las = LasStrategy(0.8, 0.2, 60.0)
    las.on_completed("heavy", 1000.0, now=10.0)
    las.on_completed("light", 10.0, now=10.0)
    # heavy's head waited longer, but service outweighs head wait (0.8 vs 0.2)
    assert las.pick([info("heavy", 1.0), info("light", 9.0)], now=10.0).name == "light"  # type: ignore[union-attr]


def test_las_head_wait_breaks_equal_service() -> None:
    las = LasStrategy(0.8, 0.2, 60.0)
    picked = las.pick([info("young", 9.5), info("old", 2.0)], now=10.0)
    assert picked.name == "old"  # type: ignore[union-attr]


def test_las_head_wait_can_win_when_weighted_over_service() -> None:
    las = LasStrategy(0.2, 0.8, 0.0)
    las.on_completed("a", 100.0, now=0.0)
    assert las.pick([info("a", 1.0), info("b", 9.0)], now=10.0).name == "a"  # type: ignore[union-attr]


def test_las_service_decays_by_half_life_and_zero_disables_it() -> None:
    las, flat = LasStrategy(0.8, 0.2, 60.0), LasStrategy(0.8, 0.2, 0.0)
    for s in (las, flat):
        s.on_completed("p", 800.0, now=0.0)
    assert las.service("p", 120.0) == pytest.approx(200.0) and flat.service("p", 120.0) == 800.0
    las.on_completed("p", 100.0, now=60.0)  # decay is folded in before the new cost
    assert las.service("p", 60.0) == pytest.approx(500.0) and las.gauge_values() == {"p": pytest.approx(500.0)}


def test_las_a_returning_idle_program_competes_again() -> None:
    las = LasStrategy(0.8, 0.2, 10.0)
    las.on_completed("idle", 1000.0, now=0.0)
    las.on_completed("busy", 100.0, now=100.0)  # idle's 1000 has decayed to about 1 by now
    assert las.pick([info("busy", 100.0), info("idle", 100.0)], now=100.0).name == "idle"  # type: ignore[union-attr]


def test_turn_priority_prefers_the_deeper_session() -> None:
    tp = TurnPriorityStrategy(0.5, 120.0)
    assert tp.pick([info("shallow", 9.0, 1), info("deep", 9.0, 20)], now=10.0).name == "deep"  # type: ignore[union-attr]


def test_turn_priority_wait_overcomes_depth() -> None:
    tp = TurnPriorityStrategy(0.5, 120.0)
    # 1 + 1 + 0.5 * 50 = 27 > 20 + 1
    assert tp.pick([info("deep", 100.0, 20), info("starving", 50.0, 1)], now=100.0).name == "starving"  # type: ignore[union-attr]
    # depth alone (weight 0): the deeper one, however long the other waited
    flat = TurnPriorityStrategy(0.0, 120.0)
    assert flat.pick([info("deep", 100.0, 20), info("starving", 0.0, 1)], now=100.0).name == "deep"  # type: ignore[union-attr]


def test_turn_priority_equal_scores_go_to_the_longer_wait() -> None:
    tp = TurnPriorityStrategy(0.0, 0.0)
    assert tp.pick([info("late", 9.0, 3), info("early", 5.0, 3)], now=10.0).name == "early"  # type: ignore[union-attr]


def test_turn_priority_default_flow_and_inactive_programs_count_as_turn_one() -> None:
    tp = TurnPriorityStrategy(0.0, 120.0)
    assert tp.turn_number(info("default-flow", 0.0, 50)) == 1
    assert tp.turn_number(info("fresh", 0.0)) == 1
    assert tp.turn_number(info("active", 200.0, 7, last_completion=100.0)) == 8
    assert tp.turn_number(info("dormant", 300.0, 7, last_completion=100.0)) == 1  # gap 200 s > 120 s
    assert tp.turn_number(info("streaming", 300.0, 7, inflight=1, last_completion=100.0)) == 8
    assert TurnPriorityStrategy(0.0, 0.0).turn_number(info("dormant", 300.0, 7, last_completion=100.0)) == 8


def test_jain_fairness_index() -> None:
    assert jain_fairness_index([]) == 1.0 and jain_fairness_index([5.0]) == 1.0
    assert jain_fairness_index([10.0, 10.0]) == 1.0
    assert jain_fairness_index([10.0, 0.0]) == pytest.approx(0.5)


# -- with the flow controller and the request hooks -------------------------------------------------------------


def _finish(pa: ProgramAwareFairnessPolicy, fairness_id: str, rid: str, prompt: int, completion: int) -> None:
    req = make_request(fairness_id, request_id=rid)
    pa.response_complete(req, None, ResponseInfo(prompt_tokens=prompt, completion_tokens=completion))


async def test_las_orders_the_controllers_dispatches_and_hooks_account() -> None:
    clock = FakeClock()
    pa = plugin(clock=clock)
    ctrl = controller(pa, clock)
    clients = Clients(ctrl)
    ctrl.detector.value = 1.0  # saturated: everything queues
    # the heavy program already consumed 10 (prompt) + 2 * 100 (completion) weighted tokens
    pa.pre_request(make_request("heavy", request_id="h0"), SchedulingResult({}, "default"))
    _finish(pa, "heavy", "h0", 10, 100)
    for i in range(2):
        await clients.send("heavy", request_id=f"heavy#{i}")
    clock.advance(1.0)
    await clients.send("light", request_id="light#0")
    clock.advance(2.0)
    ctrl.detector.value = 0.0
    await clients.dispatch(limit=1)
    assert clients.order == ["light#0"]  # least attained service, though heavy's head is older
    pa.pre_request(make_request("light", request_id="light#0"), SchedulingResult({}, "default"))
    light = pa.programs["light"]
    assert (light.dispatched, light.inflight, light.wait_count, light.average_wait_ms) == (1, 1, 1, 2000.0)
    _finish(pa, "light", "light#0", 5, 5)
    assert light.inflight == 0 and pa.strategy.gauge_values() == {"heavy": 210.0, "light": 15.0}
    await clients.dispatch()
    assert clients.order == ["light#0", "heavy#0", "heavy#1"]


async def test_turn_priority_dispatches_the_deeper_session_first() -> None:
    clock = FakeClock()
    pa = plugin({"strategy": "turn-priority", "turnPriorityTimeWeight": 0.05}, clock)
    ctrl = controller(pa, clock)
    clients = Clients(ctrl)
    for i in range(3):  # session "deep" has taken three turns
        pa.pre_request(make_request("deep", request_id=f"d{i}"), SchedulingResult({}, "default"))
        _finish(pa, "deep", f"d{i}", 10, 10)
    ctrl.detector.value = 1.0
    await clients.send("new")
    clock.advance(10.0)  # new's head ages 0.5 turn-equivalents: 1.5 < 4
    await clients.send("deep")
    ctrl.detector.value = 0.0
    await clients.dispatch(limit=1)
    assert clients.tenants_of(clients.order) == "deep"


async def test_eviction_sweep_forgets_idle_programs_and_their_series() -> None:
    clock = FakeClock()
    pa = plugin({"evictionTtlSeconds": 100, "evictionSweepSeconds": 10}, clock)
    registry = CollectorRegistry()
    controller(pa, clock, registry)
    pa.pre_request(make_request("old", request_id="o"), SchedulingResult({}, "default"))
    _finish(pa, "old", "o", 1, 1)
    pa.pre_request(make_request("open", request_id="x"), SchedulingResult({}, "default"))  # stays in flight
    assert registry.get_sample_value("llm_d_epp_program_aware_attained_service_tokens", {"program_id": "old"}) == 3
    clock.advance(150.0)
    pa.pre_request(make_request("new", request_id="n"), SchedulingResult({}, "default"))  # the sweep runs here
    assert set(pa.programs) == {"open", "new"}
    assert registry.get_sample_value("llm_d_epp_program_aware_avg_wait_time_milliseconds",
                                     {"program_id": "old"}) is None
    assert registry.get_sample_value("llm_d_epp_program_aware_attained_service_tokens", {"program_id": "old"}) is None


async def test_metrics_under_the_references_names() -> None:
    clock = FakeClock()
    pa = plugin(clock=clock)
    registry = CollectorRegistry()
    ctrl = controller(pa, clock, registry)
    clients = Clients(ctrl)
    ctrl.detector.value = 1.0
    await clients.send("a", request_id="a#0")
    await clients.send("b", request_id="b#0")
    clock.advance(0.5)
    ctrl.detector.value = 0.0
    await clients.dispatch(limit=1)
    clock.advance(1.5)
    await clients.dispatch(limit=1)
    for rid in clients.order:
        pa.pre_request(make_request(rid.split("#")[0], request_id=rid), SchedulingResult({}, "default"))
    waits = {p: registry.get_sample_value("llm_d_epp_program_aware_avg_wait_time_milliseconds", {"program_id": p})
             for p in "ab"}
    assert sorted(waits.values()) == [2000.0, 2000.0]  # both reach PreRequest at the same instant
    assert registry.get_sample_value("llm_d_epp_program_aware_jains_fairness_index") == 1.0


def test_turn_priority_exports_no_attained_service() -> None:
    clock = FakeClock()
    pa = plugin({"strategy": "turn-priority"}, clock)
    registry = CollectorRegistry()
    controller(pa, clock, registry)
    _finish(pa, "a", "a0", 1, 1)
    names = {m.name for m in registry.collect()}
    assert "llm_d_epp_program_aware_jains_fairness_index" in names
    assert "llm_d_epp_program_aware_attained_service_tokens" not in names
