"""A model server that dies, through a real Envoy configured as ``epp envoy-config`` writes it by default
(``override_host`` over EPP's EDS, with retries), in both request body modes.

* Simulated vLLM servers run as processes (``python -m epp_sim.cli serve``); one is killed with SIGKILL while a
  bounded closed-loop load runs, and EPP never learns it (its scrapes count as fresh) and picks at random, so a
  quarter of its picks name the dead pod, as in production until scraping marks the pod unhealthy. No request whose model server never
  answered may fail. An answer the model server had begun cannot be retried: cut after the client's first byte,
  or, when the pod dies within the round trip in which EPP sees the answer's headers, a JSON 502 whose details
  say ``upstream_reset_after_response_started``; both are only counted.
* EPP's own fallbacks: when EPP returns several endpoints, Envoy tries them in EPP's order.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import orjson
import pytest

from epp.envoy.bootstrap import EnvoyConfigOptions, build_bootstrap
from epp.framework.endpoint import EndpointSpec
from epp.runtime.app import EppApp, ServeOptions

from ..conftest import eventually
from .envoy_harness import EnvoyProcess
from .helpers import EchoServer, make_director
from .test_envoy_routes import xds_stack  # noqa: F401  (the fixture)

pytestmark = pytest.mark.envoy

MODES = pytest.mark.parametrize("mode", ["full-duplex", "buffered"])
PICKS = """
plugins:
- type: queue-scorer
- type: max-score-picker
  parameters: {maxNumOfEndpoints: 3}
schedulingProfiles:
- name: default
  plugins: [{pluginRef: queue-scorer}, {pluginRef: max-score-picker}]
"""
RANDOM = """
plugins:
- type: random-picker
  parameters: {maxNumOfEndpoints: %d}
schedulingProfiles:
- name: default
  plugins: [{pluginRef: random-picker}]
"""


class SimProcess:
    """One ``epp-sim`` server in its own process (so that it can be killed for real)."""

    def __init__(self, seed: int) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "epp_sim.cli", "serve", "--host", "127.0.0.1", "--port", "0", "--model", "m",
             "--time-scale", "1", "--seed", str(seed)], stdout=subprocess.PIPE, text=True)
        self.port = 0

    async def started(self) -> None:
        assert self.proc.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(self.proc.stdout.readline), 30)
        assert line.startswith("epp-sim listening on http://127.0.0.1:"), line
        self.port = int(line.split()[3].rsplit(":", 1)[1])

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)


@pytest.fixture
async def sim_processes() -> AsyncIterator[Callable[[int], Awaitable[list[SimProcess]]]]:
    started: list[SimProcess] = []

    async def factory(n: int) -> list[SimProcess]:
        sims = [SimProcess(seed) for seed in range(n)]
        started.extend(sims)
        await asyncio.gather(*(s.started() for s in sims))
        return sims

    yield factory
    for sim in started:
        sim.kill()


@dataclass
class Outcome:
    """A load run's requests: answered in full; cut after the model server had begun its answer (after the
    client's first byte, or before Envoy relayed the answer's headers); or failed although no model server had
    answered, which the retries must prevent."""

    ok: int = 0
    answer_begun_then_cut: int = 0
    failed_unanswered: list[str] = field(default_factory=list)

    @property
    def total(self) -> int:
        return self.ok + self.answer_begun_then_cut + len(self.failed_unanswered)


async def one_request(session: aiohttp.ClientSession, url: str, i: int, outcome: Outcome) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": f"question {i}"}], "max_tokens": 24,
            "stream": i % 2 == 1}
    try:
        async with session.post(url, json=body) as resp:
            if resp.status != 200:  # Envoy's or EPP's own answer
                text = (await resp.read()).decode(errors="replace")
                if resp.status == 502 and "upstream_reset_after_response_started" in text:
                    outcome.answer_begun_then_cut += 1
                else:
                    outcome.failed_unanswered.append(f"{resp.status} {text[:300]}")
                return
            try:
                await resp.read()
            except (aiohttp.ClientError, asyncio.TimeoutError):
                outcome.answer_begun_then_cut += 1
                return
            outcome.ok += 1
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        outcome.failed_unanswered.append(repr(exc))


async def closed_loop(url: str, total: int, concurrency: int, outcome: Outcome) -> None:
    """``concurrency`` clients, each sending its next request when the last one ended, ``total`` in all; each
    request bounded by a 60 s timeout."""
    counter = iter(range(total))
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        async def client() -> None:
            for i in counter:
                await one_request(session, url, i, outcome)

        await asyncio.gather(*(client() for _ in range(concurrency)))


@MODES
@pytest.mark.parametrize("picks", [1, 3], ids=["one-endpoint-per-pick", "three-endpoints-per-pick"])
async def test_a_pod_killed_under_load_fails_no_request_whose_model_server_never_answered(
        envoy_bin: Path, tmp_path: Path, sim_processes, mode: str, picks: int) -> None:
    sims = await sim_processes(4)
    epp_config = tmp_path / "epp.yaml"
    epp_config.write_text(RANDOM % picks)
    app = EppApp(ServeOptions(config=str(epp_config), host="127.0.0.1", grpc_port=0,
                              health_port=None, metrics_port=None, plaintext=True, xds_port=0,
                              scrape_overrides={"failure_threshold": 1 << 30, "staleness": 3600.0},
                              endpoints=[EndpointSpec(name=f"sim{i}", address="127.0.0.1", port=s.port)
                                         for i, s in enumerate(sims)]))
    await app.start()
    envoy = EnvoyProcess(envoy_bin, build_bootstrap(EnvoyConfigOptions(
        listen="127.0.0.1:0", admin="127.0.0.1:0", plaintext=True, mode=mode,  # type: ignore[arg-type]
        epp=(f"127.0.0.1:{app.extproc.port}",), lb="override-host", xds=(f"127.0.0.1:{app.xds.port}",))),
        tmp_path)
    try:
        await asyncio.to_thread(envoy.start)
        outcome = Outcome()
        load = asyncio.create_task(closed_loop(f"http://127.0.0.1:{envoy.port}/v1/chat/completions", 160, 8,
                                               outcome))
        await eventually(lambda: outcome.total >= 40, timeout=30.0)
        sims[0].kill()
        await load
        assert outcome.failed_unanswered == [], outcome
        assert outcome.total == 160 and outcome.ok >= 160 - 8  # at most the requests in flight were cut
        stats = envoy.stats("cluster.inference-pool.upstream_rq_retry")
        assert stats["cluster.inference-pool.upstream_rq_retry_success"] >= 1, stats  # the dead pod was retried
    finally:
        envoy.stop()
        await app.stop()


# -- EPP's fallbacks, in EPP's order --------------------------------------------------------------------------

@MODES
async def test_envoy_tries_epps_fallbacks_in_epps_order(xds_stack, mode: str) -> None:
    echoes = [EchoServer() for _ in range(4)]
    for echo in echoes:
        await echo.start()
    try:
        specs = [EndpointSpec(name=f"echo{i}", address="127.0.0.1", port=e.port) for i, e in enumerate(echoes)]
        # The queue scorer ranks echo0 first, then echo1, echo2, echo3: EPP's list is echo0,echo1,echo2.
        director = make_director(specs, PICKS, waiting={"echo0": 0, "echo1": 10, "echo2": 20, "echo3": 30})
        st = await xds_stack(director, mode)
        await echoes[0].stop()  # EPP does not know: it keeps naming echo0 first
        chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        async with aiohttp.ClientSession() as session:
            for _ in range(5):
                async with session.post(st.url + "/v1/chat/completions", json=chat) as resp:
                    assert resp.status == 200
                    assert resp.headers["x-served-by"] == echoes[1].hostport  # EPP's second, not a round robin
                    assert orjson.loads(await resp.read())["port"] == echoes[1].port
        assert echoes[2].hits == echoes[3].hits == 0
    finally:
        for echo in echoes[1:]:
            await echo.stop()
