"""Each ordering, fairness and usage-limit policy, driven through the controller one dispatch at a time."""

from __future__ import annotations

import pytest

from .helpers import Clients, FakeClock, FakeDetector, controller


def _band(fairness: str, ordering: str = "fcfs-ordering-policy") -> dict:
    return {"priorityBands": [{"priority": 0, "fairnessPolicyRef": fairness, "orderingPolicyRef": ordering}]}


async def _queue_then_drain(cfg: dict, arrivals: list[str], n: int | None = None,
                            clock: FakeClock | None = None) -> str:
    """Queue ``arrivals`` (tenant per request) while saturated, then dispatch one at a time; tenants in order."""
    clock = clock or FakeClock()
    detector = FakeDetector(1.0)
    clients = Clients(controller(cfg, clock=clock, detector=detector))
    for tenant in arrivals:
        await clients.send(tenant)
        clock.advance(0.001)
    assert await clients.dispatch() == 0
    detector.value = 0.0
    for _ in range(n or len(arrivals)):
        assert await clients.dispatch(limit=1) == 1
    return clients.tenants_of(clients.order)


@pytest.mark.parametrize("ref", ["global-strict-fairness-policy", "global-strict"])
async def test_global_strict_fcfs_is_one_queue_in_arrival_order(ref: str) -> None:
    assert await _queue_then_drain(_band(ref), list("aabab" "cba")) == "aababcba"


async def test_round_robin_takes_one_per_flow_in_turn() -> None:
    assert await _queue_then_drain(_band("round-robin-fairness-policy"), list("aaaa" "bb" "c")) == "abcabaa"


@pytest.mark.parametrize("weights, arrivals, expected", [
    ({"a": 1, "b": 2, "c": 3}, "abc" * 12, "abbccc" * 2),
    ({"a": 0.5, "b": 1.5}, "ab" * 8, "abbb" * 2),
    ({"a": 2, "b": 1}, "a" * 2 + "b" * 8, "aabbbbbbbb"),  # an emptied flow leaves; the other keeps going
], ids=["1:2:3", "fractional", "work-conserving"])
async def test_weighted_fair_is_deficit_round_robin_by_weight(weights: dict, arrivals: str, expected: str) -> None:
    cfg = {**_band("weighted-fair-fairness-policy"), "tenants": {k: {"weight": w} for k, w in weights.items()}}
    assert await _queue_then_drain(cfg, list(arrivals), n=len(expected)) == expected


async def test_weighted_fair_unknown_tenants_use_the_default_weight() -> None:
    cfg = {**_band("weighted-fair"), "tenants": {"defaults": {"weight": 1}, "gold": {"weight": 3}}}
    assert await _queue_then_drain(cfg, ["x", "gold"] * 8, n=8) == "xgoldgoldgold" * 2


async def test_edf_orders_by_deadline_across_flows_and_puts_no_ttl_last() -> None:
    cfg = {**_band("global-strict", "edf-ordering-policy"),
           "tenants": {"slow": {"requestTTL": "10s"}, "fast": {"requestTTL": "2s"}, "none": {"requestTTL": "0"}}}
    order = await _queue_then_drain(cfg, ["none", "slow", "fast", "slow", "fast"])
    assert order == "fastfastslowslownone"


async def test_edf_breaks_deadline_ties_by_arrival() -> None:
    cfg = {**_band("global-strict", "edf"), "defaultRequestTTL": "5s"}
    clock = FakeClock()
    assert await _queue_then_drain(cfg, list("abcab"), clock=clock) == "abcab"


async def test_fcfs_within_a_flow_under_round_robin() -> None:
    clock, detector = FakeClock(), FakeDetector(1.0)
    clients = Clients(controller(_band("round-robin"), clock=clock, detector=detector))
    rids = [await clients.send("a") for _ in range(3)]
    detector.value = 0.0
    await clients.dispatch()
    assert clients.order == rids


async def test_higher_priority_band_goes_first() -> None:
    clients = Clients(controller({}, detector=(detector := FakeDetector(1.0))))
    low = [await clients.send("a", priority=-1) for _ in range(2)]
    high = [await clients.send("b", priority=5) for _ in range(2)]
    mid = await clients.send("c", priority=0)
    detector.value = 0.0
    await clients.dispatch()
    assert clients.order == [*high, mid, *low]


async def test_usage_limit_per_priority_holds_lower_bands_back() -> None:
    detector = FakeDetector(1.0)
    cfg = {"priorityBands": [{"priority": 10}, {"priority": 0}]}
    ctrl = controller(cfg, detector=detector)
    ctrl.policies.usage_limit.per_priority = {0: 0.5}  # type: ignore[attr-defined]
    clients = Clients(ctrl)
    background = await clients.send("a", priority=0)
    urgent = await clients.send("a", priority=10)
    detector.value = 0.7
    assert await clients.dispatch() == 1
    assert clients.order == [urgent]
    detector.value = 0.4
    await clients.dispatch()
    assert clients.order == [urgent, background]


async def test_saturated_higher_band_blocks_every_band_below_it() -> None:
    """Head-of-line blocking, as the reference: the cycle stops at the first band over its limit."""
    detector = FakeDetector(1.0)
    ctrl = controller({"priorityBands": [{"priority": 10}, {"priority": 0}]}, detector=detector)
    ctrl.policies.usage_limit.per_priority = {10: 0.5, 0: 2.0}  # type: ignore[attr-defined]
    clients = Clients(ctrl)
    await clients.send("a", priority=10)
    await clients.send("b", priority=0)
    detector.value = 0.7  # over band 10's limit, under band 0's
    assert await clients.dispatch() == 0


async def test_a_band_waiting_on_tenant_quota_does_not_block_lower_bands() -> None:
    detector = FakeDetector(1.0)
    clients = Clients(controller({"tenants": {"busy": {"maxConcurrent": 1}}}, detector=detector))
    first = await clients.send("busy", priority=5)
    detector.value = 0.0
    await clients.dispatch()
    detector.value = 1.0
    blocked = await clients.send("busy", priority=5)
    low = await clients.send("other", priority=0)
    detector.value = 0.0
    await clients.dispatch()
    assert clients.order == [first, low]
    clients.grant(first).release()
    await clients.dispatch()
    assert clients.order[-1] == blocked


async def test_round_robin_skips_a_flow_at_its_quota_and_comes_back() -> None:
    detector = FakeDetector(1.0)
    clients = Clients(controller({**_band("round-robin"), "tenants": {"a": {"maxConcurrent": 1}}}, detector=detector))
    for tenant in "aabb":
        await clients.send(tenant)
    detector.value = 0.0
    await clients.dispatch()
    assert clients.tenants_of(clients.order) == "abb"
    clients.grant(clients.order[0]).release()
    await clients.dispatch()
    assert clients.tenants_of(clients.order) == "abba"
