"""`epp-sim` command line: configs from flags, and a real pool process stopped by Ctrl-C."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import urllib.request

from epp_sim.cli import build_configs, parse_args


def test_single_server_flags() -> None:
    configs, ports = build_configs(parse_args([
        "--port", "9000", "--model", "m", "--num-gpu-blocks", "100", "--role", "decode",
        "--batching", "dynamic", "--time-scale", "0.5", "--lora", "a", "--lora", "b",
        "--time-model", "step_overhead_s=0.01", "--no-prefix-caching", "--v0-metrics",
    ]))
    [cfg] = configs
    assert ports == [9000]
    assert (cfg.model, cfg.num_gpu_blocks) == ("m", 100)
    assert (cfg.role, cfg.batching) == ("decode", "dynamic")
    assert cfg.time_scale == 0.5 and cfg.lora_adapters == ["a", "b"]
    assert cfg.time_model.step_overhead_s == 0.01
    assert not cfg.enable_prefix_caching and cfg.v0_metrics


def test_pool_cycles_roles_and_offsets_bound_kv_endpoints() -> None:
    configs, ports = build_configs(parse_args([
        "pool", "--servers", "3", "--base-port", "8100", "--roles", "prefill,decode",
        "--kv-events", "tcp://*:5557",
    ]))
    assert ports == [8100, 8101, 8102]
    assert [c.role for c in configs] == ["prefill", "decode", "prefill"]
    assert [c.kv_events_endpoint for c in configs] == [
        "tcp://*:5557", "tcp://*:5558", "tcp://*:5559"]


def test_pool_process_serves_and_stops_on_sigint() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "epp_sim.cli", "pool", "--servers", "2", "--base-port", "0",
         "--time-scale", "0.01"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline() for _ in range(2)]
        urls = [line.split()[3] for line in lines]
        assert all(line.startswith("epp-sim listening on http://127.0.0.1:") for line in lines)
        for url in urls:
            req = urllib.request.Request(
                url + "/v1/completions",
                data=json.dumps({"prompt": "hi", "max_tokens": 3}).encode(),
                headers={"Content-Type": "application/json"},
            )
            with urllib.request.urlopen(req, timeout=10) as resp:
                assert json.load(resp)["usage"]["completion_tokens"] == 3
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=20)
        assert proc.returncode == 0 and "epp-sim stopped" in out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
