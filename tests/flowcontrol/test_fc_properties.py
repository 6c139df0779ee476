"""Property tests of the flow-control contract (hypothesis; injected clock, bounded example counts).

1. Quota invariants under random arrivals, dispatches, completions, failures (double release), client
   cancellations (also racing a dispatch) and TTL expiry: a tenant's in-flight never exceeds its quota, in-flight
   equals the admissions not yet released (released exactly once), queue counters agree everywhere, and once load
   stops every queued request is served (nobody is left behind).
2. Weighted fair: with every tenant backlogged, dispatches follow the weights within 10%.
3. No starvation: while a tenant is ready (queued, within quota), it is served within one DRR round.
"""

from __future__ import annotations

import asyncio
import math
import random
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from epp.flowcontrol import FlowController, Grant, ItemState, QueueItem

from .helpers import FakeClock, FakeDetector, controller, make_request

TENANTS = {
    "a": {"weight": 1, "maxConcurrent": 2, "maxTokensInFlight": 90},
    "b": {"weight": 2, "maxConcurrent": 3, "rate": {"requestsPerSecond": 4, "burst": 3}},
    "c": {"weight": 3, "maxQueued": 2, "requestTTL": "2s"},
    "defaults": {"maxConcurrent": 1},
}
POOL_CAPACITY = 5


class QuotaMachine(RuleBasedStateMachine):
    """The request path's view: tasks awaiting admission, and grants it holds until the request ends."""

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.clock = FakeClock()
        self.held: list[Grant] = []
        self.detector = FakeDetector(fn=lambda: len(self.held) / POOL_CAPACITY)
        cfg = {"defaultRequestTTL": "5s", "tenants": TENANTS,
               "defaultPriorityBand": {"fairnessPolicyRef": "weighted-fair-fairness-policy"},
               "priorityBands": [{"priority": 5, "fairnessPolicyRef": "round-robin", "maxRequests": 6}]}
        self.ctrl: FlowController = self.run(self._build(cfg))
        self.waiting: list[asyncio.Task[Any]] = []

    async def _build(self, cfg: dict) -> FlowController:
        return controller(cfg, clock=self.clock, detector=self.detector)

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def settle(self) -> None:
        self.run(asyncio.sleep(0))
        self.run(asyncio.sleep(0))
        for task in [t for t in self.waiting if t.done()]:
            self.waiting.remove(task)
            if not task.cancelled() and task.exception() is None:
                self.held.append(task.result())

    def teardown(self) -> None:
        try:
            self._drain()
        finally:
            for task in self.waiting:
                task.cancel()
            self.loop.run_until_complete(asyncio.sleep(0))
            self.loop.close()

    def _drain(self) -> None:
        """Load stops; every held request finishes; everything still queued must be served."""
        self.detector.fn = None
        self.detector.value = 0.0
        for _ in range(200):
            for grant in list(self.held):
                grant.release()
            self.held.clear()
            self.ctrl.dispatch()
            self.settle()
            if not self.waiting:
                break
        assert not self.waiting and self.ctrl.queued == 0
        for grant in self.held:
            grant.release()
        assert all(t.inflight == 0 and t.inflight_tokens == 0 for t in self.ctrl.tenants)

    @rule(tenant=st.sampled_from(["a", "b", "c", "x", "y"]), priority=st.sampled_from([0, 5]),
          tokens=st.integers(1, 60))
    def arrive(self, tenant: str, priority: int, tokens: int) -> None:
        task = self.loop.create_task(self.ctrl.admit(make_request(tenant, priority, tokens=tokens), list))
        self.waiting.append(task)
        self.settle()

    @rule(limit=st.one_of(st.none(), st.integers(1, 3)))
    def dispatch(self, limit: int | None) -> None:
        self.ctrl.dispatch(limit)
        self.settle()

    @precondition(lambda self: self.held)
    @rule(data=st.data(), twice=st.booleans())
    def finish(self, data: st.DataObject, twice: bool) -> None:
        """A request completes or fails; failure paths may release again (retries, error handlers)."""
        grant = self.held.pop(data.draw(st.integers(0, len(self.held) - 1)))
        grant.release()
        if twice:
            grant.release()
        self.settle()

    @precondition(lambda self: self.waiting)
    @rule(data=st.data(), race=st.booleans())
    def disconnect(self, data: st.DataObject, race: bool) -> None:
        """A client goes away; with ``race`` its request may have just been dispatched."""
        if race:
            self.ctrl.dispatch()
        task = self.waiting[data.draw(st.integers(0, len(self.waiting) - 1))]
        task.cancel()
        self.settle()

    @rule(seconds=st.sampled_from([0.1, 0.5, 1.0, 3.0]))
    def tick(self, seconds: float) -> None:
        self.clock.advance(seconds)
        self.ctrl.expire()
        self.settle()

    @invariant()
    def quotas_hold(self) -> None:
        for tenant in self.ctrl.tenants:
            cfg = tenant.config
            assert tenant.inflight >= 0 and tenant.inflight_tokens >= 0 and tenant.queued >= 0
            assert cfg.max_concurrent is None or tenant.inflight <= cfg.max_concurrent
            assert cfg.max_tokens_in_flight is None or tenant.inflight_tokens <= cfg.max_tokens_in_flight
            assert cfg.max_queued is None or tenant.queued <= cfg.max_queued

    @invariant()
    def inflight_is_exactly_the_unreleased_grants(self) -> None:
        for tenant in self.ctrl.tenants:
            mine = [g for g in self.held if g.tenant is tenant]
            assert tenant.inflight == len(mine)
            assert tenant.inflight_tokens == sum(g.tokens for g in mine)

    @invariant()
    def queue_counters_agree(self) -> None:
        ctrl = self.ctrl
        items = [i for band in ctrl.bands.values() for flow in band.flows.values() for i in flow.queue]
        assert all(i.state is ItemState.QUEUED for i in items)
        assert ctrl.queued == len(items) == sum(b.queued for b in ctrl.bands.values())
        assert ctrl.queued == sum(t.queued for t in ctrl.tenants) == len(self.waiting)
        assert ctrl.queued_bytes == sum(i.size for i in items)


TestQuotaInvariants = QuotaMachine.TestCase
TestQuotaInvariants.settings = settings(max_examples=60, stateful_step_count=30, deadline=None,
                                        suppress_health_check=[HealthCheck.too_slow])


def _run(coro: Any) -> Any:
    return asyncio.run(coro)


async def _backlogged(weights: list[int], dispatches: int, quotas: list[int | None] | None = None,
                      ) -> tuple[FlowController, dict[str, list[QueueItem]]]:
    """Tenants ``t0..`` with ``weights``, each queued deep enough to stay backlogged for ``dispatches``."""
    tenants = {f"t{i}": {"weight": w, **({"maxConcurrent": quotas[i]} if quotas and quotas[i] else {})}
               for i, w in enumerate(weights)}
    ctrl = controller({"defaultPriorityBand": {"fairnessPolicyRef": "weighted-fair"}, "tenants": tenants},
                      detector=FakeDetector(1.0))
    depth = {f"t{i}": math.ceil(1.2 * dispatches * w / sum(weights)) + 8 for i, w in enumerate(weights)}
    queued = {fid: [ctrl.enqueue(make_request(fid), list) for _ in range(n)] for fid, n in depth.items()}
    return ctrl, queued


@settings(max_examples=25, deadline=None)
@given(weights=st.lists(st.sampled_from([1, 2, 3, 4]), min_size=2, max_size=4), capacity=st.integers(1, 8),
       rng=st.randoms(use_true_random=False))
def test_equal_demand_throughput_follows_weights(weights: list[int], capacity: int, rng: random.Random) -> None:
    dispatches = 400

    async def scenario() -> dict[str, int]:
        ctrl, queued = await _backlogged(weights, dispatches)
        held: list[Grant] = []
        ctrl.detector.fn = lambda: len(held) / capacity  # type: ignore[attr-defined]
        served = dict.fromkeys(queued, 0)
        for _ in range(dispatches):
            grant = _dispatch_one(ctrl, queued, served)
            if grant is None:
                held.pop(rng.randrange(len(held))).release()  # a random request completes
                grant = _dispatch_one(ctrl, queued, served)
            assert grant is not None
            held.append(grant)
        return served

    served = _run(scenario())
    total_weight = sum(weights)
    for i, w in enumerate(weights):
        expected = dispatches * w / total_weight
        assert abs(served[f"t{i}"] - expected) <= 0.1 * expected, (served, weights)


def _dispatch_one(ctrl: FlowController, queued: dict[str, list[QueueItem]], served: dict[str, int]) -> Grant | None:
    """Dispatch at most one request; its grant (FCFS within a flow: the tenant's next queued item)."""
    before = {t.fairness_id: t.dispatched for t in ctrl.tenants}
    if ctrl.dispatch(limit=1) == 0:
        return None
    fid = next(t.fairness_id for t in ctrl.tenants if t.dispatched != before[t.fairness_id])
    item = queued[fid][served[fid]]
    served[fid] += 1
    assert item.state is ItemState.DISPATCHED and isinstance(item.grant, Grant)
    return item.grant


@settings(max_examples=30, deadline=None)
@given(weights=st.lists(st.sampled_from([1, 2, 3]), min_size=2, max_size=4),
       quotas=st.lists(st.sampled_from([None, 1, 2]), min_size=4, max_size=4), capacity=st.integers(1, 6),
       rng=st.randoms(use_true_random=False))
def test_a_ready_tenant_is_served_within_one_round(weights: list[int], quotas: list[int | None], capacity: int,
                                                   rng: random.Random) -> None:
    w_min = min(weights)
    bound = {f"t{i}": sum(math.ceil(w / w_min) + 1 for j, w in enumerate(weights) if j != i)
             for i in range(len(weights))}

    async def scenario() -> None:
        ctrl, queued = await _backlogged(weights, 150, quotas=quotas)
        held: list[Grant] = []
        ctrl.detector.fn = lambda: len(held) / capacity  # type: ignore[attr-defined]
        served, skipped = dict.fromkeys(queued, 0), dict.fromkeys(bound, 0)
        for _ in range(150):
            ready = {fid for fid in queued if _is_ready(ctrl, fid)}
            grant = _dispatch_one(ctrl, queued, served)
            if grant is None:
                assert held, "nothing in flight, yet nothing could be dispatched"
                held.pop(rng.randrange(len(held))).release()
                continue
            held.append(grant)
            for fid in bound:
                skipped[fid] = 0 if fid == grant.tenant.fairness_id or fid not in ready else skipped[fid] + 1
                assert skipped[fid] <= bound[fid], (fid, skipped, weights, quotas)

    _run(scenario())


def _is_ready(ctrl: FlowController, fairness_id: str) -> bool:
    flow = ctrl.bands[0].flows.get(fairness_id)
    head = flow.queue.head() if flow is not None else None
    return head is not None and flow is not None and flow.tenant.can_start(head.tokens)
