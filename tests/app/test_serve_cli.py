"""``epp serve`` as a process: --workers N binds consecutive ext_proc ports; SIGTERM stops every worker cleanly."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from pathlib import Path

import aiohttp
import grpc
import pytest

from epp.runtime.ports import free_ports

from ..conftest import eventually


async def _channel_ready(port: int, proc: subprocess.Popen[str], timeout: float = 20.0) -> None:
    """The gRPC port answers within ``timeout``; if ``proc`` exits first, fail at once with what it printed."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        ready = asyncio.ensure_future(channel.channel_ready())
        try:
            while not ready.done():
                if proc.poll() is not None:
                    out = proc.stdout.read() if proc.stdout else "(output not kept)"
                    pytest.fail(f"epp serve exited with {proc.returncode} before port {port} answered:\n{out}")
                if loop.time() > deadline:
                    pytest.fail(f"port {port} did not answer within {timeout} s")
                await asyncio.wait({ready}, timeout=0.1)
        finally:
            ready.cancel()


async def test_serve_with_two_workers(tmp_path: Path) -> None:
    endpoints = tmp_path / "endpoints.yaml"
    endpoints.write_text("endpoints:\n  - {name: a, address: 127.0.0.1, port: 9}\n")
    # The health port right after the ext_proc port, as with the defaults (9002, 9003): worker 1 must skip it.
    grpc_port = free_ports(3)
    metrics_port = free_ports(1, avoid=range(grpc_port, grpc_port + 3))
    proc = subprocess.Popen([sys.executable, "-m", "epp.cli.main", "serve", "--endpoints", str(endpoints), "--workers",
                             "2", "--host", "127.0.0.1", "--grpc-port", str(grpc_port), "--health-port",
                             str(grpc_port + 1), "--metrics-port", str(metrics_port), "--plaintext", "--log-level",
                             "WARNING"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        await _channel_ready(grpc_port, proc)
        await _channel_ready(grpc_port + 2, proc)
        await _channel_ready(grpc_port + 1, proc)  # worker 0's health service
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
    grpc_port = free_ports(2)
    proc = subprocess.Popen([sys.executable, "-m", "epp.cli.main", "serve", "--endpoints", str(endpoints), "--workers",
                             "2", "--host", "127.0.0.1", "--grpc-port", str(grpc_port), "--health-port", "-1",
                             "--metrics-port", "-1", "--plaintext", "--log-level", "WARNING"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True)
    try:
        await _channel_ready(grpc_port, proc)
        await _channel_ready(grpc_port + 1, proc)
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
