"""``bench.http_gateway``'s fixed backend: step pacing makes the streams of one server share its engine steps,
as vLLM's continuous batching emits tokens, and the benchmark's backend list follows ``--latencies``/``--pacing``."""

from __future__ import annotations

import argparse
import asyncio

import aiohttp
import pytest
from aiohttp import web

from bench.fixed_backend import MODEL, FixedBackend, StepClock
from bench.http_gateway import _backends


async def test_step_clock_shares_one_future_per_step_and_keeps_boundaries_on_its_grid() -> None:
    period, phase = 0.002, 0.0005
    clock = StepClock(period, phase)
    boundaries = []
    for _ in range(8):
        first, second = clock.step(), clock.step()
        assert first is second  # every stream waiting for the next step wakes at the same tick
        boundaries.append(clock.boundary)
        await first
    assert clock.ticks == 8
    for b in boundaries:
        k = (b - phase) / period
        assert k == pytest.approx(round(k), abs=1e-6)
    gaps = [(b - a) / period for a, b in zip(boundaries, boundaries[1:])]
    assert all(round(g) >= 1 and g == pytest.approx(round(g), abs=1e-6) for g in gaps)


async def _stream(session: aiohttp.ClientSession, url: str) -> list[bytes]:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}
    async with session.post(url, json=body) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        return [line async for line in resp.content if line.strip()]


@pytest.mark.parametrize("pacing", ["request", "step"])
async def test_fixed_backend_streams_every_token_with_either_pacing(pacing: str) -> None:
    tokens = 16
    backend = FixedBackend(0.02, tokens, pacing)
    runner = web.AppRunner(backend.app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}/v1/chat/completions"
    try:
        async with aiohttp.ClientSession() as session:
            streams = await asyncio.gather(*(_stream(session, url) for _ in range(3)))
    finally:
        await runner.cleanup()
    for lines in streams:
        assert len(lines) == tokens + 1
        assert lines[-1].strip() == b"data: [DONE]"
        assert all(f'" tok{i}"'.encode() in line for i, line in enumerate(lines[:-1]))
    if pacing == "step":  # three concurrent streams share steps: fewer steps than tokens sent
        assert backend.clock is not None and 0 < backend.clock.ticks < 3 * tokens
    else:
        assert backend.clock is None


def test_backends_step_pacing_adds_streams_on_nonzero_latencies_only() -> None:
    def args(latencies: str, pacing: str, backend: str = "fixed") -> argparse.Namespace:
        return argparse.Namespace(latencies=latencies, pacing=pacing, backend=backend)

    assert _backends(args("0,0.02", "request,step")) == [(0.0, "request"), (0.02, "request"), (0.02, "step")]
    assert _backends(args("0,0.02", "step")) == [(0.02, "step")]
    with pytest.raises(SystemExit, match="--pacing: unknown batch"):
        _backends(args("0.02", "batch"))
    with pytest.raises(SystemExit, match="only the fixed backend"):
        _backends(args("0.02", "step", backend="sim"))
