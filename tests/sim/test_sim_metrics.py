"""`/metrics` parses with prometheus_client and matches vLLM's names and label sets."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from epp_sim import SimServer

StartServer = Callable[..., Awaitable[SimServer]]
V0_SAMPLE = Path(__file__).with_name("vllm-metrics-v0-sample.txt")
# Families only the V0 engine exposes (swap space, CPU cache, hit-rate gauges).
V0_ONLY = {
    "vllm:num_requests_swapped",
    "vllm:cpu_cache_usage_perc",
    "vllm:cpu_prefix_cache_hit_rate",
    "vllm:gpu_prefix_cache_hit_rate",
}
REQUIRED = {
    "vllm:num_requests_running": "gauge",
    "vllm:num_requests_waiting": "gauge",
    "vllm:kv_cache_usage_perc": "gauge",
    "vllm:cache_config_info": "gauge",
    "vllm:num_preemptions": "counter",
    "vllm:prefix_cache_queries": "counter",
    "vllm:prefix_cache_hits": "counter",
    "vllm:prompt_tokens": "counter",
    "vllm:generation_tokens": "counter",
    "vllm:request_success": "counter",
    "vllm:time_to_first_token_seconds": "histogram",
    "vllm:inter_token_latency_seconds": "histogram",
    "vllm:e2e_request_latency_seconds": "histogram",
    "vllm:request_queue_time_seconds": "histogram",
}


async def _scrape(server: SimServer) -> dict[str, tuple[str, list[Sample]]]:
    async with aiohttp.ClientSession() as session:
        async with session.get(server.url + "/metrics") as resp:
            assert resp.status == 200
            assert resp.headers["Content-Type"].startswith("text/plain")
            text = await resp.text()
    return {f.name: (f.type, f.samples) for f in text_string_to_metric_families(text)}


def _value(samples: list[Sample], name: str, **labels: str) -> float:
    [v] = [s.value for s in samples if s.name == name and labels.items() <= s.labels.items()]
    return v


async def _complete(server: SimServer, prompt: str, max_tokens: int) -> None:
    async with aiohttp.ClientSession() as session:
        body = {"prompt": prompt, "max_tokens": max_tokens}
        async with session.post(server.url + "/v1/completions", json=body) as resp:
            assert resp.status == 200


async def test_exposition_has_vllm_v1_families_and_labels(sim_server: SimServer) -> None:
    families = await _scrape(sim_server)
    for name, kind in REQUIRED.items():
        assert families[name][0] == kind, name
    for name, (_, samples) in families.items():
        if name in ("vllm:lora_requests_info",):
            continue
        for s in samples:
            assert s.labels["engine"] == "0", name
            if name != "vllm:cache_config_info":
                assert s.labels["model_name"] == "sim-model", name
    _, info = families["vllm:cache_config_info"]
    assert info[0].labels["block_size"] == "16" and info[0].labels["num_gpu_blocks"] == "2048"
    assert "vllm:lora_requests_info" not in families  # only with LoRA enabled, as in vLLM V1
    _, success = families["vllm:request_success"]
    assert {s.labels["finished_reason"] for s in success if s.name.endswith("_total")} >= {
        "stop", "length", "abort"}
    assert "vllm:gpu_cache_usage_perc" not in families


async def test_counters_and_histograms_follow_requests(sim_server: SimServer) -> None:
    await _complete(sim_server, "same prompt " * 20, 5)
    await _complete(sim_server, "same prompt " * 20, 5)
    families = await _scrape(sim_server)
    assert _value(families["vllm:generation_tokens"][1], "vllm:generation_tokens_total") == 10
    assert _value(families["vllm:prompt_tokens"][1], "vllm:prompt_tokens_total") == 120
    assert _value(families["vllm:prefix_cache_hits"][1], "vllm:prefix_cache_hits_total") == 48
    assert _value(families["vllm:prefix_cache_queries"][1],
                  "vllm:prefix_cache_queries_total") == 120
    assert _value(families["vllm:request_success"][1], "vllm:request_success_total",
                  finished_reason="length") == 2
    ttft = families["vllm:time_to_first_token_seconds"][1]
    assert _value(ttft, "vllm:time_to_first_token_seconds_count") == 2
    assert _value(ttft, "vllm:time_to_first_token_seconds_bucket", le="+Inf") == 2
    itl = families["vllm:inter_token_latency_seconds"][1]
    assert _value(itl, "vllm:inter_token_latency_seconds_count") == 8
    assert _value(families["vllm:num_requests_running"][1], "vllm:num_requests_running") == 0


async def test_families_agree_with_a_real_v0_capture(start_server: StartServer) -> None:
    server = await start_server(v0_metrics=True)
    ours = await _scrape(server)
    text = V0_SAMPLE.read_text()
    theirs = {f.name: (f.type, f.samples) for f in text_string_to_metric_families(text)}
    shared = set(theirs) - V0_ONLY
    assert shared == {
        "vllm:cache_config_info", "vllm:num_requests_running", "vllm:num_requests_waiting",
        "vllm:gpu_cache_usage_perc", "vllm:lora_requests_info", "vllm:num_preemptions",
        "vllm:prompt_tokens", "vllm:generation_tokens", "vllm:request_success",
        "vllm:iteration_tokens_total",
    }
    for name in shared:
        kind, samples = theirs[name]
        assert ours[name][0] == kind, name
        their_labels = {k for s in samples for k in s.labels}
        our_labels = {k for s in ours[name][1] for k in s.labels}
        # V1 adds the `engine` label; every V0 label is still there.
        assert their_labels <= our_labels, (name, their_labels - our_labels)
        assert our_labels - their_labels <= {"engine"} or name == "vllm:cache_config_info"


async def test_lora_info_tracks_running_adapters(start_server: StartServer) -> None:
    server = await start_server(lora_adapters=["a"], time_scale=0.05)
    async with aiohttp.ClientSession() as session:
        body = {"model": "a", "prompt": "x", "max_tokens": 2000, "stream": True}
        async with session.post(server.url + "/v1/completions", json=body) as resp:
            await resp.content.readline()  # the request is running now
            _, samples = (await _scrape(server))["vllm:lora_requests_info"]
    newest = max(samples, key=lambda s: s.value)
    assert newest.labels == {"max_lora": "4", "running_lora_adapters": "a",
                             "waiting_lora_adapters": ""}
    assert newest.value > 1.6e9  # a Unix timestamp, as vLLM sets it
