"""The processes :mod:`bench.attacks` runs and watches: EPP (``epp serve``, fresh for each attack), the
well-behaved client (:mod:`bench.attacks_probe`), and a thread sampling EPP's RSS from ``/proc``.

Every process started here is stopped by the same object that started it (SIGTERM, then SIGKILL after a bound), and
every wait is bounded; EPP's output goes to a log file so that a flood of warnings never blocks it on a pipe.
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import re
import resource
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

from bench.attacks_base import Target, rss_kb

__all__ = ["Epp", "Probe", "RssSampler", "Window", "window"]

ROOT = Path(__file__).resolve().parent.parent
_BANNER = "epp serving:"
_PR_SET_PDEATHSIG = 1


def _die_with_us(nofile: int = 0) -> Callable[[], None]:
    """A ``preexec_fn``: the child gets SIGTERM when this process dies, even by SIGKILL (Linux
    ``PR_SET_PDEATHSIG``), so an interrupted run leaves nothing behind; ``nofile`` lowers its ``RLIMIT_NOFILE``."""
    def setup() -> None:
        ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if nofile:
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

    return setup


def _stop(proc: subprocess.Popen[Any], grace: float) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


class Epp:
    """``epp serve`` over the endpoints in ``endpoints``: ext_proc (``transport``), gateway and metrics on free
    ports of 127.0.0.1, output to ``log``; ``nofile`` lowers its ``RLIMIT_NOFILE``; ``extra`` flags come last, so
    they win."""

    def __init__(self, endpoints: Path, transport: str, log: Path, extra: list[str], nofile: int = 0) -> None:
        self.log = log
        self.argv = [sys.executable, "-m", "epp.cli.main", "serve", "--endpoints", str(endpoints), "--host", "127.0.0.1",
                     "--grpc-port", "0", "--health-port", "0", "--metrics-port", "0", "--http-port", "0",
                     "--plaintext", "--log-level", "WARNING", "--shutdown-grace", "2", "--extproc-transport",
                     transport, *extra]
        self.nofile = nofile
        self.proc: subprocess.Popen[bytes] | None = None

    async def start(self, timeout: float = 30.0) -> Target:
        """Start EPP and wait for its banner: where it listens."""
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         cwd=ROOT, preexec_fn=_die_with_us(self.nofile))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.log.read_text(errors="replace")
            line = next((ln for ln in text.splitlines() if ln.startswith(_BANNER)), None)
            if line is not None:
                return self._target(line)
            if self.proc.poll() is not None:
                raise RuntimeError(f"epp serve exited with {self.proc.returncode}:\n{text[-2000:]}")
            await asyncio.sleep(0.05)
        self.stop()
        raise RuntimeError(f"epp serve printed no banner in {timeout:g} s (log: {self.log})")

    def _target(self, banner: str) -> Target:
        assert self.proc is not None

        def port(pattern: str) -> int:
            found = re.search(pattern, banner)
            if found is None:
                raise RuntimeError(f"no port matching {pattern!r} in {banner!r}")
            return int(found.group(1))

        return Target("127.0.0.1", port(r"ext_proc :(\d+)"), port(r"gateway http://[\d.]+:(\d+)"),
                      port(r"metrics :(\d+)/metrics"), self.proc.pid)

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        if self.proc is not None:
            _stop(self.proc, 15.0)


class Probe:
    """The well-behaved client process (``kind`` extproc or gateway) against ``port``."""

    def __init__(self, kind: str, port: int, max_seconds: float) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.attacks", "_probe", "--kind", kind, "--port", str(port), "--max-seconds",
             str(max_seconds)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT,
            preexec_fn=_die_with_us())

    async def ready(self, timeout: float = 40.0) -> None:
        """Wait for its first successful request."""
        assert self.proc.stdout is not None
        line = await self._readline(timeout)
        if line.strip() != "READY":
            self.kill()
            raise RuntimeError(f"the well-behaved client did not start: {line!r}")

    async def samples(self, timeout: float = 30.0) -> list[tuple[float, float, bool]]:
        """Tell it to stop; its samples ``(start, end, ok)``."""
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write("STOP\n")
            self.proc.stdin.flush()
        except OSError:
            pass
        line = await self._readline(timeout)
        self.kill()
        return [(float(a), float(b), bool(ok)) for a, b, ok in json.loads(line)] if line else []

    async def _readline(self, timeout: float) -> str:
        assert self.proc.stdout is not None
        try:
            return await asyncio.wait_for(asyncio.to_thread(self.proc.stdout.readline), timeout)
        except asyncio.TimeoutError:
            self.kill()  # the reading thread then sees EOF
            return ""

    def kill(self) -> None:
        _stop(self.proc, 5.0)


class RssSampler:
    """Samples ``pid``'s RSS every ``interval`` seconds in a thread, from :meth:`start` to :meth:`stop`."""

    def __init__(self, pid: int, interval: float = 0.02) -> None:
        self.pid, self.interval = pid, interval
        self.base = self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self.base = self.peak = rss_kb(self.pid) or 0
        self._thread.start()

    def stop(self) -> tuple[int, int]:
        """(RSS at the start, peak RSS) in KiB."""
        self._stop.set()
        self._thread.join(5)
        return self.base, self.peak

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.peak = max(self.peak, rss_kb(self.pid) or 0)


class Window:
    """The well-behaved client's requests in a time window: how many, how many failed, latency percentiles."""

    def __init__(self, samples: list[tuple[float, float, bool]]) -> None:
        latencies = sorted(end - start for start, end, ok in samples if ok)
        self.requests = len(samples)
        self.errors = sum(1 for *_, ok in samples if not ok)
        self.p50, self.p99 = _percentile(latencies, 0.50), _percentile(latencies, 0.99)
        self.max = _percentile(latencies, 1.0)


def _percentile(ordered: list[float], q: float) -> float:
    """The ``q`` quantile of sorted seconds, in ms (NaN for none)."""
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1e3 if ordered else float("nan")


def window(samples: list[tuple[float, float, bool]], start: float, end: float, *, within: bool) -> Window:
    """The requests wholly within ``[start, end]`` (``within``: the quiet window), or overlapping it (the attack
    window: a request the attack stalled counts there even if it started before)."""
    if within:
        return Window([s for s in samples if start <= s[0] and s[1] <= end])
    return Window([s for s in samples if s[1] > start and s[0] < end])
