"""The HTTP gateway benchmarks' load side, shared by :mod:`bench.http_gateway`, :mod:`bench.http_instructions`,
:mod:`bench.http_syscalls` and :mod:`bench.request_path`: the request bodies, a closed-loop load generator with
CPU accounting of the router process, the router child processes (started through ``python -m
bench.http_gateway``) and the markdown table."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import aiohttp
import orjson

from bench.fixed_backend import MODEL

TENANTS = 8
SYSTEM_PROMPT = ("You are a helpful assistant for online bookshop number {tenant}. Answer briefly and politely, cite "
                 "the catalogue when you can, and never invent prices. " * 6)
"""About 1 KB of shared prefix per tenant: prefix-cache affinity spreads tenants over the servers."""

# ---------------------------------------------------------------------------------------------- load


@dataclass
class Result:
    requests: int
    errors: int
    seconds: float
    latencies: list[float]
    ttfts: list[float]
    cpu_s: float | None = None
    system_s: float | None = None  # the kernel's part of cpu_s

    @property
    def rps(self) -> float:
        return self.requests / self.seconds

    def pct(self, q: float, values: list[float] | None = None) -> float:
        data = sorted(self.latencies if values is None else values)
        return data[min(len(data) - 1, int(q * len(data)))] * 1e3 if data else float("nan")


def request_body(i: int, stream: bool) -> bytes:
    body: dict[str, Any] = {"model": MODEL, "max_tokens": 16, "messages": [
        {"role": "system", "content": SYSTEM_PROMPT.format(tenant=i % TENANTS)},
        {"role": "user", "content": f"Question {i}: do you have a second-hand copy of book number {i}?"}]}
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return orjson.dumps(body)


async def one_request(session: aiohttp.ClientSession, url: str, body: bytes, stream: bool) -> tuple[float, float]:
    start = time.perf_counter()
    async with session.post(url, data=body, headers={"Content-Type": "application/json"}) as resp:
        if resp.status != 200:
            await resp.read()
            raise RuntimeError(f"HTTP {resp.status}")
        if not stream:
            await resp.read()
            end = time.perf_counter()
            return end - start, end - start
        ttft = None
        async for chunk in resp.content.iter_any():
            if ttft is None and b"data:" in chunk:
                ttft = time.perf_counter() - start
        return time.perf_counter() - start, ttft if ttft is not None else float("nan")


async def load(url: str, *, stream: bool, concurrency: int, seconds: float | None = None,
               count: int | None = None, cpu_pid: int | None = None, warmup: float = 0.5) -> Result:
    """Closed-loop load: ``concurrency`` workers send requests back to back for ``seconds`` (or ``count``)."""
    connector = aiohttp.TCPConnector(limit=concurrency, limit_per_host=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:
        bodies = [request_body(i, stream) for i in range(64)]
        deadline = time.perf_counter() + warmup
        while time.perf_counter() < deadline:  # fill the connection pools on both sides
            await asyncio.gather(*(one_request(session, url, bodies[i], stream) for i in range(concurrency)))
        lat: list[float] = []
        ttft: list[float] = []
        errors = 0
        sent = 0
        cpu0 = cpu_times(cpu_pid)
        start = time.perf_counter()
        stop_at = start + seconds if seconds is not None else None

        async def worker() -> None:
            nonlocal errors, sent
            while (stop_at is None or time.perf_counter() < stop_at) and (count is None or sent < count):
                sent += 1
                try:
                    total, first = await one_request(session, url, bodies[sent % len(bodies)], stream)
                except (aiohttp.ClientError, RuntimeError):
                    errors += 1
                    continue
                lat.append(total)
                ttft.append(first)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - start
        cpu1 = cpu_times(cpu_pid)
    if cpu0 is None or cpu1 is None:
        return Result(len(lat), errors, elapsed, lat, ttft)
    user, system = cpu1[0] - cpu0[0], cpu1[1] - cpu0[1]
    return Result(len(lat), errors, elapsed, lat, ttft, user + system, system)


def cpu_times(pid: int | None) -> tuple[float, float] | None:
    """(user, system) CPU seconds of process ``pid``, all its threads (Linux ``/proc``), or None."""
    if pid is None:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


# ---------------------------------------------------------------------------------------------- driver


class Child:
    """A child process of this script that prints one JSON line when it is ready."""

    def __init__(self, *argv: str) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "bench.http_gateway", *argv], stdout=subprocess.PIPE,
                                     text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"child {argv[0]} failed to start")
        self.info = json.loads(line)

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def router_args(target: str, ports: list[int]) -> list[str]:
    """This script's arguments for one router process over ``ports``: an EPP profile on the lean stack, or the
    TCP byte relay (``relay``). Such a process prints one JSON line with its port when it is ready."""
    role = ["_relay"] if target == "relay" else ["_epp", "--profile-name", target, "--transport", "lean"]
    return [*role, "--upstreams", ",".join(map(str, ports))]


def add_sequential_options(parser: argparse.ArgumentParser, requests: int) -> None:
    """The options of the per-request gauges (``http_instructions``, ``http_syscalls``): rows of sequential
    requests to each router target, in each mode."""
    parser.add_argument("--requests", type=int, default=requests, help="measured sequential requests per row")
    parser.add_argument("--targets", default="round-robin,default,relay",
                        help="EPP profiles and/or 'relay' (the TCP byte relay floor)")
    parser.add_argument("--modes", default="json,stream", help="json and/or stream")
    parser.add_argument("--tokens", type=int, default=16, help="SSE chunks per streamed answer")


def sequential_rows(args: argparse.Namespace, cells: Callable[[str, bool, list[int]], list[str]]) -> list[list[str]]:
    """The per-request gauges' run: the 20 ms fixed backend, then one row per mode and target (options of
    :func:`add_sequential_options`), ``[mode, router, *cells(target, stream, ports)]``, each printed as it lands."""
    backend = Child("_backend", "--latency", "0.02", "--tokens", str(args.tokens))
    rows: list[list[str]] = []
    try:
        for mode in args.modes.split(","):
            for target in args.targets.split(","):
                router = "TCP byte relay (floor)" if target == "relay" else f"EPP {target}"
                rows.append([mode, router, *cells(target, mode == "stream", backend.info["ports"])])
                print(*rows[-1], sep="  ", flush=True)
    finally:
        backend.stop()
    return rows


def router_url(proc: subprocess.Popen[str], target: str) -> str:
    """The chat completions URL of a router process started with :func:`router_args`, from its ready line."""
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        raise RuntimeError(f"{target}: the router process did not start")
    return f"http://127.0.0.1:{json.loads(line)['port']}/v1/chat/completions"


def table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    line = lambda r: "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |"  # noqa: E731
    return "\n".join([line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, rows)])


def run_loop(coro: Any) -> Any:
    from epp.gateway import run

    return run(coro)
