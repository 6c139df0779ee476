"""Scheduler benchmark: decisions/s and p50/p99 of one scheduling cycle with the default profile (or ``--config``).

The default profile is the reference's (queue 2, kv-cache 2, prefix 3, max-score-picker). Endpoints carry random
queue/KV metrics; the prefix index is warmed with earlier requests (PreRequest hooks run between cycles, as in
production) so prefix matching does real work. Prompts share a long system prefix in groups, like chat traffic.
With ``--running N`` the first N warm-up requests also get their first byte (ResponseStarted hooks) and stay in
flight, so plugins that book running answers (``ttft-cost-scorer``) score against N of them.

Usage: python -m bench.scheduler [--cycles N] [--seed S] [--config FILE ...] [--running N]
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import time
from pathlib import Path

import orjson

from epp.config.loader import load_config
from epp.framework.endpoint import Endpoint, EndpointSpec, Metrics
from epp.framework.request import parse_request
from epp.runtime.builtins import default_registry

SIZES = (8, 64, 256)
PROMPTS = (2 * 1024, 32 * 1024)


def make_endpoints(n: int, rng: random.Random) -> list[Endpoint]:
    """``n`` endpoints with random load, as a scrape would leave them."""
    return [Endpoint(EndpointSpec(name=f"pod-{i}", address=f"10.1.{i // 250}.{i % 250 + 1}", port=8000),
                     Metrics(waiting=rng.randint(0, 20), running=rng.randint(0, 64), kv_usage=rng.random(),
                             block_size=16, num_gpu_blocks=20000, update_time=time.monotonic()))
            for i in range(n)]


def make_bodies(prompt_bytes: int, count: int, rng: random.Random) -> list[bytes]:
    """Chat bodies of about ``prompt_bytes``: 16 groups sharing a system prompt, each with its own question."""
    systems = ["".join(rng.choice("abcdefghij ") for _ in range(prompt_bytes * 3 // 4)) for _ in range(16)]
    bodies = []
    for i in range(count):
        question = "".join(rng.choice("klmnopqrst ") for _ in range(prompt_bytes // 4))
        msgs = [{"role": "system", "content": systems[i % 16]}, {"role": "user", "content": question}]
        bodies.append(orjson.dumps({"model": "m", "messages": msgs, "max_tokens": 128}))
    return bodies


def run_case(n_endpoints: int, prompt_bytes: int, cycles: int, seed: int, config: str | None = None,
             running: int = 0) -> tuple[float, float, float, float, float]:
    """(decisions/s, wall p50 µs, wall p99 µs, CPU p50 µs, CPU p99 µs) of ``Scheduler.schedule`` for one case.

    Wall time includes any preemption by other processes; thread CPU time does not, so on a shared machine the
    CPU percentiles are the figure that carries over.
    """
    rng = random.Random(seed)
    pipeline = load_config(config, default_registry(entry_points=False))
    endpoints = make_endpoints(n_endpoints, rng)
    warm = max(cycles // 4, running)
    bodies = make_bodies(prompt_bytes, cycles + warm, rng)
    requests = [parse_request("/v1/chat/completions", b, {}) for b in bodies[warm:]]
    schedule = pipeline.scheduler.schedule
    in_flight = []  # kept alive, as a request context keeps its request: plugins key their books by the object
    for i, body in enumerate(bodies[:warm]):  # warm the prefix index; the first ``running`` stay in flight
        req = parse_request("/v1/chat/completions", body, {})
        result = schedule(req, endpoints)
        for hook in pipeline.pre_request:
            hook.pre_request(req, result)
        if i < running:
            in_flight.append(req)
            for started in pipeline.response_started:
                started.response_started(req, result.target)
    samples: list[float] = []
    cpu: list[float] = []
    gc.collect()
    for req in requests:
        c0, t0 = time.thread_time(), time.perf_counter()
        result = schedule(req, endpoints)
        t1, c1 = time.perf_counter(), time.thread_time()
        samples.append(t1 - t0)
        cpu.append(c1 - c0)
        for hook in pipeline.pre_request:
            hook.pre_request(req, result)
    return (1.0 / statistics.fmean(samples), _pct(samples, 0.5), _pct(samples, 0.99), _pct(cpu, 0.5),
            _pct(cpu, 0.99))


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))] * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--config", action="append", default=None,
                        help="an EndpointPickerConfig file (repeat to compare, side by side; default: the default)")
    parser.add_argument("--running", type=int, default=0, help="requests in flight (started) while measuring")
    args = parser.parse_args()
    print(f"{'config':>24} {'endpoints':>9} {'prompt':>7} {'decisions/s':>12} {'wall p50 ms':>12} "
          f"{'wall p99 ms':>12} {'cpu p50 ms':>11} {'cpu p99 ms':>11}")
    for n in SIZES:
        for size in PROMPTS:
            for config in args.config or [None]:
                rate, p50, p99, c50, c99 = run_case(n, size, args.cycles, args.seed, config, args.running)
                name = "default" if config is None else Path(config).stem
                print(f"{name:>24} {n:>9} {size // 1024:>5}KB {rate:>12,.0f} {p50 / 1000:>12.3f} "
                      f"{p99 / 1000:>12.3f} {c50 / 1000:>11.3f} {c99 / 1000:>11.3f}")


if __name__ == "__main__":
    main()
