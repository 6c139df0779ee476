"""Flood vs steady tenants through EPP's admission controller, flow control off and on.

A simulated pool (``--endpoints`` model servers × ``--slots`` concurrent sequences, exponential service times with
mean ``--service``) sits behind the real :func:`epp.flowcontrol.build_admission` controller, driven exactly as the
request path drives it: ``admit`` → route to the least-loaded endpoint (counted in flight, which the
``concurrency-detector`` reads) → wait for a slot at the model server → serve → ``release``.

- ``flood`` (weight 1, ``maxQueued`` 256): open-loop Poisson arrivals at ``--flood`` × pool capacity.
- ``steady`` (weight 2): ``--steady`` closed-loop clients, each sending its next request when the last ends
  (after a 0.5 s back-off when rejected).

Queue wait is arrival → start of service (in EPP's queue and/or the model server's). Time is virtual (the event
loop jumps to the next timer), so a run is deterministic for a seed and takes a few seconds of CPU.

Usage::

    python -m bench.fairness                      # the README table
    python -m bench.fairness --seconds 300 --seed 7 --flood 3
"""

from __future__ import annotations

import argparse
import asyncio
import random
import selectors
import statistics
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from epp.errors import RequestExpired, Saturated
from epp.flowcontrol import AdmissionController, FlowControlConfig, build_admission
from epp.framework.endpoint import Endpoint, EndpointSpec
from epp.framework.plugins import Handle
from epp.framework.request import ApiKind, InferenceRequest
from epp.plugins.producers.inflight_load import InFlightLoadProducer
from epp.plugins.saturation import ConcurrencyDetector

__all__ = ["main", "run_scenario", "SimSettings", "TenantStats", "VirtualTimeLoop"]

TENANTS = {"flood": {"weight": 1, "maxQueued": 256}, "steady": {"weight": 2}}
MODES: dict[str, tuple[str, ...] | None] = {
    "off (legacy admission)": None,
    "on, global-strict": ("global-strict-fairness-policy",),
    "on, weighted-fair": ("weighted-fair-fairness-policy",),
}
REJECT_BACKOFF = 0.5


class _JumpSelector(selectors.SelectSelector):
    """Never blocks: when the loop would wait for a timer, virtual time jumps to it instead."""

    def __init__(self, loop: VirtualTimeLoop) -> None:
        super().__init__()
        self._vloop = loop

    def select(self, timeout: float | None = None) -> list[Any]:
        ready = super().select(0)
        if not ready and timeout is not None and timeout > 0:
            self._vloop.now += timeout
        elif not ready and timeout is None:
            raise RuntimeError("simulation deadlock: nothing is scheduled")
        return ready


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An event loop whose ``time()`` is virtual and advances only to the next scheduled timer."""

    def __init__(self) -> None:
        self.now = 0.0
        super().__init__(_JumpSelector(self))

    def time(self) -> float:
        return self.now


@dataclass
class SimSettings:
    endpoints: int = 4
    slots: int = 8
    service: float = 0.4
    flood: float = 2.0
    steady: int = 40
    seconds: float = 120.0
    warmup: float = 20.0
    seed: int = 1

    @property
    def capacity(self) -> float:
        """Requests per second the pool completes when busy."""
        return self.endpoints * self.slots / self.service


@dataclass
class TenantStats:
    offered: int = 0
    served: int = 0
    rejected: int = 0
    expired: int = 0
    waits: list[float] = field(default_factory=list)


class ModelServer:
    """``slots`` concurrent sequences; the rest wait FIFO (like a model server's waiting queue)."""

    def __init__(self, slots: int) -> None:
        self.free = slots
        self.waiting: deque[asyncio.Future[None]] = deque()

    async def acquire(self) -> None:
        if self.free > 0 and not self.waiting:
            self.free -= 1
            return
        fut = asyncio.get_running_loop().create_future()
        self.waiting.append(fut)
        await fut

    def release(self) -> None:
        while self.waiting:
            fut = self.waiting.popleft()
            if not fut.done():
                fut.set_result(None)
                return
        self.free += 1


class Simulation:
    """One scenario: the pool, the admission controller, the two tenants' load and the statistics."""

    def __init__(self, settings: SimSettings, admission: AdmissionController, rng: random.Random) -> None:
        self.s = settings
        self.admission = admission
        self.rng = rng
        self.loop = asyncio.get_running_loop()
        self.endpoints = [Endpoint(EndpointSpec(f"ep{i}", f"10.0.0.{i + 1}", 8000)) for i in range(settings.endpoints)]
        self.servers = {ep.name: ModelServer(settings.slots) for ep in self.endpoints}
        self.load = InFlightLoadProducer("inflight-load-producer", InFlightLoadProducer.Params(), Handle())
        self.stats = {name: TenantStats() for name in TENANTS}
        self._ids = 0

    def _in_window(self, t: float) -> bool:
        return self.s.warmup <= t < self.s.seconds

    def _request(self, tenant: str) -> InferenceRequest:
        self._ids += 1
        return InferenceRequest(request_id=f"{tenant}-{self._ids}", model="m", api=ApiKind.COMPLETIONS, body={},
                                prompt_text="", input_tokens=200, max_tokens=200, fairness_id=tenant,
                                body_size=1000)

    async def one_request(self, tenant: str) -> bool:
        """Run one request end to end; False if it was rejected or expired."""
        arrival, stats = self.loop.time(), self.stats[tenant]
        counted = self._in_window(arrival)
        stats.offered += counted
        request = self._request(tenant)
        try:
            admission = await self.admission.admit(request, lambda: self.endpoints)
        except Saturated:
            stats.rejected += counted
            return False
        except RequestExpired:
            stats.expired += counted
            return False
        endpoint = min(self.endpoints, key=lambda ep: ep.inflight_requests)
        tokens = self.load.tokens(request)  # what EPP's default inflight-load-producer books
        endpoint.add_inflight(tokens)
        server = self.servers[endpoint.name]
        try:
            await server.acquire()
            started = self.loop.time()
            await asyncio.sleep(self.rng.expovariate(1.0 / self.s.service))
            server.release()
        finally:
            endpoint.release_inflight(tokens)
            admission.release()
        if self._in_window(self.loop.time()):
            stats.served += 1
            stats.waits.append(started - arrival)
        return True

    async def flood(self) -> None:
        rate, tasks = self.s.flood * self.s.capacity, set()
        while self.loop.time() < self.s.seconds:
            await asyncio.sleep(self.rng.expovariate(rate))
            task = asyncio.create_task(self.one_request("flood"))
            tasks.add(task)
            task.add_done_callback(tasks.discard)

    async def steady_client(self) -> None:
        while self.loop.time() < self.s.seconds:
            if not await self.one_request("steady"):
                await asyncio.sleep(REJECT_BACKOFF)

    async def run(self) -> dict[str, TenantStats]:
        await self.admission.start()
        load = [asyncio.create_task(self.flood())]
        load += [asyncio.create_task(self.steady_client()) for _ in range(self.s.steady)]
        await asyncio.sleep(self.s.seconds)
        for task in asyncio.all_tasks() - {asyncio.current_task()}:
            task.cancel()
        await asyncio.gather(*load, return_exceptions=True)
        await self.admission.stop()
        return self.stats


def _admission(settings: SimSettings, fairness: tuple[str, ...] | None) -> AdmissionController:
    detector = ConcurrencyDetector("concurrency-detector",
                                   ConcurrencyDetector.Params(maxConcurrency=settings.slots), Handle())
    loop = asyncio.get_running_loop()
    if fairness is None:
        return build_admission(None, set(), detector, None, clock=loop.time)
    cfg = FlowControlConfig.model_validate({
        "priorityBands": [{"priority": 0, "fairnessPolicyRef": fairness[0]}],
        "tenants": TENANTS,
    })
    return build_admission(cfg, {"flowControl"}, detector, None, clock=loop.time)


def run_scenario(settings: SimSettings, fairness: tuple[str, ...] | None) -> dict[str, TenantStats]:
    """Simulate one mode (``fairness`` None = flow control off) and return per-tenant statistics."""
    loop = VirtualTimeLoop()
    try:
        async def scenario() -> dict[str, TenantStats]:
            return await Simulation(settings, _admission(settings, fairness), random.Random(settings.seed)).run()

        return loop.run_until_complete(scenario())
    finally:
        loop.close()


def _quantile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[round(q * 100) - 1]


def format_table(settings: SimSettings, results: dict[str, dict[str, TenantStats]]) -> str:
    """A Markdown table: one row per (mode, tenant)."""
    window = settings.seconds - settings.warmup
    lines = ["| flow control | tenant | weight | offered req/s | served req/s | share | wait p50 | wait p99 "
             "| 429 | 503 |", "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for mode, stats in results.items():
        total = sum(s.served for s in stats.values()) or 1
        for tenant, st in stats.items():
            lines.append(
                f"| {mode} | {tenant} | {TENANTS[tenant]['weight']} | {st.offered / window:.1f} | "
                f"{st.served / window:.1f} | {st.served / total:.0%} | {_quantile(st.waits, 0.5):.2f} s | "
                f"{_quantile(st.waits, 0.99):.2f} s | {st.rejected} | {st.expired} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Run every mode and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    defaults = SimSettings()
    for name in ("endpoints", "slots", "steady", "seed"):
        parser.add_argument(f"--{name}", type=int, default=getattr(defaults, name))
    for name in ("service", "flood", "seconds", "warmup"):
        parser.add_argument(f"--{name}", type=float, default=getattr(defaults, name))
    settings = SimSettings(**vars(parser.parse_args(argv)))
    results = {mode: run_scenario(settings, fairness) for mode, fairness in MODES.items()}
    print(f"pool: {settings.endpoints} endpoints x {settings.slots} slots, mean service {settings.service}s "
          f"-> capacity {settings.capacity:.0f} req/s; flood offers {settings.flood:g}x capacity, steady runs "
          f"{settings.steady} closed-loop clients; window {settings.warmup:g}-{settings.seconds:g}s (virtual), "
          f"seed {settings.seed}")
    print(format_table(settings, results))


if __name__ == "__main__":
    main()
