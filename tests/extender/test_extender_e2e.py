"""``epp serve``'s scheduler extender against simulated model servers: kube-scheduler's JSON in, live placement out.

Two simulated vLLM servers on nodes gpu-a and gpu-b (an endpoints file with ``node:``), node cpu-c without any; EPP
scrapes them every 20 ms with the default saturation detector (queue depth 5, KV 80 %). Requests sent straight to
gpu-a's server fill its queue (one sequence at a time, real-time steps), which EPP sees in the next scrapes.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from epp.extender.placement import SATURATED_REASON
from epp.runtime.app import EppApp, ServeOptions
from epp_sim import SimConfig, SimServer

from ..conftest import Servers, eventually

POD = (b'{"metadata":{"name":"vllm-7d9f-x2x","namespace":"llm","labels":{"app":"vllm","pod-template-hash":"7d9f"}},'
       b'"spec":{"containers":[{"name":"vllm","image":"vllm/vllm-openai"}]},"status":{"phase":"Pending"}}')
DECODE_POD = POD.replace(b'"app":"vllm"', b'"app":"vllm","llm-d.ai/role":"decode"')
EPP_POD = b'{"metadata":{"name":"epp-5c4b-q8r","namespace":"llm","labels":{"app":"epp"}},"spec":{}}'
NAMES = b',"Nodes":null,"NodeNames":["gpu-a","gpu-b","cpu-c"]}'


def node(name: str) -> bytes:
    return (b'{"metadata":{"name":"' + name.encode() + b'","labels":{"kubernetes.io/hostname":"' + name.encode()
            + b'"}},"spec":{},"status":{"allocatable":{"nvidia.com/gpu":"8"}}}')


NODE_LIST = (b',"Nodes":{"kind":"NodeList","apiVersion":"v1","metadata":{"resourceVersion":"42"},"items":['
             + node("gpu-a") + b"," + node("gpu-b") + b"," + node("cpu-c") + b']},"NodeNames":null}')


class Extender:
    """kube-scheduler's side of the extender protocol: POSTs ExtenderArgs, reads the answer."""

    def __init__(self, session: aiohttp.ClientSession, app: EppApp) -> None:
        self.session, self.url, self.app = session, f"http://127.0.0.1:{app.extender.port}", app

    async def call(self, verb: str, pod: bytes, nodes: bytes = NAMES) -> Any:
        async with self.session.post(f"{self.url}/{verb}", data=b'{"Pod":' + pod + nodes,
                                     headers={"Content-Type": "application/json"}) as resp:
            assert resp.status == 200, await resp.text()
            return orjson.loads(await resp.read())

    async def scores(self, pod: bytes = POD) -> dict[str, int]:
        return {entry["Host"]: entry["Score"] for entry in await self.call("prioritize", pod)}


@pytest.fixture
async def pool(servers: Servers) -> list[SimServer]:
    loaded = SimServer(SimConfig(model="m", max_num_seqs=1, time_scale=1.0))  # its queue outlives the test
    idle = SimServer(SimConfig(model="m", time_scale=0.01, seed=1))
    return [await servers.start(sim, "127.0.0.1", 0) for sim in (loaded, idle)]


@pytest.fixture
async def extender(pool: list[SimServer], servers: Servers, tmp_path: Path) -> AsyncIterator[Extender]:
    endpoints = tmp_path / "endpoints.yaml"
    endpoints.write_text(
        "endpoints:\n"
        f"  - {{name: sim-a, address: 127.0.0.1, port: {pool[0].port}, node: gpu-a,\n"
        "     labels: {app: vllm, llm-d.ai/role: decode, pod-template-hash: 7d9f}}\n"
        f"  - {{name: sim-b, address: 127.0.0.1, port: {pool[1].port}, node: gpu-b,\n"
        "     labels: {app: vllm, llm-d.ai/role: prefill, pod-template-hash: 61aa}}\n")
    options = ServeOptions(endpoints_file=str(endpoints), host="127.0.0.1", grpc_port=None, health_port=None,
                           metrics_port=None, scheduler_extender_port=0, refresh_interval=0.02)
    app = await servers.start(EppApp(options))
    await app.wait_ready()
    await eventually(lambda: all(ep.metrics.update_time > 0 and ep.healthy for ep in app.datastore.endpoints()),
                     "both simulators scraped")
    async with aiohttp.ClientSession() as session:
        yield Extender(session, app)


async def fill_queue(session: aiohttp.ClientSession, sim: SimServer, n: int) -> list[asyncio.Task[None]]:
    """``n`` long streamed requests straight to ``sim``; cancelling a task aborts its request there."""

    async def hog() -> None:
        body = {"model": "m", "prompt": "hold the line", "max_tokens": 3000, "stream": True}
        async with session.post(sim.url + "/v1/completions", json=body) as resp:
            async for _ in resp.content.iter_any():
                pass

    return [asyncio.create_task(hog()) for _ in range(n)]


async def test_filter_and_scores_follow_the_live_load(extender: Extender, pool: list[SimServer]) -> None:
    assert await extender.scores() == {"gpu-a": 10, "gpu-b": 10, "cpu-c": 10}
    assert (await extender.call("filter", POD))["NodeNames"] == ["gpu-a", "gpu-b", "cpu-c"]

    hogs = await fill_queue(extender.session, pool[0], 8)  # 1 running, 7 waiting: 7 / 5 ≥ 1, saturated
    try:
        busy = extender.app.datastore.get("sim-a")
        await eventually(lambda: busy is not None and busy.metrics.waiting >= 6, "sim-a's queue seen by EPP")
        assert await extender.call("filter", POD) == {
            "NodeNames": ["gpu-b", "cpu-c"], "FailedNodes": {"gpu-a": SATURATED_REASON},
            "FailedAndUnresolvableNodes": {}, "Error": ""}
        listed = await extender.call("filter", POD, NODE_LIST)
        assert listed["Nodes"] == {"kind": "NodeList", "apiVersion": "v1", "metadata": {"resourceVersion": "42"},
                                   "items": [orjson.loads(node("gpu-b")), orjson.loads(node("cpu-c"))]}
        assert listed["FailedNodes"] == {"gpu-a": SATURATED_REASON}
        assert await extender.scores() == {"gpu-a": 0, "gpu-b": 10, "cpu-c": 10}
        # an EPP pod is not refused the busy node, only ranked below the others
        assert (await extender.call("filter", EPP_POD))["NodeNames"] == ["gpu-a", "gpu-b", "cpu-c"]
        assert await extender.scores(EPP_POD) == {"gpu-a": 0, "gpu-b": 10, "cpu-c": 10}
    finally:
        for task in hogs:
            task.cancel()
        await asyncio.gather(*hogs, return_exceptions=True)

    async def recovered() -> bool:
        return await extender.scores() == {"gpu-a": 10, "gpu-b": 10, "cpu-c": 10}

    await eventually(recovered, "gpu-a's score back at 10 once its queue drained")
    assert (await extender.call("filter", POD, NODE_LIST))["FailedNodes"] == {}


async def test_a_decode_pod_goes_near_prefill_capacity(extender: Extender) -> None:
    # gpu-b holds the prefill server: ¾ of the score; gpu-a (a decode server) and cpu-c have no prefill: ¼ · 1.0
    assert await extender.scores(DECODE_POD) == {"gpu-a": 3, "gpu-b": 10, "cpu-c": 3}


async def test_a_stopped_server_is_unknown_not_idle(extender: Extender, pool: list[SimServer]) -> None:
    await pool[0].stop()
    gone = extender.app.datastore.get("sim-a")
    await eventually(lambda: gone is not None and not gone.healthy, "sim-a marked unhealthy by the scraper")
    assert await extender.scores() == {"gpu-a": 0, "gpu-b": 10, "cpu-c": 10}
    assert (await extender.call("filter", POD))["FailedNodes"] == {}  # no evidence of saturation: not refused
