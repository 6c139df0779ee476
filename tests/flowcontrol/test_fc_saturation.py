"""Saturation detectors (as detectors and as filters) and legacy admission (flow control off)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import orjson
import pytest
from aiohttp import web

from epp.errors import ConfigError, Saturated
from epp.flowcontrol import LegacyAdmission, NoopAdmission, Reason, build_admission
from epp.framework.endpoint import EndpointSpec, Metrics
from epp.framework.plugins import CycleState, Handle
from epp.plugins.saturation import ConcurrencyDetector, UtilizationDetector
from epp.runtime.app import EppApp, ServeOptions
from epp.runtime.builtins import default_registry

from ..conftest import eventually
from .helpers import FakeClock, FakeDetector, endpoint, make_request

NOW = 100.0


def _utilization(**params: object) -> UtilizationDetector:
    return UtilizationDetector("u", UtilizationDetector.Params.model_validate(params), Handle(),
                               clock=FakeClock(NOW))


def _concurrency(**params: object) -> ConcurrencyDetector:
    return ConcurrencyDetector("c", ConcurrencyDetector.Params.model_validate(params), Handle())


@pytest.mark.parametrize("endpoints, expected", [
    ([], 1.0),
    ([endpoint("a")], 0.0),
    ([endpoint("a", waiting=5)], 1.0),
    ([endpoint("a", kv=0.4)], 0.5),
    ([endpoint("a", waiting=1, kv=0.4)], 0.5),               # max(0.2, 0.5)
    ([endpoint("a", waiting=10), endpoint("b")], 1.0),       # mean(2.0, 0)
    ([endpoint("a", update_time=NOW - 0.3), endpoint("b")], 0.5),  # stale counts 1
    ([endpoint("a", update_time=0.0)], 1.0),                 # never scraped
    ([endpoint("a", update_time=NOW - 0.15)], 0.0),          # younger than 200 ms: fresh
], ids=["empty", "idle", "queue-full", "kv-half", "roofline-max", "mean", "stale", "never-scraped", "fresh"])
def test_utilization_saturation(endpoints: list, expected: float) -> None:
    assert _utilization().saturation(endpoints) == pytest.approx(expected)


@pytest.mark.parametrize("params, endpoints, kept", [
    ({}, [endpoint("a", waiting=4), endpoint("b", waiting=5), endpoint("c", kv=0.8)], ["a"]),
    ({"headroom": 0.2}, [endpoint("a", waiting=5), endpoint("b", waiting=6), endpoint("c", kv=0.9)], ["a", "c"]),
    ({}, [endpoint("a", update_time=NOW - 1), endpoint("b")], ["b"]),
    ({}, [endpoint("a", waiting=9), endpoint("b", kv=0.95)], ["a", "b"]),  # none passes: keep all
], ids=["thresholds", "headroom", "stale-dropped", "fallback-all"])
def test_utilization_filter(params: dict, endpoints: list, kept: list[str]) -> None:
    out = _utilization(**params).filter(CycleState(), make_request(), endpoints)
    assert [ep.name for ep in out] == kept


def test_utilization_parameters_use_yaml_names_and_durations() -> None:
    det = _utilization(queueDepthThreshold=2, kvCacheUtilThreshold=0.5, metricsStalenessThreshold="1s")
    assert det.saturation([endpoint("a", waiting=1, update_time=NOW - 0.9)]) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        _utilization(kvCacheUtilThreshold=1.5)


@pytest.mark.parametrize("waiting, running, inflight, expected", [
    (0, 0, 3, 0.6),     # 3 dispatched requests the scrape has not seen: (0 + 3) / 5
    (1, 2, 5, 0.6),     # credit 5 - (1 + 2) = 2: (1 + 2) / 5
    (2, 4, 3, 0.4),     # the scrape already shows more than EPP has in flight: no credit
], ids=["unscraped", "partly-scraped", "no-credit"])
def test_utilization_credits_inflight_requests_the_scrape_lags(waiting: int, running: int, inflight: int,
                                                               expected: float) -> None:
    ep = endpoint("a", waiting=waiting, inflight=inflight)
    ep.metrics = Metrics(waiting=waiting, running=running, update_time=NOW)
    det = _utilization(inFlightLoadProducerName="inflight-load-producer")
    assert det.saturation([ep]) == pytest.approx(expected)
    assert det.filter(CycleState(), make_request(), [ep]) == [ep]  # the filter reads the scrape alone


def test_utilization_producer_name_must_name_an_inflight_load_producer() -> None:
    registry, handle = default_registry(entry_points=False), Handle()
    handle.add(registry.create("inflight-load-producer", "load", None, handle))
    _utilization(inFlightLoadProducerName="load").bind(handle)
    with pytest.raises(ConfigError, match="inFlightLoadProducerName names plugin 'missing'"):
        _utilization(inFlightLoadProducerName="missing").bind(handle)


@pytest.mark.parametrize("params, endpoints, expected", [
    ({}, [], 1.0),
    ({"maxConcurrency": 10}, [endpoint("a", inflight=5), endpoint("b", inflight=10)], 0.75),
    ({"maxConcurrency": 10}, [endpoint("a", inflight=25)], 2.5),
    ({"concurrencyMode": "tokens", "maxTokenConcurrency": 100},
     [endpoint("a", inflight=50, inflight_tokens=30), endpoint("b", inflight_tokens=50)], 0.4),
    ({"concurrencyMode": "hybrid", "maxConcurrency": 10, "maxTokenConcurrency": 100},
     [endpoint("a", inflight=5, inflight_tokens=30), endpoint("b", inflight=5, inflight_tokens=50)], 0.5),
    ({"concurrencyMode": "hybrid", "maxConcurrency": 100, "maxTokenConcurrency": 100},
     [endpoint("a", inflight=5, inflight_tokens=30), endpoint("b", inflight=5, inflight_tokens=50)], 0.4),
], ids=["empty", "requests", "over", "tokens", "hybrid-requests-bind", "hybrid-tokens-bind"])
def test_concurrency_saturation(params: dict, endpoints: list, expected: float) -> None:
    assert _concurrency(**params).saturation(endpoints) == pytest.approx(expected)


@pytest.mark.parametrize("params, loads, kept", [
    ({"maxConcurrency": 10}, [9, 10, 0], ["e0", "e2"]),
    ({"maxConcurrency": 10, "headroom": 0.25}, [11, 12], ["e0"]),  # limit int(12.5) = 12
    ({"maxConcurrency": 1}, [1, 5], []),                            # no fallback
], ids=["limit", "headroom", "may-be-empty"])
def test_concurrency_filter(params: dict, loads: list[int], kept: list[str]) -> None:
    eps = [endpoint(f"e{i}", inflight=n) for i, n in enumerate(loads)]
    assert [ep.name for ep in _concurrency(**params).filter(CycleState(), make_request(), eps)] == kept


def test_concurrency_hybrid_filter_drops_an_endpoint_at_either_limit() -> None:
    """llm-d-router's concurrencyMode: hybrid: an endpoint is filtered out when its request load or its token
    load reaches the limit (capacity x (1 + headroom))."""
    det = _concurrency(concurrencyMode="hybrid", maxConcurrency=10, maxTokenConcurrency=1000, headroom=0.1)
    eps = [endpoint("ok", inflight=10, inflight_tokens=1099), endpoint("requests", inflight=11),
           endpoint("tokens", inflight_tokens=1100)]
    assert [ep.name for ep in det.filter(CycleState(), make_request(), eps)] == ["ok"]


class HeldServer:
    """An OpenAI-compatible upstream on 127.0.0.1 that answers only once ``release`` is set."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.arrived = asyncio.Event()
        self.runner: web.AppRunner | None = None
        self.port = 0

    async def _complete(self, request: web.Request) -> web.Response:
        await request.read()
        self.arrived.set()
        await self.release.wait()
        return web.json_response({"id": "x", "object": "text_completion", "model": "m", "choices": [
            {"index": 0, "text": "ok", "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 100, "completion_tokens": 1, "total_tokens": 101}})

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(text="vllm:num_requests_waiting 0\n")

    async def __aenter__(self) -> HeldServer:
        app = web.Application()
        app.router.add_post("/v1/completions", self._complete)
        app.router.add_get("/metrics", self._metrics)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", 0).start()
        self.port = self.runner.addresses[0][1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.release.set()
        assert self.runner is not None
        await self.runner.cleanup()


def gateway_app(config: Path, upstream: HeldServer) -> EppApp:
    """EPP with only its HTTP gateway, over ``upstream`` as endpoint ``s0``."""
    return EppApp(ServeOptions(config=str(config), endpoints=[EndpointSpec("s0", "127.0.0.1", upstream.port)],
                               host="127.0.0.1", grpc_port=None, health_port=None, metrics_port=None, http_port=0))


async def test_token_mode_counts_the_reference_inflight_estimate_not_max_tokens(tmp_path: Path) -> None:
    """In flight, a request weighs what the reference's inflight-load-producer books: bytes/4 of the request plus
    1.5x that for the output, whatever its ``max_tokens``."""
    config = tmp_path / "epp.yaml"
    config.write_text("plugins:\n- type: queue-scorer\n- type: concurrency-detector\n"
                      "  parameters: {concurrencyMode: tokens, maxTokenConcurrency: 1000}\n"
                      "saturationDetector: {pluginRef: concurrency-detector}\n"
                      "schedulingProfiles:\n- name: default\n  plugins: [{pluginRef: queue-scorer}]\n")
    body = orjson.dumps({"model": "m", "prompt": "x" * 400, "max_tokens": 4096})
    async with HeldServer() as upstream:
        app = gateway_app(config, upstream)
        await app.start()
        try:
            async with aiohttp.ClientSession() as session:
                pending = asyncio.create_task(session.post(app.gateway.url + "/v1/completions", data=body,
                                                           headers={"content-type": "application/json"}))
                await upstream.arrived.wait()
                ep = app.datastore.get("s0")
                assert ep is not None
                expected = len(body) // 4 + (3 * (len(body) // 4) + 1) // 2
                assert (ep.inflight_requests, ep.inflight_tokens) == (1, expected)
                assert app.pipeline.saturation_detector.saturation([ep]) == pytest.approx(expected / 1000)
                upstream.release.set()
                async with await pending as resp:
                    assert resp.status == 200
            assert (ep.inflight_requests, ep.inflight_tokens) == (0, 0)
        finally:
            await app.stop()


def test_detectors_are_registered_with_their_reference_defaults() -> None:
    registry, handle = default_registry(entry_points=False), Handle()
    util = registry.create("utilization-detector", "u", None, handle)
    conc = registry.create("concurrency-detector", "c", None, handle)
    assert (util.params.queue_depth_threshold, util.params.kv_cache_util_threshold,
            util.params.metrics_staleness_threshold, util.params.headroom) == (5, 0.8, 0.2, 0.0)
    assert (conc.params.concurrency_mode, conc.params.max_concurrency,
            conc.params.max_token_concurrency) == ("requests", 100, 1_000_000)


# -- legacy admission -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("priority, saturation, rejected", [
    (-1, 1.0, True), (-1, 0.99, False), (0, 5.0, False), (3, 1.0, False), (-5, 2.0, True),
], ids=["sheddable-saturated", "sheddable-below", "standard-saturated", "critical", "very-sheddable"])
async def test_legacy_drops_only_sheddable_requests_when_saturated(priority: int, saturation: float,
                                                                   rejected: bool) -> None:
    admission = build_admission(None, set(), FakeDetector(saturation), None)
    assert isinstance(admission, LegacyAdmission)
    request = make_request(priority=priority)
    if rejected:
        with pytest.raises(Saturated) as err:
            await admission.admit(request, list)
        assert err.value.status == 429 and err.value.reason == Reason.POOL_SATURATED
        assert admission.snapshot()["sheddableRejected"] == 1
    else:
        granted = await admission.admit(request, list)
        assert isinstance(granted, NoopAdmission)
        granted.release()
        granted.release()
        assert granted.released


async def test_legacy_reads_candidates_only_for_sheddable_requests() -> None:
    detector, calls = FakeDetector(0.0), []

    def candidates() -> list:
        calls.append(1)
        return [endpoint("a")]

    admission = LegacyAdmission(detector)
    await admission.admit(make_request(priority=0), candidates)
    await admission.admit(make_request(priority=-1), candidates)
    assert len(calls) == 1 and detector.seen == [1]


# -- why a request was dropped ----------------------------------------------------------------------------------

DROPPING_CONFIG = """\
featureGates: [flowControl]
plugins:
- type: queue-scorer
- type: concurrency-detector
  parameters: {maxConcurrency: 1}
saturationDetector: {pluginRef: concurrency-detector}
schedulingProfiles:
- name: default
  plugins: [{pluginRef: queue-scorer}]
flowControl:
  defaultRequestTTL: 1s
  priorityBands:
  - {priority: 0, maxRequests: 1}
"""


async def test_dropped_requests_say_why_in_the_reference_header(tmp_path: Path) -> None:
    """One request in flight saturates the pool: the next waits in the queue (room for one) until its TTL, the one
    after finds the queue full. Both answers carry the current reference's x-llm-d-request-dropped-reason."""
    config = tmp_path / "epp.yaml"
    config.write_text(DROPPING_CONFIG)
    body = orjson.dumps({"model": "m", "prompt": "hello"})
    post = {"data": body, "headers": {"content-type": "application/json"}}
    async with HeldServer() as upstream:
        app = gateway_app(config, upstream)
        await app.start()
        try:
            url = app.gateway.url + "/v1/completions"
            async with aiohttp.ClientSession() as session:
                held = asyncio.create_task(session.post(url, **post))
                await upstream.arrived.wait()
                queued = asyncio.create_task(session.post(url, **post))
                assert app.admission is not None
                await eventually(lambda: app.admission.queued == 1)  # type: ignore[union-attr]
                async with session.post(url, **post) as full:
                    assert full.status == 429
                    assert full.headers["x-llm-d-request-dropped-reason"] == "rejected-saturated"
                async with await queued as expired:  # its pool has endpoints: backpressure, as the reference
                    assert expired.status == 429
                    assert expired.headers["x-llm-d-request-dropped-reason"] == "rejected-ttl-expired"
                upstream.release.set()
                async with await held as served:
                    assert served.status == 200 and "x-llm-d-request-dropped-reason" not in served.headers
        finally:
            await app.stop()
