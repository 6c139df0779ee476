"""``epp serve --workers 2 --http-port 0``: both worker processes serve the HTTP gateway on one port (the kernel
spreads connections over them), and worker 0's ``/metrics`` counts the requests both served."""

from __future__ import annotations

import asyncio
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import orjson

from epp.runtime.ports import free_ports
from epp_sim import SimConfig, SimServer

from ..conftest import eventually
from .test_serve_cli import _children

CONNECTIONS = 24


def _socket_inodes(pid: int) -> set[int]:
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = fd.readlink().as_posix()
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    return inodes


def _established_inodes(port: int) -> set[int]:
    """Inodes of ESTABLISHED IPv4 TCP sockets whose local port is ``port`` (the server sides)."""
    out = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if int(fields[1].split(":")[1], 16) == port and fields[3] == "01":
            out.add(int(fields[9]))
    return out


def _requests_total(text: str) -> float:
    return sum(float(m.group(1)) for m in re.finditer(r"^inference_objective_request_total\{[^}]*\} (\S+)$", text,
                                                       re.MULTILINE))


async def _read_until(proc: subprocess.Popen[str], pattern: str, count: int, timeout: float = 30.0) -> list[str]:
    """Lines of the process's output up to the ``count``-th one matching ``pattern``."""
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    assert proc.stdout is not None
    while sum(bool(re.search(pattern, line)) for line in lines) < count:
        assert time.monotonic() < deadline, lines
        line = await asyncio.to_thread(proc.stdout.readline)
        assert line, f"epp exited: {lines}"
        lines.append(line)
    return lines


async def test_two_workers_share_the_gateway_port_and_worker_0_counts_every_request(tmp_path: Path) -> None:
    sim = SimServer(SimConfig(model="m", time_scale=0.01))
    await sim.start("127.0.0.1", 0)
    endpoints = tmp_path / "endpoints.yaml"
    endpoints.write_text(f"endpoints:\n  - {{name: a, address: 127.0.0.1, port: {sim.port}}}\n")
    grpc_port, metrics_port = free_ports(3), free_ports(1)
    proc = subprocess.Popen([sys.executable, "-m", "epp.cli.main", "serve", "--endpoints", str(endpoints), "--workers",
                             "2", "--host", "127.0.0.1", "--grpc-port", str(grpc_port), "--health-port",
                             str(grpc_port + 1), "--metrics-port", str(metrics_port), "--plaintext", "--http-port",
                             "0", "--log-level", "WARNING"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    sessions: list[aiohttp.ClientSession] = []
    try:
        banners = [line for line in await _read_until(proc, r"gateway http://", 2) if "gateway http://" in line]
        ports = {re.findall(r"gateway http://127\.0\.0\.1:(\d+)", line)[0] for line in banners}
        assert len(banners) == 2 and len(ports) == 1, banners  # both workers, one port
        http_port = int(ports.pop())
        body = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
        for _ in range(CONNECTIONS):  # one kept-alive connection per session
            session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1))
            sessions.append(session)
            async with session.post(f"http://127.0.0.1:{http_port}/v1/chat/completions", data=body,
                                    headers={"content-type": "application/json"}) as resp:
                assert resp.status == 200, await resp.text()
                await resp.read()
        held = _established_inodes(http_port)
        per_worker = [len(_socket_inodes(pid) & held) for pid in _children(proc.pid)]
        # Every connection is held by one of the two workers, and each worker holds some.
        assert sum(per_worker) == CONNECTIONS and sum(1 for n in per_worker if n) == 2, per_worker
        async with aiohttp.ClientSession() as client:
            totals: list[float] = []

            async def counted() -> bool:
                async with client.get(f"http://127.0.0.1:{metrics_port}/metrics") as resp:
                    totals[:] = [_requests_total(await resp.text())]
                return totals == [CONNECTIONS]

            # worker 1 reports its totals every second
            await eventually(counted, lambda: f"{CONNECTIONS} requests counted, not {totals}", interval=0.2)

    finally:
        for session in sessions:
            await session.close()
        proc.send_signal(signal.SIGTERM)
        out, _ = await asyncio.to_thread(proc.communicate, timeout=30)
        await sim.stop()
    assert proc.returncode == 0, out
