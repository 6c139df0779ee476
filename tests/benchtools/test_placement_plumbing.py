"""``bench.placement``'s plumbing: the workload is seeded and every regime gets the same one, utilisation is counted
as defined (a hand-computed case), the node-sharing model scales steps as stated, EPP's routing reads the scraped
metrics, and regime (d) places new replicas where the extender's ``NodePlacer`` says. Which regime wins is the
benchmark's output, not asserted here."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from bench.placement import REGIMES, build, workload
from bench.placement_fleet import Fleet, FleetSpec, Request, Router, Server
from bench.placement_policies import (
    DEFAULT_CONFIG,
    EppRouting,
    ExtenderPlacement,
    LeastRequested,
    RoundRobin,
    SimClock,
)
from epp.extender.placement import NodePlacer
from epp.framework.endpoint import Metrics
from epp_sim import TimeModel

TINY = FleetSpec(nodes=2, gpus=3, servers=2, add=2, scale_at=1.5, slow_nodes=1, batch=8, duration=3.0, drain=60.0)
STEP = TimeModel(step_overhead_s=0.01, prefill_s_per_token=0.0, prefill_attn_s_per_pair=0.0, decode_s_per_seq=0.0,
                 attn_s_per_kv_token=0.0)
"""Every engine step takes exactly 10 ms, whatever it computes."""


class Recording:
    """A router that records what it is asked to route and hands it on."""

    def __init__(self, inner: Router) -> None:
        self.inner = inner
        self.scrape_interval = inner.scrape_interval
        self.routed: list[tuple[int, Request]] = []

    def add_server(self, server: Server) -> None:
        self.inner.add_server(server)

    def route(self, index: int, request: Request, now: float) -> Server | None:
        assert now == request.arrival
        self.routed.append((index, request))
        return self.inner.route(index, request, now)

    def first_token(self, index: int) -> None:
        self.inner.first_token(index)

    def finished(self, index: int, ok: bool, output_tokens: int) -> None:
        self.inner.finished(index, ok, output_tokens)

    def scrape(self, servers: Sequence[Server], now: float) -> None:
        self.inner.scrape(servers, now)


def test_workload_is_poisson_seeded_and_in_the_window() -> None:
    first, again, other = workload(5.0, 20.0, 3), workload(5.0, 20.0, 3), workload(5.0, 20.0, 4)
    assert first == again and first != other
    arrivals = [r.arrival for r in first]
    assert arrivals == sorted(arrivals) and 0 < arrivals[0] and arrivals[-1] < 20.0
    assert all(128 <= r.prompt_len <= 1024 and 16 <= r.max_tokens <= 1024 for r in first)


def test_every_regime_routes_the_same_requests_at_their_arrival() -> None:
    requests = workload(4.0, TINY.duration, 1)
    assert len(requests) > 5
    for key, regime in REGIMES.items():
        fleet = build(regime, "dynamic", TINY, requests, 1, DEFAULT_CONFIG, 0.05)
        recording = Recording(fleet.router)
        fleet.router = recording
        out = fleet.run()
        assert recording.routed == list(enumerate(requests)), key
        assert out.completed == len(requests) and out.failed == 0, key


def _single_server(duration: float, slow_nodes: int = 0, slowdown: float = 0.0) -> FleetSpec:
    return FleetSpec(nodes=1, gpus=1, servers=1, add=0, slow_nodes=slow_nodes, slowdown=slowdown, contention=0.0,
                     batch=4, max_wait=0.005, duration=duration, drain=10.0, time_model=STEP)


HAND_BATCH = [Request(0.0, 16, 1), Request(0.001, 16, 3)]
"""Under dynamic batching (wait 5 ms) both form one batch at 5 ms: step 1 prefills both (A's only token, B's first),
steps 2 and 3 decode B while A's finished slot pads the batch."""


def test_utilisation_of_a_hand_computed_dynamic_batch() -> None:
    # Busy: 3 steps of 10 ms in a 1 s window. Slot-seconds: 2·10 ms + 1·10 ms + 1·10 ms of 4 slots × 1 s.
    out = Fleet(_single_server(1.0), "dynamic", RoundRobin(), LeastRequested(0), HAND_BATCH).run()
    assert out.completed == 2 and out.output_tokens == 4
    assert out.busy_share == pytest.approx(0.03)
    assert out.slot_util == pytest.approx(0.04 / 4)
    assert out.ttfts == pytest.approx([0.015, 0.014])


def test_utilisation_counts_only_the_window() -> None:
    # The window ends at 20 ms, halfway through step 2: busy 10 + 5 ms of 20 ms; slot-seconds 2·10 + 1·5 ms of
    # 4 × 20 ms; the two tokens of step 1 are inside it, A's finish too.
    out = Fleet(_single_server(0.02), "dynamic", RoundRobin(), LeastRequested(0), HAND_BATCH).run()
    assert out.busy_share == pytest.approx(0.015 / 0.02)
    assert out.slot_util == pytest.approx(0.025 / (4 * 0.02))
    assert out.output_tokens == 2 and out.completed_in_window == 1 and out.completed == 2


def test_node_sharing_scales_a_step_by_the_node_and_its_busy_neighbours() -> None:
    spec = FleetSpec(nodes=2, gpus=2, servers=0, add=0, slow_nodes=1, slowdown=1.0, contention=0.25)
    fleet = Fleet(spec, "continuous", RoundRobin(), LeastRequested(0), [])
    a, b = fleet.start_server("node-0", 0.0), fleet.start_server("node-0", 0.0)
    c, d = fleet.start_server("node-1", 0.0), fleet.start_server("node-1", 0.0)
    assert fleet.step_factor(b, 1.0) == 2.0  # slow node, idle neighbour
    assert fleet.step_factor(d, 1.0) == 1.0
    a.stepping, a.step_end = True, 5.0
    c.stepping, c.step_end = True, 5.0
    assert fleet.step_factor(b, 1.0) == 2.0 * 1.25
    assert fleet.step_factor(d, 1.0) == 1.25
    assert fleet.step_factor(a, 1.0) == 2.0  # a server is not its own neighbour
    assert fleet.step_factor(d, 5.0) == 1.0  # c's step is over


def test_a_slow_node_stretches_every_step_of_a_run() -> None:
    requests = [Request(0.0, 16, 3)]
    plain = Fleet(_single_server(1.0), "continuous", RoundRobin(), LeastRequested(0), requests).run()
    slow = Fleet(_single_server(1.0, slow_nodes=1, slowdown=1.0), "continuous", RoundRobin(), LeastRequested(0),
                 requests).run()
    assert plain.busy_share == pytest.approx(0.03)
    assert slow.busy_share == pytest.approx(0.06) and slow.ttfts == pytest.approx([0.02])


def test_epp_routing_follows_the_scraped_metrics() -> None:
    clock = SimClock()
    fleet = Fleet(TINY, "continuous", EppRouting(DEFAULT_CONFIG, clock, 0), LeastRequested(0), [], clock.set)
    busy, idle = fleet.start_server("node-0", 0.0), fleet.start_server("node-1", 0.0)
    for i in range(12):
        busy.engine.add(f"q{i}", [i + 1] * 64, 0.0, max_tokens=4)
    clock.set(0.05)
    fleet.router.scrape(fleet.servers, 0.05)
    routing = fleet.router
    assert isinstance(routing, EppRouting)
    endpoints = {ep.name: ep for ep in routing.endpoints()}
    assert endpoints[busy.name].metrics.waiting == 12 and endpoints[busy.name].metrics.update_time == 0.05
    chosen = {routing.route(i, Request(0.05, 128, 8), 0.05) for i in range(5)}
    assert chosen == {idle}
    assert endpoints[idle.name].inflight_requests == 5  # booked by the Director until the request finishes
    for i in range(5):
        routing.finished(i, True, 8)
    assert endpoints[idle.name].inflight_requests == 0


def test_the_extender_placement_is_node_placers_choice() -> None:
    clock = SimClock()
    routing = EppRouting(DEFAULT_CONFIG, clock, 0)
    spec = FleetSpec(nodes=3, gpus=4, servers=0, add=0)
    fleet = Fleet(spec, "continuous", routing, LeastRequested(0), [], clock.set)
    for node in ("node-0", "node-1", "node-1", "node-2", "node-2"):
        fleet.start_server(node, 0.0)
    clock.set(1.0)
    load = {"node-0": Metrics(waiting=20, kv_usage=0.9), "node-1": Metrics(waiting=1, kv_usage=0.1),
            "node-2": Metrics(waiting=3, kv_usage=0.5)}
    for ep in routing.endpoints():
        m = load[ep.spec.node]
        ep.metrics = Metrics(waiting=m.waiting, kv_usage=m.kv_usage, update_time=1.0)
    placer = NodePlacer(routing.detector)
    pod = {"metadata": {"name": "replica", "labels": {"app": "sim-model-server"}}}
    nodes = ["node-0", "node-1", "node-2"]
    passed, failed = placer.filter(pod, nodes, routing.endpoints())
    scores = dict(placer.prioritize(pod, passed, routing.endpoints()))
    assert list(failed) == ["node-0"] and scores["node-1"] > scores["node-2"]
    bound = fleet.bound()
    assert LeastRequested(0).place(pod, nodes, bound) == "node-0"  # the fewest pods: kube-scheduler's choice
    assert ExtenderPlacement(placer, routing.endpoints, 0).place(pod, nodes, bound) == "node-1"


def test_regime_d_starts_each_new_replica_on_the_node_the_extender_chose() -> None:
    requests = workload(6.0, TINY.duration, 2)
    fleet = build(REGIMES["d"], "dynamic", TINY, requests, 2, DEFAULT_CONFIG, 0.05)
    placement = fleet.placer
    assert isinstance(placement, ExtenderPlacement)
    out = fleet.run()
    chosen = [node for _, node in placement.decisions]
    assert len(chosen) == TINY.add
    assert [s.node for s in fleet.servers[TINY.servers:]] == chosen
    assert all(s.joined == TINY.scale_at for s in fleet.servers[TINY.servers:])
    for scores, node in placement.decisions:
        assert not scores or dict(scores)[node] == max(score for _, score in scores)
    assert out.placed_at == [TINY.scale_at] * TINY.add
