"""``epp demo`` as a user runs it: the console script, free ports, a short workload, a summary, a clean exit."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import aiohttp

from epp.envoy.process import _active_requests


def test_epp_demo_runs_traffic_and_exits_cleanly() -> None:
    script = Path(sys.executable).parent / "epp"
    cmd = [str(script), "demo", "--traffic", "--exit", "--requests", "24", "--concurrency", "6", "--servers", "3",
           "--sim-base-port", "0", "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0",
           "--envoy-port", "0", "--time-scale", "0.2"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert res.returncode == 0, res.stdout + res.stderr
    out = res.stdout
    assert "EPP OpenAI gateway" in out and "curl -s" in out and "/v1/messages" in out
    interpreter = re.search(r'^\s+(\S+) -c "import openai', out, flags=re.M)  # the one with openai installed
    assert interpreter and "/" in interpreter.group(1) and Path(interpreter.group(1)).exists(), out
    assert "Ctrl-C" not in out  # --exit: it does not wait for one
    rows = re.findall(r"^sim-both-\d+\s+both\s+(\d+)\s", out, flags=re.M)
    assert len(rows) == 3 and sum(map(int, rows)) == 24
    assert re.search(r"requests ok 24, errors 0; TTFT p50 \d+ ms, p99 \d+ ms", out)
    assert "prompt tokens served from prefix cache" in out


def test_epp_demo_pd_roles() -> None:
    script = Path(sys.executable).parent / "epp"
    cmd = [str(script), "demo", "--pd", "--traffic", "--exit", "--requests", "12", "--concurrency", "4",
           "--servers", "4", "--no-envoy", "--sim-base-port", "0", "--http-port", "0", "--grpc-port", "0",
           "--metrics-port", "0", "--time-scale", "0.2"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert res.returncode == 0, res.stdout + res.stderr
    assert re.search(r"^sim-prefill-0\s+prefill\s+\d+", res.stdout, flags=re.M)
    decode = re.findall(r"^sim-decode-\d+\s+decode\s+(\d+)\s", res.stdout, flags=re.M)
    assert sum(map(int, decode)) == 12
    assert "requests ok 12, errors 0" in res.stdout
    assert "Envoy                  : off (--no-envoy)" in res.stdout


def test_epp_demo_with_a_bad_config_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("plugins:\n- type: magic-scorer\n")
    script = Path(sys.executable).parent / "epp"
    res = subprocess.run([str(script), "demo", "--config", str(bad), "--exit", "--no-envoy", "--sim-base-port", "0",
                          "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2
    assert "magic-scorer" in res.stderr and "bad.yaml:2" in res.stderr and "Traceback" not in res.stderr


async def test_epp_demo_ctrl_c_lets_streams_through_envoy_finish() -> None:
    """Ctrl-C (to the process group, as a terminal sends it) drains Envoy as the gateway drains: a stream in
    flight through Envoy ends with [DONE]."""
    script = Path(sys.executable).parent / "epp"
    proc = await asyncio.create_subprocess_exec(
        str(script), "demo", "--servers", "2", "--sim-base-port", "0", "--http-port", "0", "--grpc-port", "0",
        "--metrics-port", "0", "--envoy-port", "0", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"}, start_new_session=True)
    assert proc.stdout is not None
    try:
        banner = ""
        while "Ctrl-C stops everything." not in banner:
            line = await asyncio.wait_for(proc.stdout.readline(), 60)
            assert line, banner
            banner += line.decode()
        match = re.search(r"Envoy \(-> EPP ext_proc\): (http://\S+)/v1", banner)
        assert match, banner
        body = {"model": "demo-llama-8b", "prompt": "Hi", "max_tokens": 300, "stream": True}
        async with aiohttp.ClientSession() as session:
            async with session.post(match.group(1) + "/v1/completions", json=body) as resp:
                assert resp.status == 200
                received = await resp.content.readany()
                os.killpg(proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C: to the whole process group
                received += await resp.content.read()
        assert received.rstrip().endswith(b"data: [DONE]"), received[-200:]
        assert await asyncio.wait_for(proc.wait(), 60) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


def test_active_requests_counts_listeners_but_not_the_admin() -> None:
    stats = ("http.admin.downstream_rq_active: 1\nhttp.ingress_http.downstream_rq_active: 2\n"
             "http.other.downstream_rq_active: 1\nlistener.x.downstream_cx_active: 5\n")
    assert _active_requests(stats) == 3
    assert _active_requests("http.admin.downstream_rq_active: 1\n") == 0
