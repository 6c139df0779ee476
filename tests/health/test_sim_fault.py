"""The simulator playing a wedged server: ``POST /sim/fault`` fails or holds inference requests while ``/metrics``,
``/health`` and ``/v1/models`` keep answering, and ``ok`` lets held requests go on."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from epp_sim import SimConfig, SimServer
from epp_sim.cli import build_configs, parse_args

from ..conftest import Servers, eventually

BODY = {"model": "m", "prompt": "hi", "max_tokens": 2}


async def test_a_wedged_server_keeps_answering_everything_but_inference(servers: Servers) -> None:
    sim = await servers.start(SimServer(SimConfig(model="m", time_scale=0.01)))
    async with aiohttp.ClientSession(base_url=sim.url) as s:
        async with s.post("/sim/fault", json={"mode": "fail", "status": 500}) as resp:
            assert resp.status == 200 and (await resp.json())["mode"] == "fail"
        async with s.post("/v1/completions", json=BODY) as resp:
            assert resp.status == 500
        async with s.post("/sim/fault", json={"mode": "hang"}):
            pass
        held = asyncio.create_task(s.post("/v1/completions", json=BODY))
        await eventually(lambda: sim.inference_requests == 2, "the second request to reach the server")
        for path in ("/metrics", "/health", "/v1/models"):
            async with s.get(path, timeout=aiohttp.ClientTimeout(total=5)) as resp:
                assert resp.status == 200, path
        assert not held.done()
        async with s.get("/sim/fault") as resp:
            state = await resp.json()
        assert state["mode"] == "hang" and state["inference_requests"] == 2
        async with s.post("/sim/fault", json={"mode": "ok"}):
            pass
        async with await held as resp:
            assert resp.status == 200  # the held request went on once the fault cleared


@pytest.mark.parametrize("body", [{"mode": "broken"}, {"mode": "fail", "status": 200}, {"mode": "fail", "status": "x"}],
                         ids=["mode", "status-range", "status-type"])
async def test_a_bad_fault_is_a_400(servers: Servers, body: dict[str, object]) -> None:
    sim = await servers.start(SimServer(SimConfig(model="m")))
    async with aiohttp.ClientSession() as s, s.post(sim.url + "/sim/fault", json=body) as resp:
        assert resp.status == 400
    assert sim.fault == "ok"


def test_the_fault_can_be_set_at_start() -> None:
    configs, _ = build_configs(parse_args(["--fault", "hang", "--failure-status", "502"]))
    assert (configs[0].fault, configs[0].failure_status) == ("hang", 502)
