"""SLO-aware routing: how many requests meet their latency SLOs under each routing configuration.

A pool of simulated vLLM servers with small batches (so prefill queues form) serves an open-loop Poisson stream of
streamed chat requests through EPP's HTTP gateway. Every request carries the SLO headers
(``x-llm-d-router-slo-ttft-ms`` / ``x-llm-d-router-slo-tpot-ms``). The workload mixes ``--groups`` shared system
prompts of ``--prefix-tokens`` tokens (Zipf popularity; prefix-cache affinity pays) with a fraction ``--unique`` of
long prompts nobody shares (they load whichever server gets them). Configurations:

* ``default``: EPP's default profile (queue, KV-cache utilization and prefix-cache scorers, max-score picker);
* ``latency``: the reference Helm chart's latency-predictor profile (``predicted-latency-producer``, a strict and a
  loose ``prefix-cache-affinity-filter`` around ``slo-headroom-tier-filter``, ``latency-scorer``,
  ``weighted-random-picker``), as rendered in ``tests/fixtures/configs/gie/helm_latency-predictor-rendered.yaml``,
  with ``streamingMode: true`` so TPOT is judged too;
* ``latency-no-affinity``: the same without the two prefix-cache affinity filters (producer, SLO tier filter,
  latency scorer, weighted-random picker), to tell the predictor's part from the affinity filters';
* ``latency-max``: that, with ``max-score-picker`` (the scorer's default ``least`` strategy packs: it prefers the
  endpoint with the least positive headroom);
* ``latency-most``: that, with ``headroomSelectionStrategy: most`` (spreads to the most headroom).

Each configuration runs on a fresh pool: ``--warmup`` requests first (the predictor learns from them; they are
not counted), then ``--requests`` measured requests at ``--rate`` per second. Reported per configuration: TTFT
p50/p90/p99 and TPOT p50/p99 as the client sees them, the share of requests within the TTFT SLO, within the TPOT
SLO, and within both (SLO attainment), and errors.

Usage::

    python -m bench.slo_routing                                  # the README table
    python -m bench.slo_routing --rate 25 --requests 300 --configs default,latency
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import orjson

from bench.gateway_load import table
from bench.prefix_routing import MODEL, _prompts, _zipf_weights
from epp.config.loader import DEFAULT_CONFIG_TEXT
from epp.framework.endpoint import EndpointSpec
from epp.runtime.app import EppApp, ServeOptions
from epp_sim.config import SimConfig
from epp_sim.server import SimServer

__all__ = ["main", "run_config", "Outcome"]

HELM_LATENCY = Path(__file__).resolve().parent.parent / "tests/fixtures/configs/gie/helm_latency-predictor-rendered.yaml"


_TIERS = """apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: predicted-latency-producer
  parameters: {streamingMode: true}
- type: slo-headroom-tier-filter
- type: latency-scorer
  parameters: {headroomSelectionStrategy: %s}
- type: %s
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: slo-headroom-tier-filter
  - pluginRef: latency-scorer
  - pluginRef: %s
"""
CONFIGS = ("default", "latency", "latency-no-affinity", "latency-max", "latency-most")


def config_text(name: str) -> str:
    """The EndpointPickerConfig of configuration ``name`` (:data:`CONFIGS`)."""
    if name == "default":
        return DEFAULT_CONFIG_TEXT
    if name == "latency":
        text = HELM_LATENCY.read_text()
        return text.replace("- type: predicted-latency-producer\n",
                            "- type: predicted-latency-producer\n  parameters: {streamingMode: true}\n", 1)
    if name == "latency-no-affinity":
        return _TIERS % ("least", "weighted-random-picker", "weighted-random-picker")
    if name == "latency-max":
        return _TIERS % ("least", "max-score-picker", "max-score-picker")
    if name == "latency-most":
        return _TIERS % ("most", "max-score-picker", "max-score-picker")
    raise SystemExit(f"unknown configuration {name!r} ({', '.join(CONFIGS)})")


@dataclass
class Outcome:
    """What the measured requests of one configuration saw (times in milliseconds)."""

    ttfts: list[float] = field(default_factory=list)
    tpots: list[float] = field(default_factory=list)
    met_ttft: int = 0
    met_tpot: int = 0
    met_both: int = 0
    errors: int = 0

    def pct(self, values: list[float], q: float) -> float:
        data = sorted(values)
        return data[min(len(data) - 1, int(q * len(data)))] if data else float("nan")


async def run_config(name: str, args: argparse.Namespace) -> Outcome:
    """One configuration on a fresh pool: warm-up, then the measured requests."""
    servers: list[SimServer] = []
    try:
        for i in range(args.servers):
            cfg = SimConfig(model=MODEL, seed=i, max_num_seqs=args.max_seqs, num_gpu_blocks=args.blocks,
                            max_num_batched_tokens=args.batched_tokens, time_scale=args.time_scale)
            server = SimServer(cfg)
            await server.start("127.0.0.1", 0)
            servers.append(server)
        eps = [EndpointSpec(name=f"sim-{i}", address=s.host, port=s.port) for i, s in enumerate(servers)]
        app = await _start_epp(config_text(name), eps)
        try:
            url = f"http://127.0.0.1:{app.gateway.port}/v1/chat/completions"
            rng = random.Random(args.seed)
            await _drive(url, args, rng, args.warmup, None)
            outcome = Outcome()
            await _drive(url, args, rng, args.requests, outcome)
            return outcome
        finally:
            await app.stop()
    finally:
        await asyncio.gather(*(s.stop() for s in servers), return_exceptions=True)


async def _start_epp(text: str, eps: list[EndpointSpec]) -> EppApp:
    fd, path = tempfile.mkstemp(suffix=".yaml")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    try:
        app = EppApp(ServeOptions(config=path, endpoints=eps, host="127.0.0.1", grpc_port=None, health_port=None,
                                  metrics_port=None, http_port=0, refresh_interval=0.05))
        await app.start()
        await app.wait_ready()
        return app
    finally:
        os.unlink(path)


async def _drive(url: str, args: argparse.Namespace, rng: random.Random, n: int, outcome: Outcome | None) -> None:
    """``n`` requests arriving as a Poisson process of ``args.rate`` per second; each one's result goes into
    ``outcome`` (None: warm-up, not recorded)."""
    prompts = _prompts(args.groups, args.prefix_tokens, args.seed)
    weights = _zipf_weights(args.groups)
    headers = {"content-type": "application/json", "x-llm-d-router-slo-ttft-ms": str(args.ttft_slo),
               "x-llm-d-router-slo-tpot-ms": str(args.tpot_slo)}
    tasks: list[asyncio.Task[None]] = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        for i in range(n):
            if rng.random() < args.unique:
                system = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz ") for _ in range(args.prefix_tokens * 4))
            else:
                system = prompts[rng.choices(range(args.groups), weights)[0]]
            body = orjson.dumps({"model": MODEL, "max_tokens": args.output_tokens, "stream": True,
                                 "stream_options": {"include_usage": True},
                                 "messages": [{"role": "system", "content": system},
                                              {"role": "user", "content": f"question {i} {rng.random()}"}]})
            tasks.append(asyncio.create_task(_one(session, url, body, headers, args, outcome)))
            await asyncio.sleep(rng.expovariate(args.rate))
        await asyncio.gather(*tasks)


async def _one(session: aiohttp.ClientSession, url: str, body: bytes, headers: dict[str, str],
               args: argparse.Namespace, outcome: Outcome | None) -> None:
    start = time.perf_counter()
    first = last = 0.0
    tokens = 0
    try:
        async with session.post(url, data=body, headers=headers) as resp:
            if resp.status != 200:
                await resp.read()
                raise RuntimeError(f"HTTP {resp.status}")
            async for line in resp.content:
                if not line.startswith(b"data: {"):
                    continue
                choices = orjson.loads(line[6:]).get("choices") or [{}]
                if not (choices[0].get("delta") or {}).get("content"):  # the role chunk, the usage chunk
                    continue
                last = time.perf_counter()
                tokens += 1
                if tokens == 1:
                    first = last
    except (aiohttp.ClientError, RuntimeError):
        if outcome is not None:
            outcome.errors += 1
        return
    if outcome is None or tokens == 0:
        return
    ttft = (first - start) * 1000
    tpot = (last - first) * 1000 / (tokens - 1) if tokens > 1 else 0.0
    outcome.ttfts.append(ttft)
    outcome.tpots.append(tpot)
    ok_ttft, ok_tpot = ttft <= args.ttft_slo, tpot <= args.tpot_slo
    outcome.met_ttft += ok_ttft
    outcome.met_tpot += ok_tpot
    outcome.met_both += ok_ttft and ok_tpot


def _row(name: str, o: Outcome) -> list[str]:
    n = len(o.ttfts)
    share = (lambda k: f"{100 * k / n:.1f}%") if n else (lambda k: "-")
    return [name, str(n), f"{o.pct(o.ttfts, 0.5):.0f}", f"{o.pct(o.ttfts, 0.9):.0f}", f"{o.pct(o.ttfts, 0.99):.0f}",
            f"{o.pct(o.tpots, 0.5):.1f}", f"{o.pct(o.tpots, 0.99):.1f}", share(o.met_ttft), share(o.met_tpot),
            share(o.met_both), str(o.errors)]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--servers", type=int, default=4)
    parser.add_argument("--max-seqs", type=int, default=8, help="max_num_seqs per server (small: queues form)")
    parser.add_argument("--batched-tokens", type=int, default=2048, help="max_num_batched_tokens per server")
    parser.add_argument("--blocks", type=int, default=1024, help="KV blocks (16 tokens) per server")
    parser.add_argument("--rate", type=float, default=20.0, help="arrivals per second (Poisson)")
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--groups", type=int, default=16)
    parser.add_argument("--prefix-tokens", type=int, default=2048)
    parser.add_argument("--unique", type=float, default=0.5, help="share of requests with an unshared long prompt")
    parser.add_argument("--output-tokens", type=int, default=32)
    parser.add_argument("--ttft-slo", type=float, default=300.0, help="ms")
    parser.add_argument("--tpot-slo", type=float, default=30.0, help="ms")
    parser.add_argument("--time-scale", type=float, default=2.0,
                        help="wall seconds per simulated second (2: half speed, so the load fits 2 cores)")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    rows = [_row(name, asyncio.run(run_config(name, args))) for name in args.configs.split(",")]
    print(table(rows, ["routing", "measured", "TTFT p50 ms", "p90", "p99", "TPOT p50 ms", "p99", "TTFT SLO met",
                       "TPOT SLO met", "both met", "errors"]))


if __name__ == "__main__":
    main()
