"""Open-loop replay of a request schedule against one router, measuring each request as its client sees it.

``await replay(url, requests)`` sends request ``i`` ``requests[i].offset`` seconds after the start, whether or not
earlier ones have been answered (open loop: a slow router faces the same arrivals as a fast one), each with its exact
body bytes and ``x-request-id: <index>``. For each it records an :class:`Outcome`: the HTTP status, the time to the
first ``data:`` line of the SSE stream (TTFT: the simulator sends its first chunk with the first token, as vLLM
does), the time to the end of the answer (E2E), the usage of the last chunk (prompt, cached and completion tokens)
and how late the request left compared with its offset (``lag``: the load generator's own delay, to check that it
kept up). ``Progress`` draws a one-line progress bar on stderr.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TextIO

import aiohttp
import orjson

from bench.routing.workloads import Request

__all__ = ["Outcome", "Progress", "replay"]


@dataclass(slots=True)
class Outcome:
    """What one request got. Times in seconds; ``ttft``/``e2e`` are None when no answer came."""

    index: int
    status: int = 0  # 0: no HTTP answer (connection error, timeout)
    ttft: float | None = None
    e2e: float | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    lag: float = 0.0
    end: float = 0.0  # seconds after the run's start when the answer ended
    error: str | None = None
    servers: list[int] | None = None  # the pool's servers that accepted it (see bench.routing.runs.where_served)

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.error is None and self.ttft is not None


class Progress:
    """``done / total`` requests as a bar on stderr, redrawn at most ten times a second."""

    def __init__(self, total: int, label: str, stream: TextIO = sys.stderr) -> None:
        self.total, self.label, self.stream = total, label, stream
        self.done = self.failed = 0
        self._drawn = 0.0
        # Not a terminal (a log file, a pipe): one line at the end instead of redraws.
        self._live = stream.isatty()

    def advance(self, ok: bool) -> None:
        self.done += 1
        self.failed += not ok
        now = time.monotonic()
        if (self._live and now - self._drawn >= 0.1) or self.done == self.total:
            self._drawn = now
            self.draw()

    def draw(self) -> None:
        width = 30
        filled = width * self.done // max(1, self.total)
        failed = f" {self.failed} failed" if self.failed else ""
        start, erase = ("\r", "\033[K") if self._live else ("", "")
        self.stream.write(f"{start}{self.label} [{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total}"
                          f"{failed}{erase}")
        if self.done == self.total:
            self.stream.write("\n")
        self.stream.flush()


async def replay(url: str | Sequence[str], requests: list[Request], *, progress: Progress | None = None,
                 request_timeout: float = 600.0) -> list[Outcome]:
    """Send ``requests`` to the router at ``url`` (its base URL) on their schedule; one Outcome per request, in
    index order. With several base URLs (replicas of one router) request ``i`` goes to the ``i mod n``-th."""
    urls = [url] if isinstance(url, str) else list(url)
    outcomes = [Outcome(r.index) for r in requests]
    timeout = aiohttp.ClientTimeout(total=request_timeout)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as session:
        loop = asyncio.get_running_loop()
        start = loop.time() + 0.05  # room to create the first tasks before the first offset
        tasks = []
        for request in sorted(requests, key=lambda r: r.offset):
            delay = start + request.offset - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            outcome = outcomes[request.index]
            outcome.lag = max(0.0, loop.time() - start - request.offset)
            done = progress.advance if progress else None
            target = urls[request.index % len(urls)]
            tasks.append(asyncio.ensure_future(_one(session, target, request, outcome, start, done)))
        await asyncio.gather(*tasks)
    return outcomes


async def _one(session: aiohttp.ClientSession, url: str, request: Request, outcome: Outcome, start: float,
               done: Callable[[bool], None] | None) -> None:
    loop = asyncio.get_running_loop()
    sent = loop.time()
    headers = {"content-type": "application/json", "x-request-id": str(request.index)}
    try:
        async with session.post(url + request.path, data=request.body, headers=headers) as resp:
            outcome.status = resp.status
            if resp.status != 200:
                outcome.error = (await resp.read())[:200].decode(errors="replace")
            else:
                await _read_stream(resp, outcome, sent)
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        outcome.error = f"{type(exc).__name__}: {exc}"
    outcome.end = loop.time() - start
    if outcome.ttft is not None and outcome.error is None:
        outcome.e2e = loop.time() - sent
    if done:
        done(outcome.ok)


async def _read_stream(resp: aiohttp.ClientResponse, outcome: Outcome, sent: float) -> None:
    loop = asyncio.get_running_loop()
    saw_done = False
    async for line in resp.content:
        if not line.startswith(b"data: "):
            continue
        if outcome.ttft is None:
            outcome.ttft = loop.time() - sent
        if line.startswith(b"data: [DONE]"):
            saw_done = True
        elif b'"usage":{' in line and b"prompt_tokens_details" in line:
            _read_usage(orjson.loads(line[6:]), outcome)
    if not saw_done:
        outcome.error = "the stream ended without data: [DONE]"


def _read_usage(chunk: dict[str, object], outcome: Outcome) -> None:
    usage = chunk.get("usage")
    if not isinstance(usage, dict):
        return
    outcome.prompt_tokens = int(usage.get("prompt_tokens") or 0)
    outcome.completion_tokens = int(usage.get("completion_tokens") or 0)
    details = usage.get("prompt_tokens_details") or {}
    outcome.cached_tokens = int(details.get("cached_tokens") or 0) if isinstance(details, dict) else 0
