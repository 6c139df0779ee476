"""Passive health through the HTTP gateway: ``EppApp`` serving real simulated servers on 127.0.0.1, a real client.

A server that answers ``/metrics`` but fails every inference request is ejected after the configured failures
(the gateway retries each failed attempt elsewhere, so clients see none of them), receives nothing but probes
while ejected, and is readmitted by a probe once it recovers. A hung server is ejected by the first-byte timeout.
With every server failing, EPP still routes: clients get the model servers' errors, never "no endpoints".
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
import orjson
import pytest

from epp.framework.endpoint import EndpointSpec
from epp.plugins.health.outlier_detector import CONSECUTIVE, PROBE_FAILED, OutlierDetector
from epp.runtime.app import EppApp, ServeOptions
from epp_sim import SimConfig, SimServer

from ..conftest import Servers, eventually

CONFIG = """
plugins:
- type: random-picker
- type: outlier-detector
  parameters: %s
schedulingProfiles:
- name: default
  plugins: [{pluginRef: random-picker}]
"""
BODY = {"model": "m", "prompt": "hello there", "max_tokens": 4}


class Pool:
    """``EppApp`` (gateway and metrics ports) over simulated servers, a client session and the ejection events."""

    def __init__(self, app: EppApp, sims: list[SimServer], session: aiohttp.ClientSession) -> None:
        self.app, self.sims, self.session = app, sims, session
        health = app.pipeline.health
        assert isinstance(health, OutlierDetector)
        self.health = health
        self.events: list[tuple[str, str | None]] = []
        health.on_ejection(lambda ep, reason: self.events.append((ep.name, reason)))

    async def post(self, timeout: float | None = None, stream: bool = False) -> tuple[int, bytes]:
        assert self.app.gateway is not None
        async with self.session.post(self.app.gateway.url + "/v1/completions", json={**BODY, "stream": stream},
                                     timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
            return resp.status, await resp.read()

    def failed_probes(self, name: str) -> int:
        return self.events.count((name, PROBE_FAILED))

    async def metrics(self) -> str:
        async with self.session.get(f"http://127.0.0.1:{self.app.metrics_port}/metrics") as resp:
            return await resp.text()


PoolFactory = Callable[..., Awaitable[Pool]]


@pytest.fixture
async def pool(servers: Servers) -> AsyncIterator[PoolFactory]:
    async def start(n: int, params: str) -> Pool:
        sims = [await servers.start(SimServer(SimConfig(model="m", time_scale=0.01, seed=i))) for i in range(n)]
        app = EppApp(ServeOptions(config_text=CONFIG % params, host="127.0.0.1", grpc_port=None, health_port=None,
                                  metrics_port=0, http_port=0,
                                  endpoints=[EndpointSpec(name=f"sim{i}", address="127.0.0.1", port=s.port)
                                             for i, s in enumerate(sims)]))
        await servers.start(app)
        session = aiohttp.ClientSession()
        servers.defer(session.close)
        return Pool(app, sims, session)

    yield start


async def test_a_failing_server_is_ejected_gets_only_probes_and_is_readmitted_once_it_recovers(
        pool: PoolFactory) -> None:
    p = await pool(3, "{consecutiveFailures: 3, baseEjectionTime: 200ms, maxEjectionTime: 400ms}")
    wedged = p.sims[0]
    wedged.set_fault("fail", 500)  # /metrics and /health still answer

    async def until_ejected() -> bool:
        status, _ = await p.post()
        assert status == 200  # the gateway retried the failed attempt on another server
        return p.health.ejected() == ["sim0"]

    await eventually(until_ejected, "sim0's ejection")
    assert p.events[0] == ("sim0", CONSECUTIVE)
    assert wedged.inference_requests - p.failed_probes("sim0") == 3  # exactly the configured failures

    for _ in range(30):  # ejected: clients never reach it, only the probes do (and fail: it is still wedged)
        assert (await p.post())[0] == 200
    await eventually(lambda: p.failed_probes("sim0") >= 1, "a failed probe")
    await eventually(lambda: wedged.inference_requests == 3 + p.failed_probes("sim0"),
                     lambda: f"{wedged.inference_requests} requests on sim0, {p.events}")
    assert p.health.ejected() == ["sim0"]

    wedged.set_fault("ok")
    await eventually(lambda: p.health.ejected() == [], "the probe that readmits sim0")
    readmitted = wedged.inference_requests

    async def served_by_sim0() -> bool:
        assert (await p.post())[0] == 200
        return wedged.inference_requests > readmitted

    await eventually(served_by_sim0, "a client request on sim0 again")
    text = await p.metrics()
    assert 'llm_d_epp_endpoint_ejections_total{endpoint_name="sim0",reason="consecutive_failures"} 1.0' in text
    assert 'llm_d_epp_ejected_endpoints{name="static-pool"} 0.0' in text


async def test_a_hung_server_is_ejected_by_the_first_byte_timeout(pool: PoolFactory) -> None:
    p = await pool(3, "{consecutiveFailures: 2, firstByteTimeout: 300ms, baseEjectionTime: 30s}")
    p.sims[0].set_fault("hang")

    async def one() -> int:
        try:
            return (await p.post(timeout=5, stream=True))[0]  # streamed: a first byte is expected soon
        except asyncio.TimeoutError:
            return 0  # a request that went to the hung server before its ejection

    async def until_ejected() -> bool:
        await asyncio.gather(*(one() for _ in range(4)))
        return p.health.ejected() == ["sim0"]

    await eventually(until_ejected, "sim0's ejection")
    statuses = await asyncio.gather(*(one() for _ in range(20)))
    assert statuses == [200] * 20


async def test_with_every_server_failing_epp_still_routes_and_clients_get_the_servers_errors(
        pool: PoolFactory) -> None:
    p = await pool(2, "{consecutiveFailures: 2, maxEjectionPercent: 100}")
    for sim in p.sims:
        sim.set_fault("fail", 500)
    answers = [await p.post() for _ in range(12)]
    assert len(p.health.ejected()) == 1  # never the last one
    for status, body in answers:
        assert status == 500, body  # the model server's error, not EPP's 503 "no endpoints"
        assert "injected failure" in orjson.loads(body)["error"]["message"]
    assert p.app.director is not None and p.app.director.candidates() != []
