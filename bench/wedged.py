"""A wedged model server under load, with passive health off and on: how many requests fail, and TTFT.

Four simulated vLLM servers behind EPP's HTTP gateway (all in this process), the reference's default scoring
(queue 2, KV-cache 2, prefix 3) and a bounded open-loop load: Poisson arrivals at ``--rate`` for ``--duration``
seconds, chat requests of ``--tenants`` shared system prompts, streamed. At ``--wedge-at`` seconds one server is
wedged over its ``POST /sim/fault`` admin route: it keeps answering ``/metrics`` (its queue looks empty, its
cache warm) but answers every inference request with a 500 (``--fault fail``) or never (``--fault hang``). The
same load runs twice on fresh servers, with the ``outlier-detector`` off (``consecutiveFailures: 0``) and on
(its defaults, plus ``--first-byte-timeout`` if given), and prints per run: requests, failed requests (any answer
but a 200, or none within ``--timeout``), those that failed after the first ejection, ejections, and TTFT p50/p99
of the answered requests (client side, first streamed chunk). Gateway retries are ``--retries`` (default 0, as
behind Envoy, which retries only a 503: a retried 500 would hide the failures from the client, not the cost).

Target (passive health on): no failure after the ejection, and failed requests ≤ ``consecutiveFailures`` × the
ejections.

Usage::

    python -m bench.wedged
    python -m bench.wedged --fault hang --first-byte-timeout 2s --timeout 10
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from dataclasses import dataclass, field

import aiohttp
import orjson

from bench.gateway_load import table
from epp.framework.endpoint import Endpoint, EndpointSpec
from epp.runtime.app import EppApp, ServeOptions
from epp_sim.config import SimConfig
from epp_sim.server import SimServer

__all__ = ["main", "run_config", "Run"]

MODEL = "sim-model"
SERVERS = 4
THRESHOLD = 5  # the outlier-detector's default consecutiveFailures
CONFIG = """apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: prefix-cache-scorer
- type: outlier-detector
  parameters: {params}
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
    weight: 2
  - pluginRef: kv-cache-utilization-scorer
    weight: 2
  - pluginRef: prefix-cache-scorer
    weight: 3
"""
SYSTEM = ("You are the assistant of shop {tenant}. Answer briefly, cite the catalogue, never invent prices. " * 8)


@dataclass
class Request:
    start: float
    status: int = 0  # 0: no answer in time (or the connection failed)
    ttft: float | None = None


@dataclass
class Run:
    """One configuration's requests and the ejections EPP made (time, endpoint, reason)."""

    name: str
    requests: list[Request] = field(default_factory=list)
    ejections: list[tuple[float, str, str]] = field(default_factory=list)
    wedged_at: float = 0.0

    @property
    def failed(self) -> list[Request]:
        return [r for r in self.requests if r.status != 200]

    @property
    def first_ejection(self) -> float | None:
        times = [t for t, _, reason in self.ejections if reason != "probe_failed"]
        return min(times) if times else None

    def failed_after_ejection(self) -> int:
        at = self.first_ejection
        return 0 if at is None else sum(1 for r in self.failed if r.start > at)

    def traffic_ejections(self) -> int:
        """Ejections real requests caused (a failed probe ejects again without any request failing)."""
        return sum(1 for _, _, reason in self.ejections if reason != "probe_failed")

    def ttft(self, q: float) -> float:
        data = sorted(r.ttft for r in self.requests if r.ttft is not None)
        return data[min(len(data) - 1, int(q * len(data)))] * 1e3 if data else float("nan")


def _body(i: int, tenant: int) -> bytes:
    return orjson.dumps({"model": MODEL, "max_tokens": 32, "stream": True, "messages": [
        {"role": "system", "content": SYSTEM.format(tenant=tenant)},
        {"role": "user", "content": f"Question {i}: is book {i} in stock?"}]})


def _detector_params(health: bool, args: argparse.Namespace) -> str:
    if not health:
        return "{consecutiveFailures: 0}"
    return "{}" if args.first_byte_timeout is None else f"{{firstByteTimeout: {args.first_byte_timeout}}}"


async def run_config(name: str, health: bool, args: argparse.Namespace) -> Run:
    """Start fresh servers and EPP, drive the load, wedge one server mid-run; the run's record."""
    servers = [SimServer(SimConfig(model=MODEL, seed=i, max_num_seqs=16)) for i in range(SERVERS)]
    for server in servers:
        await server.start()
    app = EppApp(ServeOptions(config_text=CONFIG.format(params=_detector_params(health, args)),
                              endpoints=[EndpointSpec(name=f"sim{i}", address="127.0.0.1", port=s.port)
                                         for i, s in enumerate(servers)],
                              host="127.0.0.1", grpc_port=None, health_port=None, metrics_port=None, http_port=0,
                              retries=args.retries))
    run = Run(name)
    try:
        await app.start()
        assert app.pipeline.health is not None and app.gateway is not None

        def ejected(endpoint: Endpoint, reason: str | None) -> None:
            if reason is not None:
                run.ejections.append((time.perf_counter(), endpoint.name, reason))

        app.pipeline.health.on_ejection(ejected)
        await _scraped(app)
        await _drive(run, app.gateway.url + "/v1/chat/completions", servers[0].url, args)
    finally:
        await app.stop()
        for server in servers:
            await server.stop()
    return run


async def _scraped(app: EppApp) -> None:
    """Until every endpoint has metrics (scoring on empty metrics would start the run on a blind pick)."""
    deadline = time.monotonic() + 10
    while any(ep.metrics.update_time == 0 for ep in app.datastore.endpoints()):
        if time.monotonic() > deadline:
            raise RuntimeError("the simulated servers were not scraped within 10 s")
        await asyncio.sleep(0.05)


async def _drive(run: Run, url: str, wedged: str, args: argparse.Namespace) -> None:
    rng = random.Random(args.seed)
    total = int(args.rate * args.duration)
    arrivals, t = [], 0.0
    for _ in range(total):
        t += rng.expovariate(args.rate)
        arrivals.append(t)
    tenants = [min(int(rng.paretovariate(1.2)) - 1, args.tenants - 1) for _ in range(total)]  # a few popular ones
    timeout = aiohttp.ClientTimeout(total=args.timeout)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as session:
        start = time.perf_counter()
        tasks: list[asyncio.Task[None]] = []
        wedge = asyncio.create_task(_wedge_later(session, wedged, start + args.wedge_at, args.fault, run))
        for i, at in enumerate(arrivals):
            await asyncio.sleep(max(0.0, start + at - time.perf_counter()))
            request = Request(time.perf_counter())
            run.requests.append(request)
            tasks.append(asyncio.create_task(_one(session, url, _body(i, tenants[i]), request)))
        await wedge
        await asyncio.gather(*tasks)
        async with session.post(wedged + "/sim/fault", json={"mode": "ok"}):
            pass  # lets requests held by a hang go, so the servers stop promptly


async def _wedge_later(session: aiohttp.ClientSession, url: str, at: float, fault: str, run: Run) -> None:
    await asyncio.sleep(max(0.0, at - time.perf_counter()))
    async with session.post(url + "/sim/fault", json={"mode": fault, "status": 500}) as resp:
        resp.raise_for_status()
    run.wedged_at = time.perf_counter()


async def _one(session: aiohttp.ClientSession, url: str, body: bytes, request: Request) -> None:
    try:
        async with session.post(url, data=body, headers={"Content-Type": "application/json"}) as resp:
            if resp.status != 200:
                await resp.read()
                request.status = resp.status
                return
            first = None
            async for _ in resp.content.iter_any():
                if first is None:
                    first = time.perf_counter() - request.start
            request.status, request.ttft = 200, first
    except (aiohttp.ClientError, asyncio.TimeoutError):
        request.status = 0


def report(runs: list[Run]) -> str:
    rows = []
    for run in runs:
        eject = run.first_ejection
        rows.append([run.name, str(len(run.requests)), str(len(run.failed)),
                     str(run.failed_after_ejection()) if eject is not None else "-",
                     str(run.traffic_ejections()), f"{eject - run.wedged_at:.2f}" if eject is not None else "-",
                     f"{run.ttft(0.5):.0f}", f"{run.ttft(0.99):.0f}"])
    return table(rows, ["passive health", "requests", "failed", "failed after ejection", "ejections",
                        "ejected after wedge (s)", "TTFT p50 (ms)", "TTFT p99 (ms)"])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=20.0, help="arrivals per second")
    parser.add_argument("--duration", type=float, default=30.0, help="seconds of arrivals per configuration")
    parser.add_argument("--wedge-at", type=float, default=10.0, help="seconds into the run the server is wedged")
    parser.add_argument("--fault", choices=["fail", "hang"], default="fail")
    parser.add_argument("--first-byte-timeout", default=None, help="the detector's firstByteTimeout (e.g. 2s)")
    parser.add_argument("--timeout", type=float, default=20.0, help="client timeout per request (s)")
    parser.add_argument("--retries", type=int, default=0, help="gateway retries on another endpoint")
    parser.add_argument("--tenants", type=int, default=8, help="shared system prompts")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    runs = asyncio.run(_both(args))
    print(f"{SERVERS} servers, {args.rate:g} req/s for {args.duration:g} s, sim0 wedged ({args.fault}) at "
          f"{args.wedge_at:g} s, gateway retries {args.retries}")
    print(report(runs))
    on = runs[1]
    ok = on.failed_after_ejection() == 0 and len(on.failed) <= THRESHOLD * on.traffic_ejections()
    print(f"target (on): failed after ejection {on.failed_after_ejection()} == 0 and failed {len(on.failed)} <= "
          f"{THRESHOLD} x {on.traffic_ejections()} ejections: {'met' if ok else 'NOT met'}")


async def _both(args: argparse.Namespace) -> list[Run]:
    return [await run_config("off", False, args), await run_config("on", True, args)]


if __name__ == "__main__":
    main()
