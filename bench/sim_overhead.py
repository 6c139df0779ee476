"""CPU the simulator spends per generated token and per request.

Two measurements:

1. engine only: N engines stepped in simulated time in this process, each kept at
   S running sequences; CPU per generated token of `Engine.step` alone.
2. over HTTP: `epp-sim pool --servers N --max-num-seqs S` in a child process, driven by
   a closed-loop client in this process keeping S + 8 requests in flight per server. The
   child's CPU time (from /proc) over a measurement window is divided by the tokens and
   requests the servers report in /metrics. A run with max_tokens=1 gives the cost per
   request; runs with long outputs give the cost per token (raw, and net of the
   per-request part).

    python -m bench.sim_overhead [--servers 8] [--seqs 64] [--duration 5] [--time-scale 1]

Linux only (reads /proc/<pid>/stat). Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import re
import subprocess
import sys
import time
from dataclasses import dataclass

import aiohttp

from epp_sim import ByteTokenizer, Engine, SimConfig

_TICK = os.sysconf("SC_CLK_TCK")


@dataclass
class Row:
    mode: str
    requests: int
    tokens: int
    cpu_s: float
    wall_s: float
    running: float = float("nan")  # mean running sequences per server
    system_s: float = 0.0  # kernel part of cpu_s (socket writes)

    @property
    def us_per_token(self) -> float:
        return self.cpu_s / self.tokens * 1e6 if self.tokens else float("nan")

    @property
    def us_per_request(self) -> float:
        return self.cpu_s / self.requests * 1e6 if self.requests else float("nan")


def engine_only(servers: int, seqs: int, prompt_tokens: int, max_tokens: int, steps: int) -> Row:
    """Step `servers` engines, each refilled to `seqs` sequences, for `steps` steps."""
    tok = ByteTokenizer()
    engines = [Engine(SimConfig(max_num_seqs=seqs, num_gpu_blocks=8192)) for _ in range(servers)]
    prompts = [tok.encode(f"{i:04d}" * prompt_tokens) for i in range(512)]
    clocks = [0.0] * servers
    requests = 0
    t0, w0 = time.process_time(), time.perf_counter()
    for _ in range(steps):
        for i, engine in enumerate(engines):
            while engine.num_running + engine.num_waiting < seqs:
                engine.add(str(requests), prompts[requests % 512], clocks[i], max_tokens=max_tokens)
                requests += 1
            clocks[i] += engine.step(clocks[i]) or 0.001
    cpu, wall = time.process_time() - t0, time.perf_counter() - w0
    tokens = sum(e.stats.generation_tokens for e in engines)
    running = sum(e.stats.mean_batch_occupancy for e in engines) / servers
    return Row(f"engine only, max_tokens={max_tokens}", requests, tokens, cpu, wall, running)


def _proc_cpu(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of process `pid`."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return int(fields[11]) / _TICK, int(fields[12]) / _TICK


_SAMPLE = re.compile(
    rb"^(vllm:generation_tokens_total|vllm:request_success_total|vllm:num_requests_running)"
    rb"\{[^}]*\} (\S+)$",
    re.MULTILINE,
)


async def _scrape(session: aiohttp.ClientSession, urls: list[str]) -> tuple[int, int, float]:
    """Generated tokens, finished requests and running sequences summed over servers."""
    tokens = requests = 0
    running = 0.0
    for url in urls:
        async with session.get(url + "/metrics") as resp:
            body = await resp.read()
        for name, value in _SAMPLE.findall(body):
            if name == b"vllm:generation_tokens_total":
                tokens += int(float(value))
            elif name == b"vllm:request_success_total":
                requests += int(float(value))
            else:
                running += float(value)
    return tokens, requests, running


async def _sample_running(
    session: aiohttp.ClientSession, urls: list[str], out: list[float], stop: asyncio.Event
) -> None:
    while not stop.is_set():
        out.append((await _scrape(session, urls))[2] / len(urls))
        await asyncio.sleep(0.25)


async def _worker(
    session: aiohttp.ClientSession, url: str, body: dict, stream: bool, stop: asyncio.Event, k: int
) -> None:
    i = 0
    rng = random.Random(k)
    top = body["max_tokens"]
    while not stop.is_set():
        payload = dict(body, prompt=f"{k:04d}{i:06d} " + body["prompt"])
        if top > 1:  # lengths spread over [top/2, 3*top/2] so the batch never drains in waves
            payload["max_tokens"] = rng.randint(top // 2, top * 3 // 2)
        i += 1
        async with session.post(url + "/v1/completions", json=payload) as resp:
            if stream:
                async for _ in resp.content:
                    pass
            else:
                await resp.read()


async def http_run(
    pid: int, urls: list[str], clients: int, prompt: str, max_tokens: int, stream: bool,
    warmup: float, duration: float,
) -> Row:
    body = {"prompt": prompt, "max_tokens": max_tokens, "stream": stream}
    stop = asyncio.Event()
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn) as session:
        tasks = [
            asyncio.create_task(_worker(session, url, body, stream, stop, n * clients + j))
            for n, url in enumerate(urls)
            for j in range(clients)
        ]
        await asyncio.sleep(warmup)
        tok0, req0, _ = await _scrape(session, urls)
        cpu0, wall0 = _proc_cpu(pid), time.perf_counter()
        samples: list[float] = []
        done = asyncio.Event()
        sampler = asyncio.create_task(_sample_running(session, urls, samples, done))
        await asyncio.sleep(duration)
        cpu1, wall1 = _proc_cpu(pid), time.perf_counter()
        done.set()
        await sampler
        tok1, req1, _ = await _scrape(session, urls)
        stop.set()
        failed = [t.exception() for t in tasks if t.done() and not t.cancelled() and t.exception()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    if failed:
        print(f"warning: {len(failed)} client workers failed, e.g. {failed[0]!r}", file=sys.stderr)
    if max_tokens == 1:
        lengths = "max_tokens=1"
    else:
        lengths = f"max_tokens~U[{max_tokens // 2},{max_tokens * 3 // 2}]"
    mode = f"HTTP {'streaming' if stream else 'non-streaming'}, {lengths}"
    running = sum(samples) / len(samples) if samples else 0.0
    user, system = cpu1[0] - cpu0[0], cpu1[1] - cpu0[1]
    return Row(mode, req1 - req0, tok1 - tok0, user + system, wall1 - wall0, running, system)


def _start_pool(args: argparse.Namespace) -> tuple[subprocess.Popen[str], list[str]]:
    cmd = [
        sys.executable, "-m", "epp_sim.cli", "pool", "--servers", str(args.servers),
        "--base-port", "0", "--max-num-seqs", str(args.seqs), "--num-gpu-blocks", "8192",
        "--time-scale", str(args.time_scale), "--max-waiting", "100000",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    urls = [proc.stdout.readline().split()[3] for _ in range(args.servers)]
    return proc, urls


def _table(rows: list[Row], per_request: float) -> str:
    out = [
        (
            "| mode | running/server | requests | tokens | sim CPU (s) | of which kernel "
            "| wall (s) | CPU µs/token | net µs/token | CPU µs/request |"
        ),
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        net = "–"  # only meaningful for HTTP runs with long outputs
        if r.mode.startswith("HTTP") and r.tokens > r.requests:
            net = f"{(r.cpu_s - r.requests * per_request * 1e-6) / r.tokens * 1e6:.2f}"
        out.append(
            f"| {r.mode} | {r.running:.1f} | {r.requests} | {r.tokens} | {r.cpu_s:.2f} | "
            f"{r.system_s / r.cpu_s:.0%} | {r.wall_s:.1f} | "
            f"{r.us_per_token:.2f} | {net} | {r.us_per_request:.0f} |"
        )
    return "\n".join(out)


async def _http_rows(args: argparse.Namespace, prompt: str) -> list[Row]:
    proc, urls = _start_pool(args)
    try:
        rows = []
        for max_tokens, stream in ((1, False), (args.max_tokens, False), (args.max_tokens, True)):
            clients = args.seqs + args.extra_clients
            rows.append(await http_run(proc.pid, urls, clients, prompt, max_tokens, stream,
                                       args.warmup, args.duration))
        return rows
    finally:
        proc.send_signal(2)
        proc.wait(timeout=30)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--servers", type=int, default=8)
    p.add_argument("--seqs", type=int, default=64, help="running sequences per server")
    p.add_argument("--extra-clients", type=int, default=8,
                   help="requests in flight per server beyond --seqs, so the batch stays full")
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--duration", type=float, default=5.0, help="measurement window per run (s)")
    p.add_argument("--warmup", type=float, default=2.0)
    p.add_argument("--time-scale", type=float, default=1.0)
    p.add_argument("--engine-steps", type=int, default=2000)
    args = p.parse_args(argv)
    rows = [
        engine_only(
            args.servers, args.seqs, args.prompt_tokens, args.max_tokens, args.engine_steps
        )
    ]
    prompt = "abcd" * (args.prompt_tokens - 3)  # plus the 12-byte unique head: prompt_tokens
    try:
        import uvloop

        rows += uvloop.run(_http_rows(args, prompt))
    except ImportError:
        rows += asyncio.run(_http_rows(args, prompt))
    per_request = rows[1].cpu_s / rows[1].requests * 1e6 if rows[1].requests else 0.0
    print(f"{args.servers} servers x {args.seqs} sequences, prompt {args.prompt_tokens} tokens, "
          f"time scale {args.time_scale}\n")
    print(_table(rows, per_request))


if __name__ == "__main__":
    main()
