"""``epp demo`` as a user runs it: the console script, free ports, a short workload, a summary, a clean exit."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path


def test_epp_demo_runs_traffic_and_exits_cleanly() -> None:
    script = Path(sys.executable).parent / "epp"
    cmd = [str(script), "demo", "--traffic", "--exit", "--requests", "24", "--concurrency", "6", "--servers", "3",
           "--sim-base-port", "0", "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0",
           "--envoy-port", "0", "--time-scale", "0.2"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert res.returncode == 0, res.stdout + res.stderr
    out = res.stdout
    assert "EPP OpenAI gateway" in out and "curl -s" in out
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
