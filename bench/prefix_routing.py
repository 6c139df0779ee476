"""Prefix-cache routing quality: approximate vs precise (KV events) prefix scoring, with two EPP replicas.

A pool of simulated vLLM servers with small KV caches (eviction pressure) publishes KV events; ``--replicas`` EPP
instances (HTTP gateway, in this process) share the traffic round robin, as replicas behind one Service do. The
workload: ``--groups`` shared system prompts of ``--prefix-tokens`` tokens with Zipf popularity, each request adding
a unique question; ``--direct`` of the requests go straight to a random server, as traffic from another gateway or
a batch job would. Routing configurations:

* ``random``: ``random-picker`` (no prefix affinity), the floor;
* ``approx``: ``prefix-cache-scorer`` over the approximate producer (each replica's guess from its own picks);
* ``precise``: ``prefix-cache-scorer`` over ``precise-prefix-cache-producer`` fed by the servers' KV events, with a
  ``token-producer`` calling one server's render endpoint.

For each: the prefix-cache hit rate the servers report (Σ ``cached_tokens`` / Σ ``prompt_tokens`` over routed
requests), latency p50/p99 of routed requests (prefill of uncached tokens is most of it), and requests per second.

Usage::

    python -m bench.prefix_routing                      # the README table
    python -m bench.prefix_routing --requests 800 --replicas 1 --direct 0
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import tempfile
import time
from dataclasses import dataclass, field

import aiohttp
import orjson

from bench.gateway_load import table
from epp.framework.endpoint import EndpointSpec
from epp.runtime.app import EppApp, ServeOptions
from epp.runtime.ports import free_ports
from epp_sim.config import SimConfig
from epp_sim.server import SimServer

__all__ = ["main", "run_mode", "Stats"]

MODEL = "sim-model"
_PROFILE = """apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
{plugins}
schedulingProfiles:
- name: default
  plugins:
{refs}
"""
_PREFIX_REFS = ("  - pluginRef: prefix-cache-scorer\n    weight: 3\n  - pluginRef: queue-scorer\n"
                "  - pluginRef: max-score-picker")
_SCORING = "- type: queue-scorer\n- type: max-score-picker"
MODES = {
    "random": ("- type: random-picker", "  - pluginRef: random-picker"),
    "approx": ("- type: prefix-cache-scorer\n" + _SCORING, _PREFIX_REFS),
    "precise": ("- type: token-producer\n  parameters: {{modelName: " + MODEL + ", vllm: {{http: '{render}'}}}}\n"
                "- type: precise-prefix-cache-producer\n  parameters:\n    tokenProcessorConfig: {{blockSize: 16}}\n"
                "    kvEventsConfig: {{discoverPods: true, podDiscoveryConfig: {{socketPort: {port}}}}}\n"
                "- type: prefix-cache-scorer\n  parameters: {{prefixMatchInfoProducerName: "
                "precise-prefix-cache-producer}}\n" + _SCORING, _PREFIX_REFS),
}


@dataclass
class Stats:
    latencies: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    cached_tokens: int = 0
    errors: int = 0
    seconds: float = 0.0

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def pct(self, q: float) -> float:
        data = sorted(self.latencies)
        return data[min(len(data) - 1, int(q * len(data)))] * 1000 if data else float("nan")


def _prompts(groups: int, prefix_tokens: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    # The simulator's built-in tokenizer makes 4 UTF-8 bytes one token.
    return [f"system {g:03d} " + "".join(rng.choice("abcdefghijklmnopqrstuvwxyz ") for _ in range(prefix_tokens * 4))
            for g in range(groups)]


def _zipf_weights(n: int, s: float = 1.0) -> list[float]:
    return [1.0 / (k + 1) ** s for k in range(n)]


async def run_mode(mode: str, args: argparse.Namespace) -> Stats:
    """One configuration on a fresh pool (empty caches): ``args.requests`` requests at ``args.concurrency``.

    Server i listens on 127.0.0.{i+2} (its own address, as a Pod has), and in ``precise`` mode binds its KV-event
    publisher there on one shared port, so every EPP replica connects to every server's events (discoverPods)."""
    zmq_port = free_ports(hosts=tuple(f"127.0.0.{i + 2}" for i in range(args.servers)))
    servers: list[SimServer] = []
    try:
        for i in range(args.servers):
            host = f"127.0.0.{i + 2}"
            cfg = SimConfig(model=MODEL, num_gpu_blocks=args.blocks, seed=i, time_scale=args.time_scale,
                            kv_events_endpoint=f"tcp://{host}:{zmq_port}" if mode == "precise" else None,
                            kv_events_bind=True)
            server = SimServer(cfg)
            await server.start(host, 0)
            servers.append(server)
        eps = [EndpointSpec(name=f"sim-{i}", address=s.host, port=s.port) for i, s in enumerate(servers)]
        apps = await _start_epps(mode, args, eps, servers[0].url, zmq_port)
        try:
            return await _drive(args, [f"http://127.0.0.1:{a.gateway.port}" for a in apps], [s.url for s in servers])
        finally:
            for app in apps:
                await app.stop()
    finally:
        await asyncio.gather(*(s.stop() for s in servers), return_exceptions=True)


async def _start_epps(mode: str, args: argparse.Namespace, eps: list[EndpointSpec], render: str,
                      zmq_port: int) -> list[EppApp]:
    plugins, refs = MODES[mode]
    text = _PROFILE.format(plugins=plugins.format(render=render, port=zmq_port), refs=refs)
    fd, path = tempfile.mkstemp(suffix=".yaml")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    apps: list[EppApp] = []
    try:
        for _ in range(args.replicas):
            app = EppApp(ServeOptions(config=path, endpoints=eps, host="127.0.0.1", grpc_port=None, health_port=None,
                                      metrics_port=None, http_port=0, refresh_interval=0.05))
            await app.start()
            await app.wait_ready()
            apps.append(app)
    finally:
        os.unlink(path)
    return apps


async def _drive(args: argparse.Namespace, gateways: list[str], servers: list[str]) -> Stats:
    prompts = _prompts(args.groups, args.prefix_tokens, args.seed)
    weights = _zipf_weights(args.groups)
    rng = random.Random(args.seed)
    plan = [(rng.choices(range(args.groups), weights)[0], rng.random() < args.direct) for _ in range(args.requests)]
    stats = Stats()
    queue: asyncio.Queue[tuple[int, int, bool]] = asyncio.Queue()
    for i, (g, direct) in enumerate(plan):
        queue.put_nowait((i, g, direct))
    async with aiohttp.ClientSession() as session:
        async def worker() -> None:
            while not queue.empty():
                i, g, direct = queue.get_nowait()
                url = rng.choice(servers) if direct else gateways[i % len(gateways)]
                body = {"model": MODEL, "max_tokens": 8,
                        "messages": [{"role": "system", "content": prompts[g]},
                                     {"role": "user", "content": f"question {i} {rng.random()}"}]}
                start = time.perf_counter()
                async with session.post(url + "/v1/chat/completions", data=orjson.dumps(body),
                                        headers={"content-type": "application/json"}) as resp:
                    data = orjson.loads(await resp.read())
                if resp.status != 200:
                    stats.errors += 1
                    continue
                if direct:
                    continue
                stats.latencies.append(time.perf_counter() - start)
                usage = data.get("usage") or {}
                stats.prompt_tokens += usage.get("prompt_tokens", 0)
                stats.cached_tokens += (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(args.concurrency)))
        stats.seconds = time.perf_counter() - start
    return stats


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--modes", default="random,approx,precise")
    parser.add_argument("--requests", type=int, default=600)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--servers", type=int, default=4)
    parser.add_argument("--replicas", type=int, default=2, help="EPP replicas sharing the routed traffic")
    parser.add_argument("--groups", type=int, default=24)
    parser.add_argument("--prefix-tokens", type=int, default=1024)
    parser.add_argument("--blocks", type=int, default=320, help="KV blocks (16 tokens) per server")
    parser.add_argument("--direct", type=float, default=0.2, help="fraction of requests sent straight to a server")
    parser.add_argument("--time-scale", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    rows = []
    for mode in args.modes.split(","):
        s = asyncio.run(run_mode(mode, args))
        n = len(s.latencies)
        rows.append([mode, str(n), f"{100 * s.hit_rate:.1f}%", f"{s.pct(0.5):.1f}", f"{s.pct(0.99):.1f}",
                     f"{statistics.fmean(s.latencies) * 1000:.1f}" if n else "-", f"{n / s.seconds:.0f}",
                     str(s.errors)])
    print(table(rows, ["routing", "routed", "hit rate", "p50 ms", "p99 ms", "mean ms", "req/s", "errors"]))


if __name__ == "__main__":
    main()
