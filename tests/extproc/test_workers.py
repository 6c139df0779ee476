"""Several EPP workers sharing state over PeerLink: unit-level (two links in one loop) and through a real Envoy that
spreads ext_proc streams over two EPP ports."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import aiohttp
import orjson
import pytest
from prometheus_client import CollectorRegistry

from epp.config.loader import DataLayerSpec
from epp.datalayer.wiring import build_scraper
from epp.envoy.bootstrap import EnvoyConfigOptions, build_bootstrap
from epp.extproc import ExtProcServer
from epp.framework.endpoint import EndpointSpec
from epp.framework.plugins import ResponseInfo
from epp.metrics.families import EppMetrics
from epp.runtime.builtins import default_registry
from epp.runtime.workers import PeerLink, run_workers

from ..conftest import Servers, eventually
from .envoy_harness import EnvoyProcess
from .helpers import CHAT, Recorder, make_director, specs

PREFIX = "Shared system prompt for the whole fleet. " * 60


@pytest.fixture
def linked(tmp_path, servers: Servers):  # type: ignore[no-untyped-def]
    """``await linked(*directors, period=0.01)`` -> started peer links, one per director (worker i of n); stopped
    after."""

    async def factory(*directors, period=0.01):  # type: ignore[no-untyped-def]
        links = []
        for i, director in enumerate(directors):
            link = PeerLink(i, len(directors), tmp_path / "mesh", period=period)
            link.attach(director)
            links.append(await servers.start(link))
        return links

    return factory


async def test_inflight_counts_are_shared_and_released(linked) -> None:
    a, b = make_director(specs(2)), make_director(specs(2))
    await linked(a, b)
    request = a.parse("/v1/chat/completions", CHAT, {})
    ctx = await a.route(request)
    name = ctx.target.name
    remote = b.datastore.get(name)
    await eventually(lambda: remote.inflight_requests == 1 and remote.inflight_tokens == ctx.tokens)
    local_b = await b.route(b.parse("/v1/chat/completions", CHAT, {}), [ctx.target.hostport])
    await eventually(lambda: ctx.target.inflight_requests == 2)  # a sees b's request too
    a.response_complete(ctx, ResponseInfo())
    await eventually(lambda: remote.inflight_requests == 1)  # only b's own request is left
    b.response_complete(local_b, ResponseInfo())
    await eventually(lambda: ctx.target.inflight_requests == 0 and remote.inflight_requests == 0)


async def test_prefix_index_updates_are_replayed_on_peers(linked) -> None:
    a, b = make_director(specs(3)), make_director(specs(3))
    await linked(a, b)
    body = orjson.dumps({"model": "m", "messages": [{"role": "system", "content": PREFIX},
                                                     {"role": "user", "content": "q"}]})
    first = await a.route(a.parse("/v1/chat/completions", body, {}))
    producer_b = b.pipeline.handle.first_of_type("approx-prefix-cache-producer")
    await eventually(lambda: first.target.name in producer_b.indexed_endpoints())
    for _ in range(5):
        ctx = await b.route(b.parse("/v1/chat/completions", body, {}))
        assert ctx.target.name == first.target.name


async def test_the_cost_models_bookings_are_shared_as_they_change(linked) -> None:
    config = Path(__file__).resolve().parents[2].joinpath("config", "cost-model.yaml").read_text()
    a, b = make_director(specs(2), config), make_director(specs(2), config)
    links = await linked(a, b, period=3600)  # no periodic publication within the test: only the changes are sent
    scorer_a = a.pipeline.handle.first_of_type("ttft-cost-scorer")
    scorer_b = b.pipeline.handle.first_of_type("ttft-cost-scorer")
    ctx = await a.route(a.parse("/v1/chat/completions", CHAT, {}))
    await eventually(lambda: scorer_b.local_load() == {} and scorer_b.peer_totals.get(ctx.target.name, (0,))[0] == 1)
    ctx_b = await b.route(b.parse("/v1/chat/completions", CHAT, {}))
    assert ctx_b.target.name != ctx.target.name  # b sees a's queued request although it never booked it
    a.response_complete(ctx, ResponseInfo())
    b.response_complete(ctx_b, ResponseInfo())
    await eventually(lambda: not scorer_a.peer_totals and not scorer_b.peer_totals)
    links[1]._apply_load(7, {"ttft-cost-scorer": {ctx.target.name: (1, 1.0, 0, 0.0, 0.0)}})  # no worker 7
    assert not scorer_b.peer_totals


async def test_scraped_metrics_flow_from_worker_zero(linked) -> None:
    a, b = make_director(specs(2)), make_director(specs(2))
    await linked(a, b)
    ep_a = a.datastore.get("ep1")
    ep_a.metrics = dataclasses.replace(ep_a.metrics, waiting=7, kv_usage=0.5)
    ep_a.healthy = False
    ep_b = b.datastore.get("ep1")
    await eventually(lambda: ep_b.metrics.waiting == 7 and not ep_b.healthy)
    assert ep_b.metrics == ep_a.metrics
    b.datastore.get("ep0").metrics = dataclasses.replace(b.datastore.get("ep0").metrics, waiting=99)
    await asyncio.sleep(0.1)
    assert a.datastore.get("ep0").metrics.waiting == 0  # only worker 0 publishes metrics


async def test_request_metrics_of_every_worker_reach_worker_zero(tmp_path) -> None:
    metrics = [EppMetrics(CollectorRegistry()) for _ in range(2)]
    a, b = (make_director(specs(2), metrics=m) for m in metrics)
    links = [PeerLink(i, 2, tmp_path / "mesh", period=0.01, metrics_period=0.02) for i in range(2)]
    for link, director in zip(links, (a, b)):
        link.attach(director)
        await link.start()
    try:
        for director, n in ((a, 2), (b, 3)):
            for _ in range(n):
                ctx = await director.route(director.parse("/v1/chat/completions", CHAT, {}))
                director.response_complete(ctx, ResponseInfo(prompt_tokens=4, completion_tokens=2))

        def reported(registry: CollectorRegistry, name: str = "inference_objective_request_total") -> float:
            return registry.get_sample_value(name, {"model_name": "m", "target_model_name": "m",
                                                    "priority": "0"}) or 0.0

        await eventually(lambda: reported(metrics[0].registry) == 5)
        assert reported(metrics[1].registry) == 3  # the others report only their own (they serve no /metrics)
        new = {"model_name": "m", "target_model_name": "m", "priority": "0"}
        assert sum(s.value for f in metrics[0].registry.collect() if f.name == "llm_d_epp_request"
                   for s in f.samples if new.items() <= s.labels.items()) == 5  # the new family sums peers too
    finally:
        for link in links:
            await link.stop()


def test_peer_link_index_must_be_in_range(tmp_path) -> None:
    with pytest.raises(ValueError):
        PeerLink(2, 2, tmp_path)
    with pytest.raises(ValueError):
        run_workers(0, print)


def _exit_with_index(index: int, size: int, directory: str, base: int) -> None:
    raise SystemExit(base + index if index == 1 else 0)


def test_run_workers_starts_each_index_and_reports_a_failure(tmp_path) -> None:
    assert run_workers(2, _exit_with_index, 0, directory=tmp_path) == 1
    assert run_workers(3, _exit_with_index, 40) == 41


@pytest.mark.envoy
async def test_two_workers_behind_envoy_keep_prefix_affinity(envoy_bin, tmp_path, sims) -> None:
    servers = await sims(3)
    pool = [EndpointSpec(name=f"sim{i}", address=s.host, port=s.port) for i, s in enumerate(servers)]
    recorders = [Recorder(), Recorder()]
    directors = [make_director(pool, metrics=rec) for rec in recorders]
    links, epps = [], []
    for i, director in enumerate(directors):
        link = PeerLink(i, 2, tmp_path / "mesh", period=0.01)
        link.attach(director)
        await link.start()
        links.append(link)
        server = ExtProcServer(director, host="127.0.0.1", port=0, health_port=None, plaintext=True)
        await server.start()
        epps.append(server)
    boot = build_bootstrap(EnvoyConfigOptions(listen="127.0.0.1:0", admin="127.0.0.1:0", plaintext=True,
                                              epp=tuple(f"127.0.0.1:{s.port}" for s in epps)))
    hcm = boot["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    hcm["route_config"]["virtual_hosts"][0]["routes"][0]["response_headers_to_add"] = [
        {"header": {"key": "x-served-by", "value": "%UPSTREAM_REMOTE_ADDRESS%"}}]
    envoy = EnvoyProcess(envoy_bin, boot, tmp_path)
    await asyncio.to_thread(envoy.start)
    try:
        producers = [d.pipeline.handle.first_of_type("approx-prefix-cache-producer") for d in directors]
        served = set()
        async with aiohttp.ClientSession() as session:
            for i in range(8):
                body = {"model": "m", "max_tokens": 2,
                        "messages": [{"role": "system", "content": PREFIX}, {"role": "user", "content": f"q{i}"}]}
                async with session.post(f"http://127.0.0.1:{envoy.port}/v1/chat/completions", json=body) as resp:
                    assert resp.status == 200
                    served.add(resp.headers["x-served-by"])
                # whichever worker routed it, both indexes know the prefix before the next request
                await eventually(lambda: all(p.indexed_endpoints() for p in producers))
        assert all(rec.requests > 0 for rec in recorders)  # Envoy spread the streams over both workers
        assert len(served) == 1  # yet every request went where the first one did
    finally:
        envoy.stop()
        for server in epps:
            await server.stop(0)
        for link in links:
            await link.stop()


def test_non_scraping_workers_turn_collection_off() -> None:
    director = make_director(specs(1))
    director.pipeline.config.data_layer = DataLayerSpec(sources=[])
    assert build_scraper(director.pipeline.config, director.pipeline.handle, default_registry(entry_points=False),
                         director.datastore) is None


async def test_an_endpoint_a_worker_discovers_late_takes_the_scrape_owners_state(linked) -> None:
    """Worker 1 discovers endpoints on its own. Before worker 0's state for one arrives it is not healthy (it
    was never scraped); a state that arrived before the endpoint was discovered is applied on discovery."""
    a, b = make_director(specs(2)), make_director(specs(1))
    await linked(a, b)
    late = specs(2)[1]
    ep_a = a.datastore.get(late.name)
    ep_a.metrics = dataclasses.replace(ep_a.metrics, waiting=5)
    await asyncio.sleep(0.1)  # worker 0 published a state for an endpoint worker 1 does not know yet
    ep_b = b.datastore.upsert(late)
    assert ep_b.metrics.waiting == 5 and ep_b.healthy == ep_a.healthy
    unknown = b.datastore.upsert(EndpointSpec("ep9", "10.0.0.9", 8000))
    assert not unknown.healthy  # nothing from the owner yet
