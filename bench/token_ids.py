"""What getting a prompt's token ids costs EPP: a render call to a render server against the local tokenizer.

The routing benchmark's prompts (``--workload``, default shared-prefix: ~28,000-character system prompts plus a
question) go one at a time, or ``--concurrency`` at a time, through ``token-producer.prepare`` with each backend:

* ``vllm``: a render call to a simulator of its own (``epp-sim`` in a child process, the same ``tokenizer.json``);
* ``local``: the model's ``tokenizer.json`` and chat template in this process, encoded in worker threads.

For each: latency of ``prepare`` (p50/p99 ms), CPU per request of this process (all threads) and of the render
server (from /proc), and the event loop's longest stall while the requests ran (a 1 ms ticker's worst lateness):
the local backend's encoding should not hold up the loop. The ids of both backends are compared request by request.

    python -m bench.token_ids [--workload shared-prefix] [--requests 200] [--concurrency 1] [--tokenizer DIR]

Linux only (reads /proc/<pid>/stat). Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.routing.pool import SimFleet
from bench.routing.tokenizer import build
from bench.routing.workloads import MODEL, WORKLOADS, ServerSpec, generate
from epp.framework.plugins import Handle
from epp.framework.request import InferenceRequest, parse_request
from epp.runtime.builtins import default_registry

_TICKS = os.sysconf("SC_CLK_TCK")


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS  # utime + stime


async def _ticker(worst: list[float], stop: asyncio.Event) -> None:
    while not stop.is_set():
        began = time.perf_counter()
        await asyncio.sleep(0.001)
        worst[0] = max(worst[0], time.perf_counter() - began - 0.001)


async def _run(producer: Any, bodies: list[bytes], concurrency: int,
               render_pid: int | None) -> tuple[dict[str, float], list[Any]]:
    requests = [parse_request("/v1/chat/completions", body, {}) for body in bodies]
    latencies: list[float] = []
    gate = asyncio.Semaphore(concurrency)

    async def one(request: InferenceRequest) -> None:
        async with gate:
            began = time.perf_counter()
            await producer.prepare(request)
            latencies.append(time.perf_counter() - began)

    worst, stop = [0.0], asyncio.Event()
    ticker = asyncio.create_task(_ticker(worst, stop))
    cpu0, server0, wall0 = time.process_time(), _cpu_seconds(render_pid) if render_pid else 0.0, time.perf_counter()
    await asyncio.gather(*(one(r) for r in requests))
    wall = time.perf_counter() - wall0
    cpu = time.process_time() - cpu0
    server = _cpu_seconds(render_pid) - server0 if render_pid else 0.0
    stop.set()
    await ticker
    latencies.sort()
    n = len(requests)
    return ({"p50": latencies[n // 2] * 1e3, "p99": latencies[min(n - 1, int(n * 0.99))] * 1e3,
             "cpu": cpu / n * 1e3, "server": server / n * 1e3, "stall": worst[0] * 1e3, "rate": n / wall,
             "failures": producer.failures}, [r.token_ids for r in requests])


async def main(args: argparse.Namespace) -> None:
    folder = args.tokenizer or build(Path(tempfile.mkdtemp(prefix="epp-tok-")))
    schedule = generate(WORKLOADS[args.workload], 10, args.requests / 10 + 10, 1)[:args.requests]
    bodies = [r.body for r in schedule]
    registry = default_registry()
    render = SimFleet([ServerSpec()], Path(tempfile.mkdtemp(prefix="epp-render-")), tokenizer=folder)
    await render.start()
    try:
        backends = {
            "vllm (render call)": {"modelName": MODEL, "vllm": {"http": render.servers[0].url}},
            "local": {"local": {"tokenizer": str(folder), "workers": args.workers}},
        }
        rows, ids = {}, {}
        for label, params in backends.items():
            producer = registry.create("token-producer", "tp", params, Handle())
            await producer.start(None)
            try:
                await _run(producer, bodies[:5], 1, None)  # warm-up: connections, template, thread pool
                producer.failures = 0
                pid = render.pids()[0] if label.startswith("vllm") else None
                rows[label], ids[label] = await _run(producer, bodies, args.concurrency, pid)
            finally:
                await producer.stop()
    finally:
        await render.stop()
    same = sum(a == b and a is not None for a, b in zip(*ids.values()))
    mean_chars = statistics.mean(len(b) for b in bodies)
    print(f"{args.workload}: {len(bodies)} chat requests (mean body {mean_chars:,.0f} bytes), concurrency "
          f"{args.concurrency}, {args.workers} local workers, {os.cpu_count()} CPUs\n")
    print("| backend | prepare p50 ms | p99 ms | CPU ms/request, EPP | CPU ms/request, render server "
          "| longest event-loop stall ms | requests/s | failures |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for label, r in rows.items():
        print(f"| {label} | {r['p50']:.2f} | {r['p99']:.2f} | {r['cpu']:.2f} | {r['server']:.2f} | "
              f"{r['stall']:.2f} | {r['rate']:.0f} | {r['failures']:.0f} |")
    print(f"\nIds equal in both backends for {same} of {len(bodies)} requests.")


if __name__ == "__main__":
    p = argparse.ArgumentParser(prog="python -m bench.token_ids", description=__doc__.splitlines()[0])
    p.add_argument("--workload", default="shared-prefix", choices=list(WORKLOADS))
    p.add_argument("--requests", type=int, default=200)
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--workers", type=int, default=2, help="the local backend's encoding threads")
    p.add_argument("--tokenizer", type=Path, help="a folder from bench.routing.tokenizer (default: build one)")
    asyncio.run(main(p.parse_args()))
