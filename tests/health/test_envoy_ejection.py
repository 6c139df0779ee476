"""Passive health through a real Envoy (``epp envoy-config``'s bootstrap: ext_proc plus override-host over EPP's
EDS), with ``EppApp`` serving ext_proc and xDS and simulated servers on 127.0.0.1.

EPP sees a failed request through ext_proc in two ways, one per parameter: a 500 comes back as the response's
``:status`` (Envoy does not retry it, so the client sees the configured failures and no more), and a 503 is retried
by Envoy on another endpoint, which EPP learns from the endpoint Envoy reports having served (the client sees
none). Either way the server is ejected, gets nothing but probes while ejected, and is readmitted once it recovers.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from epp.envoy.bootstrap import EnvoyConfigOptions, build_bootstrap
from epp.framework.endpoint import EndpointSpec
from epp.plugins.health.outlier_detector import PROBE_FAILED, OutlierDetector
from epp.runtime.app import EppApp, ServeOptions
from epp_sim import SimConfig, SimServer

from ..conftest import Servers, eventually
from ..extproc.envoy_harness import EnvoyProcess

pytestmark = pytest.mark.envoy

CONFIG = """
plugins:
- type: random-picker
- type: outlier-detector
  parameters: {consecutiveFailures: 3, baseEjectionTime: 200ms, maxEjectionTime: 400ms}
schedulingProfiles:
- name: default
  plugins: [{pluginRef: random-picker}]
"""
BODY = {"model": "m", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as s:
        yield s


async def pool_behind_envoy(envoy_bin: Path, tmp_path: Path,
                            servers: Servers) -> tuple[list[SimServer], OutlierDetector, str]:
    """Three simulators, an EPP (ext_proc and xDS) over them with CONFIG's detector, and a real Envoy in front:
    the simulators, the detector and Envoy's chat completions URL."""
    sims = [await servers.start(SimServer(SimConfig(model="m", time_scale=0.01, seed=i))) for i in range(3)]
    app = await servers.start(EppApp(ServeOptions(
        config_text=CONFIG, host="127.0.0.1", grpc_port=0, xds_port=0, health_port=None, metrics_port=None,
        plaintext=True, endpoints=[EndpointSpec(name=f"sim{i}", address="127.0.0.1", port=s.port)
                                   for i, s in enumerate(sims)])))
    health = app.pipeline.health
    assert isinstance(health, OutlierDetector)
    envoy = EnvoyProcess(envoy_bin, build_bootstrap(EnvoyConfigOptions(
        listen="127.0.0.1:0", admin="127.0.0.1:0", plaintext=True, epp=(f"127.0.0.1:{app.extproc.port}",),
        lb="override-host", xds=(f"127.0.0.1:{app.xds.port}",))), tmp_path)
    servers.defer(envoy.stop)
    await asyncio.to_thread(envoy.start)
    return sims, health, f"http://127.0.0.1:{envoy.port}/v1/chat/completions"


@pytest.mark.parametrize("status", [500, 503], ids=["500-passed-to-the-client", "503-retried-by-envoy"])
async def test_envoy_a_failing_server_is_ejected_gets_only_probes_and_is_readmitted(
        envoy_bin: Path, tmp_path: Path, servers: Servers, session: aiohttp.ClientSession, status: int) -> None:
    sims, health, url = await pool_behind_envoy(envoy_bin, tmp_path, servers)
    events: list[tuple[str, str | None]] = []
    health.on_ejection(lambda ep, reason: events.append((ep.name, reason)))
    wedged = sims[0]
    wedged.set_fault("fail", status)
    statuses: list[int] = []

    async def post() -> int:
        async with session.post(url, json=BODY) as resp:
            await resp.read()
            statuses.append(resp.status)
            return resp.status

    async def until_ejected() -> bool:
        await post()
        return health.ejected() == ["sim0"]

    await eventually(until_ejected, "sim0's ejection")
    failed_probes = lambda: events.count(("sim0", PROBE_FAILED))  # noqa: E731
    assert wedged.inference_requests - failed_probes() == 3
    assert statuses.count(status) == (3 if status == 500 else 0)  # Envoy retries a 503 elsewhere
    before = len(statuses)
    for _ in range(20):
        assert await post() == 200
    await eventually(lambda: wedged.inference_requests == 3 + failed_probes(),
                     lambda: f"{wedged.inference_requests} requests on sim0, {events}")
    assert health.ejected() == ["sim0"] and len(statuses) == before + 20

    wedged.set_fault("ok")
    await eventually(lambda: health.ejected() == [], "the probe that readmits sim0")
    readmitted = wedged.inference_requests

    async def served_by_sim0() -> bool:
        assert await post() == 200
        return wedged.inference_requests > readmitted

    await eventually(served_by_sim0, "a client request on sim0 again")


async def test_envoy_with_every_server_failing_epp_still_routes(
        envoy_bin: Path, tmp_path: Path, servers: Servers, session: aiohttp.ClientSession) -> None:
    """Ejection never empties the pool: with every server failing, at most maxEjectionPercent (here one of three)
    is ejected, every request still reaches a model server through Envoy, and clients get the servers' 500s."""
    sims, health, url = await pool_behind_envoy(envoy_bin, tmp_path, servers)
    for sim in sims:
        sim.set_fault("fail", 500)
    statuses = []
    for _ in range(20):
        async with session.post(url, json=BODY) as resp:
            body = await resp.json()
            statuses.append(resp.status)
            assert "error" in body
    assert statuses == [500] * 20
    assert len(health.ejected()) <= 1
    assert sum(sim.inference_requests for sim in sims) >= 20  # every request reached a server (plus any probe)
