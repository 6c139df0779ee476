"""``epp serve`` as a process: --workers N binds consecutive ext_proc ports; SIGTERM stops every worker cleanly."""

from __future__ import annotations

import asyncio
import random
import signal
import socket
import subprocess
import sys
from pathlib import Path

import aiohttp
import grpc
import pytest

from ..conftest import eventually


def _ephemeral_range() -> tuple[int, int]:
    try:
        lo, hi = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
        return lo, hi
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def _free_consecutive_ports(n: int, avoid: range = range(0)) -> int:
    """``n`` consecutive free ports, below the kernel's ephemeral range: a port handed to the child must not be one
    that any connect() or bind(0) on the machine (this test's own gRPC client included) may take before the child
    binds it, which is what a port from bind(0) is exposed to."""
    lo, _ = _ephemeral_range()
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(10000, max(10001, lo - n))
        if any(port in avoid for port in range(base, base + n)):
            continue
        socks = []
        try:
            for i in range(n):
                t = socket.socket()
                socks.append(t)
                t.bind(("127.0.0.1", base + i))
            return base
        except OSError:
            continue
        finally:
            for t in socks:
                t.close()
    raise RuntimeError("no consecutive free ports")


async def _channel_ready(port: int, timeout: float = 20.0) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        await asyncio.wait_for(channel.channel_ready(), timeout)


async def test_serve_with_two_workers(tmp_path: Path) -> None:
    endpoints = tmp_path / "endpoints.yaml"
    endpoints.write_text("endpoints:\n  - {name: a, address: 127.0.0.1, port: 9}\n")
    # The health port right after the ext_proc port, as with the defaults (9002, 9003): worker 1 must skip it.
    grpc_port = _free_consecutive_ports(3)
    metrics_port = _free_consecutive_ports(1, avoid=range(grpc_port, grpc_port + 3))
    proc = subprocess.Popen([sys.executable, "-m", "epp.cli.main", "serve", "--endpoints", str(endpoints), "--workers",
                             "2", "--host", "127.0.0.1", "--grpc-port", str(grpc_port), "--health-port",
                             str(grpc_port + 1), "--metrics-port", str(metrics_port), "--plaintext", "--log-level",
                             "WARNING"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        await _channel_ready(grpc_port)
        await _channel_ready(grpc_port + 2)
        await _channel_ready(grpc_port + 1)  # worker 0's health service
        async with aiohttp.ClientSession() as session:

            async def metrics_status() -> int | None:
                try:
                    async with session.get(f"http://127.0.0.1:{metrics_port}/metrics") as resp:
                        return resp.status
                except aiohttp.ClientConnectionError:
                    return None

            assert await eventually(metrics_status, "the metrics port answering", interval=0.1) == 200

    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    assert out.count("epp serving:") == 2, out
    assert f"epp workers' ext_proc ports: {grpc_port}, {grpc_port + 2} " in out, out


def _children(pid: int) -> list[int]:
    """The live (not zombie) child processes of ``pid``, from /proc."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            out.append(int(stat.parent.name))
    return out


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


async def test_workers_stop_when_the_parent_is_killed(tmp_path: Path) -> None:
    """A parent killed with SIGKILL (no chance to stop its workers) leaves no worker serving: each gets SIGTERM."""
    endpoints = tmp_path / "endpoints.yaml"
    endpoints.write_text("endpoints:\n  - {name: a, address: 127.0.0.1, port: 9}\n")
    grpc_port = _free_consecutive_ports(2)
    proc = subprocess.Popen([sys.executable, "-m", "epp.cli.main", "serve", "--endpoints", str(endpoints), "--workers",
                             "2", "--host", "127.0.0.1", "--grpc-port", str(grpc_port), "--health-port", "-1",
                             "--metrics-port", "-1", "--plaintext", "--log-level", "WARNING"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        await _channel_ready(grpc_port)
        await _channel_ready(grpc_port + 1)
        workers = _children(proc.pid)  # the two workers (and multiprocessing's resource tracker)
        assert len(workers) >= 2, workers
    finally:
        proc.kill()
        proc.wait(10)
    for _ in range(300):
        if not any(_alive(p) for p in workers):
            break
        await asyncio.sleep(0.05)
    assert not any(_alive(p) for p in workers), [p for p in workers if _alive(p)]


def test_serve_without_endpoint_source_is_a_clear_error() -> None:
    res = subprocess.run([sys.executable, "-m", "epp.cli.main", "serve", "--grpc-port", "0", "--metrics-port", "-1",
                          "--health-port", "-1", "--plaintext"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 2
    assert "no endpoint source" in res.stderr and "Traceback" not in res.stderr


def test_serve_with_bad_config_names_it(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("plugins: [{type: nope-scorer}]\n")
    res = subprocess.run([sys.executable, "-m", "epp.cli.main", "serve", "--config", str(bad), "--endpoints", "x.yaml"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "nope-scorer" in res.stderr and "bad.yaml:1" in res.stderr


@pytest.mark.parametrize("content, expected", [
    ('endpoints: [{name: a, address: 10.0.0.5, port: "eighty"}]\n', "endpoints.0.port"),
    ("endpoints: [{name: a, adress: 10.0.0.5, port: 8000}]\n", "endpoints.0.address"),
    (None, "cannot read endpoints file"),
])
def test_serve_with_bad_endpoints_file_is_a_clear_error(tmp_path: Path, content: str | None, expected: str) -> None:
    path = tmp_path / "eps.yaml"
    if content is not None:
        path.write_text(content)
    res = subprocess.run([sys.executable, "-m", "epp.cli.main", "serve", "--endpoints", str(path), "--grpc-port", "0",
                          "--metrics-port", "-1", "--health-port", "-1", "--plaintext"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2, res.stderr
    assert res.stderr.startswith("error: ") and str(path) in res.stderr and expected in res.stderr
    assert "Traceback" not in res.stderr


def test_serve_workers_with_bad_endpoints_file_all_stop_with_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "eps.yaml"
    path.write_text('endpoints: [{name: a, address: 10.0.0.5, port: "eighty"}]\n')
    res = subprocess.run([sys.executable, "-m", "epp.cli.main", "serve", "--endpoints", str(path), "--workers", "2",
                          "--grpc-port", "0", "--metrics-port", "-1", "--health-port", "-1", "--plaintext"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2, res.stderr
    assert "endpoints.0.port" in res.stderr and "Traceback" not in res.stderr


@pytest.mark.parametrize("option, value", [("--grpc-port", "70000"), ("--http-port", "99999"),
                                           ("--metrics-port", "-5"), ("--health-port", "nine")])
def test_serve_rejects_a_port_out_of_range(option: str, value: str) -> None:
    res = subprocess.run([sys.executable, "-m", "epp.cli.main", "serve", "--endpoints", "x.yaml", option, value],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and f"argument {option}" in res.stderr and "Traceback" not in res.stderr
