"""What every attack of :mod:`bench.attacks` is given and returns, and the helpers several attacks share.

An attack is ``async def attack(target: Target, p: Params) -> Outcome``: it connects only to ``target`` (EPP on
127.0.0.1), stops by itself within ``p``'s counts and time bounds, closes every connection it opened, and returns
what it measured (``Outcome.facts``, text for the table) and, for connections that a timeout should close,
``Outcome.closes``: per connection, when the server closed it (seconds after it was opened) or None when it was
still open when the watch ended. RSS, CPU and the well-behaved client are the orchestrator's (:mod:`bench.attacks`).
"""

from __future__ import annotations

import asyncio
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["NOT_JUDGED", "Closes", "Outcome", "Params", "PRESETS", "Target", "Timeouts", "close_all", "open_tcp",
           "rss_kb", "watch_close", "watch_until"]

MIB = 1 << 20
NOT_JUDGED = "not judged"


@dataclass(frozen=True)
class Target:
    """Where EPP listens (all on ``host``) and its process id."""

    host: str
    extproc_port: int
    gateway_port: int
    metrics_port: int
    pid: int


@dataclass(frozen=True)
class Timeouts:
    """The timeouts EPP is expected to enforce (seconds): what the close columns are judged against. The defaults
    are EPP's own (``H2Limits``, ``--http-header-timeout``, ``--http-body-timeout``)."""

    preface: float = 10.0  # a connection that never sends the HTTP/2 preface
    idle: float = 300.0  # an HTTP/2 connection with no stream after the preface
    head: float = 30.0  # an HTTP/1.1 request head that is still incomplete
    body: float = 60.0  # an HTTP/1.1 request body that stopped arriving
    slack: float = 2.0  # timer granularity allowed on top of each


@dataclass(frozen=True)
class Params:
    """Sizes and time bounds of every attack (see :data:`PRESETS`)."""

    seconds: float  # time bound of each flood (a, b, c, d)
    hold: float  # how long the attacker keeps its connections after sending, so the RSS peak is seen
    max_wait: float  # longest any close is waited for (e, f, g); a timeout beyond it is not judged
    big_streams: int = 60  # a
    big_message: int = 10 * MIB
    stall: float = 2.0  # a: no window for this long = the server's flow control stopped the attacker
    streams: int = 100_000  # b
    pings: int = 8_000_000  # c (each of PING and SETTINGS)
    continuations: int = 4_000_000  # d
    huffman_bytes: int = MIB
    idle_connections: int = 50  # e (each of no preface, idle after it)
    slowloris: int = 500  # f
    slowloris_interval: float = 10.0
    slowloris_seconds: float | None = None  # None: the head timeout + slack + one interval
    trickled: int = 2  # g
    trickle_after: int = 9_000_000
    trickle_interval: float = 30.0
    stalled: int = 40
    stalled_size: int = 10_000_000
    flood: int = 1_100  # h
    flood_seconds: float = 20.0
    flood_nofile: int = 1_024
    head_bytes: int = 127 * 1024  # i
    piece: int = 64
    models: int = 30  # j
    timeouts: Timeouts = field(default_factory=Timeouts)


PRESETS = {
    "full": Params(seconds=10.0, hold=2.0, max_wait=125.0),
    "quick": Params(seconds=4.0, hold=1.0, max_wait=13.0, big_streams=8, streams=10_000, pings=500_000,
                    continuations=500_000, idle_connections=10, slowloris=50, slowloris_interval=2.0, trickled=1,
                    trickle_interval=5.0, stalled=8, flood_seconds=6.0),
    "tiny": Params(seconds=0.5, hold=0.1, max_wait=1.0, big_streams=2, big_message=MIB, streams=200, pings=20_000,
                   continuations=20_000, huffman_bytes=64 * 1024, idle_connections=3, slowloris=5,
                   slowloris_interval=0.3, slowloris_seconds=1.0, trickled=1, trickle_after=100_000,
                   trickle_interval=0.3, stalled=2, stalled_size=200_000, flood=20, flood_seconds=1.0,
                   flood_nofile=0, head_bytes=8 * 1024, models=3),
}
"""``full``: the issue's sizes (about 8 minutes); ``quick``: smaller counts and short bounds (about 2 minutes);
``tiny``: the plumbing test's."""


@dataclass
class Closes:
    """When the server closed each watched connection (seconds after it was opened; None: still open after
    ``watched`` seconds). ``timeout`` is what the closes are judged against (None: reported, not judged)."""

    timeout: float | None
    watched: float
    times: list[float | None]

    def verdict(self, slack: float) -> str:
        """PASS (all closed within the timeout), FAIL (one closed late, or is open past it), "not judged" (one is
        open, but the watch ended before the timeout did) or "-" (no timeout to judge against)."""
        if self.timeout is None:
            return "-"
        limit = self.timeout + slack
        if any(t is not None and t > limit for t in self.times):
            return "FAIL"
        if any(t is None for t in self.times):
            return "FAIL" if self.watched >= limit else NOT_JUDGED
        return "PASS"

    def summary(self) -> str:
        closed = [t for t in self.times if t is not None]
        text = f"{len(closed)}/{len(self.times)} closed"
        if closed:
            text += f" at {min(closed):.1f}–{max(closed):.1f} s"
        text += f" (watched {self.watched:.0f} s"
        return text + (f", timeout {self.timeout:g} s)" if self.timeout is not None else ")")


@dataclass
class Outcome:
    """What one attack measured besides RSS, CPU and the client's latency."""

    facts: dict[str, str]
    closes: Closes | None = None


# -- connections --------------------------------------------------------------------------------------------

async def open_tcp(host: str, port: int, timeout: float = 5.0) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A TCP connection with Nagle off (each small write leaves as its own segment)."""
    reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
    sock = writer.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return reader, writer


async def watch_close(reader: asyncio.StreamReader, opened: float, until: float) -> float | None:
    """Read (and drop) what the server sends until it closes the connection: seconds from ``opened`` to the
    close, or None when the connection is still open at ``until`` (``time.monotonic()`` clock)."""
    while True:
        left = until - time.monotonic()
        if left <= 0:
            return None
        try:
            data = await asyncio.wait_for(reader.read(65536), left)
        except asyncio.TimeoutError:
            return None
        except (ConnectionError, OSError):
            data = b""
        if not data:
            return time.monotonic() - opened


def close_all(writers: list[asyncio.StreamWriter]) -> None:
    """Abort every connection (no lingering FIN handshake to wait for)."""
    for writer in writers:
        writer.transport.abort()


def watch_until(p: Params, timeout: float, extra: float = 1.0) -> float:
    """How long to watch connections a ``timeout`` should close: past it by the slack and ``extra``. When that is
    beyond ``p.max_wait`` the closes cannot be judged, and the watch is only ``p.seconds`` (what EPP closes early
    still shows)."""
    needed = timeout + p.timeouts.slack + extra
    return needed if needed <= p.max_wait else min(p.max_wait, p.seconds)


# -- /proc ---------------------------------------------------------------------------------------------------

def rss_kb(pid: int) -> int | None:
    """Resident set size of ``pid`` in KiB (``VmRSS``), or None when the process is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None
