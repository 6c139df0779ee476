"""The flow controller's arrival checks, TTL, quotas, disconnects, background loop and introspection."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import ClientSession, web
from aiohttp.test_utils import TestServer
from prometheus_client import CollectorRegistry

from epp.errors import RequestExpired, Saturated
from epp.flowcontrol import (
    DEBUG_TENANTS_PATH,
    Admission,
    FlowControlConfig,
    FlowController,
    Reason,
    build_admission,
    debug_tenants_handler,
)

from .helpers import Clients, FakeClock, FakeDetector, controller, make_request, settle


async def _saturated(cfg: dict, clock: FakeClock | None = None) -> tuple[Clients, FakeDetector]:
    detector = FakeDetector(1.0)
    return Clients(controller(cfg, clock=clock, detector=detector)), detector


def _reason(clients: Clients, rid: str) -> str | None:
    err = clients.error(rid)
    return getattr(err, "reason", None)


# -- capacity -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("cfg, sends, reason", [
    ({"priorityBands": [{"priority": 0, "maxRequests": 2}]}, [("a", 0), ("b", 0), ("c", 0)],
     Reason.BAND_REQUESTS),
    ({"priorityBands": [{"priority": 0, "maxBytes": 250}]}, [("a", 0), ("b", 0), ("c", 0)], Reason.BAND_BYTES),
    ({"maxRequests": 2}, [("a", 0), ("b", 5), ("c", -1)], Reason.GLOBAL_REQUESTS),
    ({"maxBytes": "250"}, [("a", 0), ("b", 5), ("c", -1)], Reason.GLOBAL_BYTES),
    ({"defaultPriorityBand": {"maxRequests": 1}}, [("a", 3), ("b", 3)], Reason.BAND_REQUESTS),
], ids=["band-requests", "band-bytes", "global-requests", "global-bytes", "template-band"])
async def test_full_queues_reject_with_429_naming_the_limit(cfg: dict, sends: list, reason: str) -> None:
    clients, _ = await _saturated(cfg)
    rids = [await clients.send(t, p, size=100) for t, p in sends]
    *accepted, rejected = rids
    assert all(not clients.tasks[r].done() for r in accepted)
    err = clients.error(rejected)
    assert isinstance(err, Saturated) and err.status == 429 and err.reason == reason
    assert clients.ctrl.queued == len(accepted)


async def test_capacity_is_about_queued_requests_not_in_flight_ones() -> None:
    clients, detector = await _saturated({"maxRequests": 1})
    detector.value = 0.0
    first = await clients.send("a")
    await clients.dispatch()
    second = await clients.send("a")
    assert clients.grant(first) and clients.error(second) is None


# -- tenant quotas --------------------------------------------------------------------------------------------

async def test_over_max_concurrent_waits_instead_of_being_rejected() -> None:
    clients, detector = await _saturated({"tenants": {"a": {"maxConcurrent": 2}}})
    rids = [await clients.send("a") for _ in range(4)]
    detector.value = 0.0
    assert await clients.dispatch() == 2
    assert clients.ctrl.tenants.get("a").inflight == 2
    clients.grant(rids[0]).release()
    assert await clients.dispatch() == 1
    assert clients.order == rids[:3] and not clients.tasks[rids[3]].done()


async def test_tokens_in_flight_quota_waits_and_oversized_requests_are_rejected() -> None:
    clients, detector = await _saturated({"tenants": {"a": {"maxTokensInFlight": 50}}})
    detector.value = 0.0
    huge = await clients.send("a", tokens=60)
    assert _reason(clients, huge) == Reason.TENANT_TOKENS
    rids = [await clients.send("a", tokens=20) for _ in range(3)]
    await clients.dispatch()
    assert clients.order == rids[:2]  # 40 in flight; a third 20 would make 60 > 50
    clients.grant(rids[0]).release()
    await clients.dispatch()
    assert clients.order == rids and clients.ctrl.tenants.get("a").inflight_tokens == 40


async def test_tenant_queue_limit_rejects_only_that_tenant() -> None:
    clients, _ = await _saturated({"tenants": {"defaults": {"maxQueued": 2}}})
    a = [await clients.send("a") for _ in range(3)]
    b = await clients.send("b")
    assert _reason(clients, a[2]) == Reason.TENANT_QUEUE
    assert clients.error(b) is None and clients.ctrl.queued == 3


async def test_rate_limit_rejects_with_429_and_refills_with_time() -> None:
    clock = FakeClock()
    clients, _ = await _saturated({"tenants": {"a": {"rate": {"requestsPerSecond": 2, "burst": 3}}}}, clock)
    rids = [await clients.send("a") for _ in range(4)]
    assert [_reason(clients, r) for r in rids] == [None, None, None, Reason.TENANT_RATE]
    clock.advance(0.5)  # one token back
    assert _reason(clients, await clients.send("a")) is None
    assert _reason(clients, await clients.send("a")) == Reason.TENANT_RATE
    assert _reason(clients, await clients.send("b")) is None  # other tenants have their own bucket


async def test_a_capacity_rejection_does_not_spend_rate_budget() -> None:
    clients, _ = await _saturated({"maxRequests": 1, "tenants": {"a": {"rate": {"requestsPerSecond": 1}}}})
    await clients.send("b")
    assert _reason(clients, await clients.send("a")) == Reason.GLOBAL_REQUESTS
    clients.ctrl.config = FlowControlConfig.model_validate({"tenants": {"a": {"rate": {"requestsPerSecond": 1}}}})
    assert _reason(clients, await clients.send("a")) is None


async def test_release_is_idempotent_and_gives_the_quota_back_once() -> None:
    clients, detector = await _saturated({"tenants": {"a": {"maxConcurrent": 1}}})
    detector.value = 0.0
    first, second = await clients.send("a"), await clients.send("a")
    await clients.dispatch()
    grant = clients.grant(first)
    grant.release()
    grant.release()
    tenant = clients.ctrl.tenants.get("a")
    assert (tenant.inflight, tenant.inflight_tokens, grant.released) == (0, 0, True)
    await clients.dispatch()
    with clients.grant(second):
        assert tenant.inflight == 1
    assert tenant.inflight == 0


# -- TTL ------------------------------------------------------------------------------------------------------

async def test_requests_past_their_ttl_get_429_while_their_pool_has_endpoints() -> None:
    clock = FakeClock()
    clients, _ = await _saturated({"defaultRequestTTL": "5s", "tenants": {"patient": {"requestTTL": "1m"}}}, clock)
    short, long = await clients.send("a"), await clients.send("patient")
    clock.advance(4.9)
    assert clients.ctrl.expire() == 0
    clock.advance(0.2)
    assert clients.ctrl.expire() == 1
    await settle()
    err = clients.error(short)
    assert isinstance(err, Saturated) and err.status == 429 and err.reason == Reason.TTL
    assert err.dropped == "rejected-ttl-expired"
    assert not clients.tasks[long].done() and clients.ctrl.queued == 1
    assert clients.ctrl.tenants.get("a").queued == 0


async def test_ttl_zero_waits_until_the_client_leaves() -> None:
    clock = FakeClock()
    clients, _ = await _saturated({"defaultRequestTTL": "0s"}, clock)
    rid = await clients.send("a")
    clock.advance(10_000)
    assert clients.ctrl.expire() == 0 and not clients.tasks[rid].done()


# -- disconnect -----------------------------------------------------------------------------------------------

async def test_cancelled_waiter_leaves_its_queue_at_once() -> None:
    clients, _ = await _saturated({"tenants": {"a": {"maxQueued": 1}}})
    rid = await clients.send("a", size=100)
    clients.tasks[rid].cancel()
    await settle()
    ctrl = clients.ctrl
    assert (ctrl.queued, ctrl.queued_bytes, ctrl.bands[0].queued, ctrl.tenants.get("a").queued) == (0, 0, 0, 0)
    assert _reason(clients, await clients.send("a")) is None  # its queue slot is free again


async def test_a_waiter_cancelled_before_its_task_ran_is_never_dispatched() -> None:
    clients, detector = await _saturated({})
    gone, next_ = await clients.send("a"), await clients.send("a")
    clients.tasks[gone].cancel()  # the future is cancelled; the task has not handled it yet
    detector.value = 0.0
    assert clients.ctrl.dispatch() == 1
    await settle()
    assert clients.order == [next_] and clients.ctrl.tenants.get("a").inflight == 1


async def test_a_grant_the_cancelled_task_never_received_is_released() -> None:
    clients, detector = await _saturated({"tenants": {"a": {"maxConcurrent": 1}}})
    rid = await clients.send("a")
    detector.value = 0.0
    clients.ctrl.dispatch()
    clients.tasks[rid].cancel()  # dispatched, but cancelled before the task resumed
    await settle()
    assert clients.tasks[rid].cancelled()
    assert clients.ctrl.tenants.get("a").inflight == 0


async def test_stop_fails_waiting_requests_with_503() -> None:
    clients, _ = await _saturated({})
    rid = await clients.send("a")
    await clients.ctrl.stop()
    await settle()
    err = clients.error(rid)
    assert isinstance(err, RequestExpired) and err.reason == Reason.SHUTDOWN and clients.ctrl.queued == 0
    late = await clients.send("a")
    assert _reason(clients, late) == Reason.SHUTDOWN  # nothing would ever dispatch it


# -- background dispatcher ------------------------------------------------------------------------------------

async def test_background_dispatcher_admits_on_enqueue_release_and_tick() -> None:
    in_flight: list[Admission] = []  # what the request path counts right after admit() returns
    detector = FakeDetector(fn=lambda: len(in_flight) / 2)  # pool capacity: two requests
    ctrl = controller({"dispatchInterval": "10ms"}, detector=detector)

    async def client(fairness_id: str) -> Admission:
        admission = await ctrl.admit(make_request(fairness_id), list)
        in_flight.append(admission)
        return admission

    await ctrl.start()
    try:
        tasks = [asyncio.create_task(client("a")) for _ in range(3)]
        await asyncio.wait(tasks, timeout=5, return_when=asyncio.FIRST_COMPLETED)
        await settle()
        assert len(in_flight) == 2 and ctrl.queued == 1  # each admission was counted before the next dispatch
        first = in_flight.pop(0)
        first.release()
        await asyncio.wait_for(asyncio.gather(*tasks), timeout=5)  # the release woke the dispatcher
        detector.fn, detector.value = None, 1.0
        late = asyncio.create_task(client("b"))
        await settle()
        assert not late.done()
        detector.value = 0.0  # saturation drops with no enqueue or release: the tick must notice
        await asyncio.wait_for(late, timeout=5)
    finally:
        await ctrl.stop()


async def test_a_failing_detector_holds_requests_instead_of_crashing() -> None:
    detector = FakeDetector()
    detector.fn = lambda: 1 / 0
    clients = Clients(controller({}, detector=detector))
    rid = await clients.send("a")
    assert await clients.dispatch() == 0
    detector.fn = None
    assert await clients.dispatch() == 1 and clients.order == [rid]


# -- introspection --------------------------------------------------------------------------------------------

async def test_idle_unlisted_tenants_and_flows_are_forgotten() -> None:
    clock = FakeClock()
    clients, detector = await _saturated({"tenants": {"listed": {}}}, clock)
    detector.value = 0.0
    for tenant in ("listed", "passerby"):
        await clients.send(tenant, priority=7)
    await clients.dispatch()
    for rid in list(clients.order):
        clients.grant(rid).release()
    clock.advance(601)
    clients.ctrl.collect_idle(force=True)
    assert [t.fairness_id for t in clients.ctrl.tenants] == ["listed"]
    assert 7 not in clients.ctrl.bands and 0 not in clients.ctrl.bands


async def test_metrics_and_debug_snapshot() -> None:
    registry, clock = CollectorRegistry(), FakeClock()
    cfg = FlowControlConfig.model_validate({"tenants": {"a": {"maxConcurrent": 1, "maxQueued": 2}}})
    detector = FakeDetector(0.0)
    ctrl = build_admission(cfg, {"flowControl"}, detector, registry, clock, pool_name="pool")
    assert isinstance(ctrl, FlowController)
    clients = Clients(ctrl)
    rids = [await clients.send("a") for _ in range(3)]
    clock.advance(2.0)
    await clients.dispatch()

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value("inference_extension_flow_control_" + name, labels)

    item = {"fairness_id": "a", "priority": "0", "inference_pool": "pool", "model_name": "m",
            "target_model_name": "m"}
    assert value("queue_size", **item) == 1 and value("queue_bytes", **item) == 100
    assert value("request_queue_duration_seconds_count", outcome="Dispatched", **item) == 1
    assert value("request_queue_duration_seconds_sum", outcome="Dispatched", **item) == pytest.approx(2.0)
    assert value("rejections_total", fairness_id="a", priority="0", reason=Reason.TENANT_QUEUE,
                 inference_pool="pool") == 1
    assert value("tenant_inflight_requests", fairness_id="a", inference_pool="pool") == 1
    flow = {"fairness_id": "a", "priority": "0"}
    assert value("request_enqueue_duration_seconds_count", outcome="NotYetFinalized", **flow) == 2
    assert value("request_enqueue_duration_seconds_count", outcome="RejectedCapacity", **flow) == 1
    assert value("request_queue_duration_seconds_count", outcome="RejectedCapacity", **item) == 1
    assert value("pool_saturation", inference_pool="pool") == 0.0
    assert value("dispatch_cycle_duration_seconds_count") >= 1

    snap = ctrl.snapshot()
    tenant = snap["tenants"]["a"]
    assert tenant["inflight"] == {"requests": 1, "tokens": 20}
    assert tenant["queued"] == {"requests": 1, "bytes": 100, "byPriority": {"0": 1}}
    assert tenant["quota"]["maxConcurrent"] == 1 and tenant["rejected"] == {Reason.TENANT_QUEUE: 1}
    assert tenant["meanQueueWaitSeconds"] == pytest.approx(2.0) and rids


async def test_debug_tenants_endpoint_serves_the_snapshot_over_http() -> None:
    clients, _ = await _saturated({"tenants": {"gold": {"weight": 3}}})
    await clients.send("gold")
    app = web.Application()
    app.router.add_get(DEBUG_TENANTS_PATH, debug_tenants_handler(clients.ctrl))
    async with TestServer(app, host="127.0.0.1") as server, ClientSession() as session:
        async with session.get(server.make_url(DEBUG_TENANTS_PATH)) as resp:
            assert resp.status == 200 and resp.content_type == "application/json"
            body = await resp.json()
    assert body["flowControl"] is True
    assert body["tenants"]["gold"]["quota"]["weight"] == 3 and body["tenants"]["gold"]["queued"]["requests"] == 1
