"""Flow-control metrics against the reference's ``pkg/epp/metrics/metrics.go``: family layouts (labels, buckets, no
``_created`` series), one queue-duration observation per request whatever its outcome, and a pool-saturation gauge
that is current whether or not anything is queued."""

from __future__ import annotations

import math
from collections import Counter

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from epp.errors import RequestExpired
from epp.flowcontrol import FlowControlConfig, FlowController, build_admission

from .helpers import Clients, FakeClock, FakeDetector, endpoint, settle

FC = "inference_extension_flow_control_"
LLMD = "llm_d_epp_flow_control_"
MODEL = ("model_name", "target_model_name")
# Label names and bucket bounds of the reference's families (metrics.go).
REFERENCE = {
    "request_queue_duration_seconds": (
        {"fairness_id", "priority", "outcome", "inference_pool", *MODEL},
        [0.0001, 0.0005, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0]),
    "request_enqueue_duration_seconds": (
        {"fairness_id", "priority", "outcome"},
        [0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1]),
    "dispatch_cycle_duration_seconds": (set(), [0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1]),
    "queue_size": ({"fairness_id", "priority", "inference_pool", *MODEL}, None),
    "queue_bytes": ({"fairness_id", "priority", "inference_pool", *MODEL}, None),
    "pool_saturation": ({"inference_pool"}, None),
}


def _controller(config: dict, registry: CollectorRegistry, detector: FakeDetector, clock: FakeClock,
                **kw: object) -> FlowController:
    ctrl = build_admission(FlowControlConfig.model_validate(config), {"flowControl"}, detector, registry, clock,
                           pool_name="pool", **kw)  # type: ignore[arg-type]
    assert isinstance(ctrl, FlowController)
    return ctrl


def _layout(registry: CollectorRegistry) -> dict[str, tuple[set[str], list[float] | None]]:
    out: dict[str, tuple[set[str], list[float] | None]] = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        labels = {k for s in family.samples for k in s.labels if k != "le"}
        bounds = sorted({float(s.labels["le"]) for s in family.samples if s.name.endswith("_bucket")} - {math.inf})
        out[family.name.removeprefix(FC)] = (labels, bounds or None)  # llm-d names stay whole
    return out


def _count(registry: CollectorRegistry, family: str, label: str) -> Counter[str]:
    counts: Counter[str] = Counter()
    for fam in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in fam.samples:
            if s.name == FC + family + "_count":
                counts[s.labels[label]] += int(s.value)
    return counts


async def test_families_have_the_reference_layout_and_no_created_series() -> None:
    registry, clock = CollectorRegistry(), FakeClock()
    clients = Clients(_controller({}, registry, FakeDetector(0.0), clock))
    await clients.send("a")
    await clients.dispatch()
    text = generate_latest(registry).decode()
    assert "_created" not in text
    layout = _layout(registry)
    for name, expected in REFERENCE.items():
        assert layout[name] == expected, name
        assert layout[LLMD + name] == expected, name  # the current reference's name, same layout


async def test_each_family_is_also_exported_under_the_current_reference_name_with_the_same_series() -> None:
    """llm-d-router registers every flow-control family twice: the legacy name, its HELP marked
    ``[Deprecated: Use llm_d_epp_flow_control_X]``, and ``llm_d_epp_flow_control_X``."""
    registry, clock = CollectorRegistry(), FakeClock()
    clients = Clients(_controller({}, registry, FakeDetector(0.0), clock))
    for tenant in ("a", "b", "a"):
        await clients.send(tenant)
    await clients.dispatch()
    fams = {f.name: f for f in text_string_to_metric_families(generate_latest(registry).decode())}
    for name in REFERENCE:
        legacy, llmd = fams[FC + name], fams[LLMD + name]
        assert legacy.documentation == f"[Deprecated: Use {LLMD}{name}] {llmd.documentation}"
        assert [(s.name.replace(FC, LLMD), s.labels, s.value) for s in legacy.samples] == \
            [(s.name, s.labels, s.value) for s in llmd.samples], name
    assert sum(s.value for s in fams[LLMD + "request_queue_duration_seconds"].samples
               if s.name.endswith("_count") and s.labels["outcome"] == "Dispatched") == 3
    assert LLMD + "rejections" not in fams  # this project's own families keep their one name


async def test_queue_duration_is_recorded_once_for_every_outcome() -> None:
    registry, clock, detector = CollectorRegistry(), FakeClock(), FakeDetector(1.0)  # saturated: nothing leaves
    ctrl = _controller({"defaultRequestTTL": "1s", "priorityBands": [{"priority": 0, "maxRequests": 3}],
                        "tenants": {"r": {"rate": {"requestsPerSecond": 0.001}, "requestTTL": "0s"}}},
                       registry, detector, clock)
    clients = Clients(ctrl)
    held = await clients.send("r")                    # no TTL: still queued at shutdown -> EvictedOther
    await clients.send("r")                           # over its rate -> RejectedOther
    cancelled = await clients.send("a")               # client goes away -> EvictedContextCancelled
    await clients.send("a")                           # waits past its 1 s TTL -> EvictedTTL
    await clients.send("a")                           # the band holds 3 -> RejectedCapacity
    clients.tasks[cancelled].cancel()
    await settle()
    clock.advance(2.0)
    assert ctrl.expire() == 1
    detector.value = 0.0
    await clients.send("a", 5)                        # a higher band goes first -> Dispatched
    assert await clients.dispatch(limit=1) == 1
    await ctrl.stop()
    await settle()
    assert isinstance(clients.error(held), RequestExpired)
    assert _count(registry, "request_queue_duration_seconds", "outcome") == {
        "Dispatched": 1, "RejectedCapacity": 1, "RejectedOther": 1, "EvictedTTL": 1,
        "EvictedContextCancelled": 1, "EvictedOther": 1}
    assert _count(registry, "request_enqueue_duration_seconds", "outcome") == {
        "NotYetFinalized": 4, "RejectedCapacity": 1, "RejectedOther": 1}


async def test_pool_saturation_is_current_while_nothing_is_queued() -> None:
    registry, clock = CollectorRegistry(), FakeClock()
    pool = [endpoint("a"), endpoint("b"), endpoint("c")]
    detector = FakeDetector(0.3)
    ctrl = _controller({}, registry, detector, clock, pool=lambda: pool)

    def gauge() -> float | None:
        return registry.get_sample_value(FC + "pool_saturation", {"inference_pool": "pool"})

    assert gauge() == pytest.approx(0.3) and detector.seen[-1] == 3  # over the whole pool, before any request
    detector.value = 1.7
    assert gauge() == pytest.approx(1.7)
    clients = Clients(ctrl)
    await clients.send("a")
    detector.value = 0.2
    await clients.dispatch()
    detector.value = 0.9                              # queues empty again: still follows the pool
    assert ctrl.queued == 0 and gauge() == pytest.approx(0.9)
    detector.fn = lambda: 1 / 0                       # a failing detector reads as saturated, as dispatch treats it
    assert gauge() == math.inf


async def test_without_a_pool_the_gauge_is_the_last_dispatch_saturation() -> None:
    registry, clock, detector = CollectorRegistry(), FakeClock(), FakeDetector(0.4)
    clients = Clients(_controller({}, registry, detector, clock))
    assert registry.get_sample_value(FC + "pool_saturation", {"inference_pool": "pool"}) is None
    await clients.send("a")
    await clients.dispatch()
    detector.value = 0.8
    assert registry.get_sample_value(FC + "pool_saturation", {"inference_pool": "pool"}) == pytest.approx(0.4)
