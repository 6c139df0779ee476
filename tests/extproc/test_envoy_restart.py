"""Restarts without loss: two ``epp serve`` replicas behind one real Envoy whose bootstrap ``epp envoy-config``
wrote for both (``--epp A,B --epp-health-port P``: Envoy health-checks them over gRPC health and prefers the
healthy ones). The replicas listen on 127.0.0.1 and 127.0.0.2 with the same ports, as two hosts would.

Under a bounded closed-loop load through Envoy, SIGTERM to one replica fails no request: it goes NOT_SERVING at
once, keeps serving for its default drain window while Envoy's health check moves new streams to the other
replica, then refuses new streams and lets the running ones finish. Restarted on the same ports, it takes streams
again. SIGKILL to a replica fails at most the requests that were in flight at the kill, provided Envoy retries the
new streams that find it gone (the generated ``grpc_service.retry_policy``). Both request body modes.
Real processes: the replicas, Envoy; the simulated pool and the load run in the test's loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
import yaml

from epp._pb.grpc.health.v1 import health_pb2
from epp.envoy.bootstrap import EPP_CLUSTER
from epp.runtime.ports import free_ports
from epp_sim import SimConfig, SimPool

from ..conftest import eventually
from .envoy_harness import EnvoyProcess

CLIENTS = 8
REQUEST_TIMEOUT = 30.0  # each request is bounded; so is the whole run (MAX_REQUESTS, and each phase's deadline)
MAX_REQUESTS = 50_000
PHASE_DEADLINE = 120.0  # a guard against a hang, never a timing check
BODY = {"model": "sim-model", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 3}


HOSTS = ("127.0.0.1", "127.0.0.2")


class Replica:
    """One ``epp serve`` process on ``host`` and fixed ports (kept across restarts); its log appended to a file."""

    def __init__(self, name: str, host: str, base_port: int, endpoints: Path, workdir: Path) -> None:
        self.name = name
        self.host = host
        self.grpc_port, self.health_port, self.xds_port = base_port, base_port + 1, base_port + 2
        self.endpoints = endpoints
        self.log_path = workdir / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.grpc_port}"

    def start(self) -> None:
        with open(self.log_path, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "epp.cli.main", "serve", "--endpoints", str(self.endpoints), "--host",
                 self.host, "--grpc-port", str(self.grpc_port), "--health-port", str(self.health_port),
                 "--xds-port", str(self.xds_port), "--metrics-port", "-1", "--plaintext"],
                stdout=out, stderr=subprocess.STDOUT)

    async def serving(self) -> None:
        """Wait until the health service answers SERVING."""

        async def serving() -> bool:
            if await self._serving():
                return True
            assert self.proc is not None and self.proc.poll() is None, self.log()
            return False

        await eventually(serving, lambda: f"{self.name} serving:\n{self.log()}", timeout=PHASE_DEADLINE, interval=0.05)


    async def _serving(self) -> bool:
        async with grpc.aio.insecure_channel(f"{self.host}:{self.health_port}") as channel:
            check = channel.unary_unary("/grpc.health.v1.Health/Check",
                                        request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
                                        response_deserializer=health_pb2.HealthCheckResponse.FromString)
            try:
                reply = await check(health_pb2.HealthCheckRequest(service=""), timeout=2)
            except grpc.aio.AioRpcError:
                return False
        return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)

    async def exited(self) -> int:
        assert self.proc is not None
        return await asyncio.to_thread(self.proc.wait, PHASE_DEADLINE)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-6000:]

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


@dataclass
class Load:
    """A closed loop of :data:`CLIENTS` clients through Envoy; each request is numbered, and ``in_flight`` maps the
    running ones to their start. ``failures`` lists (number, what went wrong)."""

    url: str
    ok: int = 0
    failures: list[tuple[int, str]] = field(default_factory=list)
    in_flight: dict[int, float] = field(default_factory=dict)
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    _ids: itertools.count[int] = field(default_factory=itertools.count)

    async def run(self) -> None:
        timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            await asyncio.gather(*(self._client(session) for _ in range(CLIENTS)))

    async def _client(self, session: aiohttp.ClientSession) -> None:
        while not self.stop.is_set() and self.ok + len(self.failures) < MAX_REQUESTS:
            rid = next(self._ids)
            self.in_flight[rid] = time.monotonic()
            try:
                async with session.post(self.url, json=BODY) as resp:
                    text = await resp.text()
                    if resp.status == 200 and json.loads(text)["usage"]["completion_tokens"] == 3:
                        self.ok += 1
                    else:
                        self.failures.append((rid, f"{resp.status} {text[:200]!r}"))
            except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, KeyError) as exc:
                self.failures.append((rid, repr(exc)))
            finally:
                del self.in_flight[rid]

    async def more(self, n: int, what: str) -> None:
        """Wait for ``n`` more successful requests."""
        target = self.ok + n
        await eventually(lambda: self.ok >= target,
                         lambda: f"{n} more requests ({what}); failures: {self.failures[:5]}", timeout=PHASE_DEADLINE)


def _hosts(admin_url: str) -> dict[str, tuple[bool, int]]:
    """Envoy's view of the ext_proc cluster: host -> (healthy, streams started)."""
    with urllib.request.urlopen(admin_url + "/clusters?format=json", timeout=5) as resp:
        data = json.load(resp)
    out = {}
    for cluster in data["cluster_statuses"]:
        if cluster["name"] != EPP_CLUSTER:
            continue
        for host in cluster.get("host_statuses", []):
            flags = host.get("health_status", {})
            healthy = flags.get("eds_health_status", "HEALTHY") == "HEALTHY" and not any(
                v is True for k, v in flags.items() if k != "eds_health_status")
            stats = {s["name"]: int(s.get("value", 0)) for s in host.get("stats", [])}
            out[host["address"]["socket_address"]["address"]] = (healthy, stats.get("rq_total", 0))
    return out


def _bootstrap(replicas: list[Replica], mode: str, workdir: Path) -> dict[str, Any]:
    """What ``epp envoy-config`` prints for the two replicas (the real CLI), as a dict."""
    out = workdir / f"envoy-{mode}.yaml"
    subprocess.run([sys.executable, "-m", "epp.cli.main", "envoy-config", "--listen", "127.0.0.1:0", "--admin",
                    "127.0.0.1:0", "--plaintext", "--mode", mode, "--epp", ",".join(r.address for r in replicas),
                    "--epp-health-port", str(replicas[0].health_port),
                    "--xds", ",".join(f"{r.host}:{r.xds_port}" for r in replicas), "-o", str(out)],
                   check=True, capture_output=True, timeout=60)
    bootstrap: dict[str, Any] = yaml.safe_load(out.read_text())
    return bootstrap


def _health_checked(bootstrap: dict[str, Any]) -> bool:
    return any(c["name"] == EPP_CLUSTER and c.get("health_checks")
               for c in bootstrap["static_resources"]["clusters"])


@pytest.fixture
async def pool() -> AsyncIterator[SimPool]:
    async with SimPool([SimConfig(model="sim-model", time_scale=0.02, seed=i) for i in range(2)]) as sims:
        yield sims


def _retries_streams(bootstrap: dict[str, Any]) -> bool:
    """Whether Envoy retries an ext_proc stream that cannot open (``grpc_service.retry_policy``): what keeps new
    streams from failing on a killed replica until the health check marks it down."""
    hcm = bootstrap["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    return any(f["name"] == "envoy.filters.http.ext_proc" and f["typed_config"]["grpc_service"].get("retry_policy")
               for f in hcm["http_filters"])


@dataclass
class Stack:
    """Two replicas (a on 127.0.0.1, b on 127.0.0.2), Envoy in front, a running :class:`Load` through it."""

    a: Replica
    b: Replica
    envoy: EnvoyProcess
    bootstrap: dict[str, Any]
    load: Load

    def hosts(self) -> dict[str, tuple[bool, int]]:
        return _hosts(self.envoy.admin_url)

    def healthy(self, replica: Replica) -> bool:
        return self.hosts()[replica.host][0]


@contextlib.asynccontextmanager
async def _stack(envoy_bin: Path, workdir: Path, pool: SimPool, mode: str,
                 stream_retries: bool = False) -> AsyncIterator[Stack]:
    """Start both replicas and Envoy, wait until Envoy takes both for healthy and both carry streams of the load.
    The bootstrap must carry what the test relies on: health checks, and with ``stream_retries`` a retry policy for
    ext_proc streams."""
    endpoints = workdir / "endpoints.yaml"
    endpoints.write_text("endpoints:\n" + "".join(
        f"  - {{name: sim-{i}, address: 127.0.0.1, port: {s.port}}}\n" for i, s in enumerate(pool.servers)))
    base = free_ports(3, hosts=HOSTS)
    a, b = (Replica(name, host, base, endpoints, workdir) for name, host in zip("ab", HOSTS))
    bootstrap = _bootstrap([a, b], mode, workdir)
    assert _health_checked(bootstrap), "epp envoy-config writes no health checks for the ext_proc cluster"
    assert not stream_retries or _retries_streams(bootstrap), "no retry policy for ext_proc streams"
    envoy = EnvoyProcess(envoy_bin, bootstrap, workdir, name=f"envoy-{mode}")
    st = Stack(a, b, envoy, bootstrap, Load(""))
    loading: asyncio.Task[None] | None = None
    try:
        for r in (a, b):
            r.start()
        await asyncio.gather(a.serving(), b.serving())
        await asyncio.to_thread(envoy.start)
        await eventually(lambda: len(st.hosts()) == 2 and st.healthy(a) and st.healthy(b), "both replicas healthy",
                         timeout=PHASE_DEADLINE)
        st.load.url = f"http://127.0.0.1:{envoy.port}/v1/chat/completions"
        loading = asyncio.create_task(st.load.run())
        await eventually(lambda: all(h[1] > 0 for h in st.hosts().values()), "streams on both replicas",
                         timeout=PHASE_DEADLINE)
        await st.load.more(50, "before the restart")
        yield st
    finally:
        st.load.stop.set()
        if loading is not None:
            await asyncio.wait_for(loading, REQUEST_TIMEOUT + 10)
        envoy.stop()
        for r in (a, b):
            r.close()


_STEPS = ("SIGTERM received", "readiness is NOT_SERVING", "draining for", "drain window elapsed",
          "ext_proc: refusing new streams (GOAWAY)", "ext_proc stopped after", "EPP stopped")


@pytest.mark.parametrize("mode", ["full-duplex", "buffered"])
async def test_a_rolling_restart_with_sigterm_loses_no_request(envoy_bin: Path, tmp_path: Path, pool: SimPool,
                                                               mode: str) -> None:
    """SIGTERM to one replica (its default drain window, nothing configured) fails no request, and neither does
    its return on the same ports."""
    async with _stack(envoy_bin, tmp_path, pool, mode) as st:
        a, load = st.a, st.load
        assert a.proc is not None
        a.proc.send_signal(signal.SIGTERM)
        unhealthy = asyncio.create_task(eventually(lambda: not st.healthy(a), "a unhealthy in Envoy",
                                                   timeout=PHASE_DEADLINE))
        assert await a.exited() == 0, a.log()
        assert unhealthy.done() and unhealthy.exception() is None, "Envoy took a for healthy after its drain window"
        await load.more(50, "after the SIGTERM")
        assert load.failures == [], (load.failures[:10], a.log())
        log = a.log()
        assert all(step in log for step in _STEPS), log

        a.start()  # back on the same ports: Envoy's health check sees it and sends it streams again
        await a.serving()
        before = st.hosts()[a.host][1]
        await eventually(lambda: st.healthy(a) and st.hosts()[a.host][1] > before, "a back in Envoy",
                         timeout=PHASE_DEADLINE)
        await load.more(50, "after the restart")
        assert load.failures == [], load.failures[:10]


@pytest.mark.parametrize("mode", ["full-duplex", "buffered"])
async def test_sigkill_fails_only_the_streams_in_flight(envoy_bin: Path, tmp_path: Path, pool: SimPool,
                                                       mode: str) -> None:
    """SIGKILL to one replica: the requests running at that instant may fail, no other one does (new streams that
    find it gone are retried on the other replica until the health check marks it down)."""
    async with _stack(envoy_bin, tmp_path, pool, mode, stream_retries=True) as st:
        b, load = st.b, st.load
        assert b.proc is not None
        at_kill = set(load.in_flight)  # no await between the snapshot and the kill: nothing starts or ends between
        b.proc.kill()
        await eventually(lambda: not st.healthy(b), "b unhealthy in Envoy", timeout=PHASE_DEADLINE)
        await load.more(100, "after the SIGKILL")
        unexpected = [f for f in load.failures if f[0] not in at_kill]
        assert unexpected == [], (unexpected[:10], f"{len(at_kill)} in flight at the kill")
