"""Prefill/decode disaggregation end to end, as the llm-d sidecar (NIXL v2) drives it."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

import bench.sim.server as sim_server
from bench.sim import SimConfig, SimPool, SimServer

PREFILL_PARAMS = {
    "do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
    "remote_block_ids": None, "remote_host": None, "remote_port": None,
}
FAST = 0.002


async def _post(session: aiohttp.ClientSession, server: SimServer, body: dict[str, Any]) -> Any:
    async with session.post(server.url + "/v1/completions", json=body) as resp:
        assert resp.status == 200, await resp.text()
        return await resp.json()


async def _prefill_then_decode(
    prefill: SimServer, decode: SimServer, prompt: str, tweak: dict[str, Any] | None = None
) -> tuple[Any, Any]:
    async with aiohttp.ClientSession() as session:
        p = await _post(session, prefill, {"prompt": prompt, "max_tokens": 1, "stream": False,
                                           "kv_transfer_params": PREFILL_PARAMS})
        params = dict(p["kv_transfer_params"], **(tweak or {}))
        d = await _post(session, decode, {"prompt": prompt, "max_tokens": 8,
                                          "kv_transfer_params": params})
    return p, d


async def test_prefill_returns_transfer_params_and_decoder_skips_prefill() -> None:
    configs = [SimConfig(role=role, time_scale=FAST) for role in ("prefill", "decode")]
    async with SimPool(configs) as pool:
        prefill, decode = pool.servers
        prompt = "doc " * 180  # 180 tokens of the built-in tokenizer
        p, d = await _prefill_then_decode(prefill, decode, prompt)

        kvp = p["kv_transfer_params"]
        assert p["choices"][0]["finish_reason"] == "length"
        assert p["usage"]["completion_tokens"] == 1
        assert kvp["do_remote_prefill"] is True and kvp["do_remote_decode"] is False
        assert kvp["remote_engine_id"] == prefill.engine_id
        assert (kvp["remote_host"], kvp["remote_port"]) == ("127.0.0.1", prefill.port)
        assert len(kvp["remote_block_ids"]) == 12  # ceil(180 / 16)

        assert d["usage"]["completion_tokens"] == 8
        assert d["usage"]["prompt_tokens_details"]["cached_tokens"] == 179
        # The decoder computed one prompt token; the prefiller all 180.
        assert decode.engine.stats.iteration_tokens.sum == 1 + 7
        assert prefill.engine.stats.iteration_tokens.sum == 180
        # Pulling the KV told the prefiller to free its held blocks.
        assert not prefill.engine.held
        assert prefill.engine.bm.num_free == prefill.cfg.num_gpu_blocks


async def test_prefiller_release_over_http_when_not_in_process() -> None:
    configs = [SimConfig(role=role, time_scale=FAST) for role in ("prefill", "decode")]
    async with SimPool(configs) as pool:
        prefill, decode = pool.servers
        del sim_server._REGISTRY[prefill.engine_id]  # as if it ran in another process
        _, d = await _prefill_then_decode(prefill, decode, "x" * 400)
        # The decoder reached it over HTTP (remote_host:remote_port) and pulled the KV.
        assert d["usage"]["prompt_tokens_details"]["cached_tokens"] == 99
        assert decode.engine.stats.kv_load_failures == 0
        for _ in range(200):
            if not prefill.engine.held:
                break
            await asyncio.sleep(0.01)
        assert not prefill.engine.held


async def test_prefill_blocks_are_held_until_timeout() -> None:
    configs = [SimConfig(role="prefill", time_scale=FAST, kv_hold_timeout_s=30.0)]
    async with SimPool(configs) as pool:
        [prefill] = pool.servers
        async with aiohttp.ClientSession() as session:
            await _post(session, prefill, {"prompt": "y" * 400, "max_tokens": 1,
                                           "kv_transfer_params": PREFILL_PARAMS})
        assert prefill.engine.held
        for _ in range(500):  # 30 simulated seconds at this scale are ~60 ms
            if not prefill.engine.held:
                break
            await asyncio.sleep(0.01)
        assert not prefill.engine.held
        assert prefill.engine.bm.num_free == prefill.cfg.num_gpu_blocks
