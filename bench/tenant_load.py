"""Closed-loop tenants: keep several fairness ids backlogged on a gateway until enough requests completed.

Used wherever fair sharing is measured end to end (flow-control policies): each tenant runs ``clients``
closed-loop clients (one request at a time, the next as soon as the last answered), all sending the same body
with the tenant's ``x-gateway-inference-fairness-id``. The run stops once ``target`` requests completed in all;
a request that answers after that is not counted, so each tenant's count is its share of the first ``target``.
"""

from __future__ import annotations

import asyncio
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import AsyncIterator, Mapping

import aiohttp

from epp.framework.endpoint import EndpointSpec
from epp.headers import FAIRNESS_ID_HEADER
from epp.runtime.app import EppApp, ServeOptions
from epp_sim import SimConfig, SimPool

__all__ = ["Tenant", "TenantResult", "drive_tenants", "simulated_gateway"]


@dataclass(frozen=True)
class Tenant:
    """One tenant's load: ``clients`` closed-loop clients each sending ``body`` (JSON bytes)."""

    body: bytes
    clients: int


@dataclass
class TenantResult:
    """Completions counted for one tenant and the latency of each (seconds)."""

    served: int = 0
    latencies: list[float] = field(default_factory=list)


async def drive_tenants(url: str, tenants: Mapping[str, Tenant], target: int, *, path: str = "/v1/completions",
                        timeout: float = 120.0) -> dict[str, TenantResult]:
    """Run every tenant's clients against ``url + path`` until ``target`` completions in all (at most
    ``timeout`` seconds: ``TimeoutError``). Any answer other than 200 fails the run (AssertionError): a fair-share
    measurement over failed requests means nothing."""
    results = {name: TenantResult() for name in tenants}
    done = asyncio.Event()

    async def client(session: aiohttp.ClientSession, name: str, body: bytes) -> None:
        headers = {"content-type": "application/json", FAIRNESS_ID_HEADER: name}
        while not done.is_set():
            start = time.perf_counter()
            async with session.post(url + path, data=body, headers=headers) as resp:
                await resp.read()
                assert resp.status == 200, resp.status
            if done.is_set():
                return
            result = results[name]
            result.served += 1
            result.latencies.append(time.perf_counter() - start)
            if sum(r.served for r in results.values()) >= target:
                done.set()

    async with aiohttp.ClientSession() as session:
        tasks = [client(session, name, t.body) for name, t in tenants.items() for _ in range(t.clients)]
        await asyncio.wait_for(asyncio.gather(*tasks), timeout=timeout)
    return results


@asynccontextmanager
async def simulated_gateway(config: Path, *, servers: int = 2, time_scale: float = 0.05) -> AsyncIterator[EppApp]:
    """An EppApp with only its HTTP gateway (port 0) on ``config``, over ``servers`` simulated servers of model
    ``m`` (``time_scale`` speeds their time model up); stopped, with the servers, on exit."""
    async with SimPool([SimConfig(model="m", time_scale=time_scale, seed=i) for i in range(servers)]) as pool:
        specs = [EndpointSpec(name=f"s{i}", address="127.0.0.1", port=s.port) for i, s in enumerate(pool.servers)]
        app = EppApp(ServeOptions(config=str(config), endpoints=specs, host="127.0.0.1", grpc_port=None,
                                  metrics_port=None, http_port=0, refresh_interval=0.05))
        await app.start()
        try:
            yield app
        finally:
            await app.stop()
