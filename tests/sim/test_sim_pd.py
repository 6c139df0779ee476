"""Prefill/decode disaggregation end to end, as the llm-d sidecar (NIXL v2) drives it."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

import epp_sim.backend as sim_backend
from epp_sim import SimConfig, SimPool, SimServer, TimeModel

PREFILL_PARAMS = {
    "do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
    "remote_block_ids": None, "remote_host": None, "remote_port": None,
}
FAST = 0.002


async def _post(session: aiohttp.ClientSession, server: SimServer, body: dict[str, Any],
                timeout: float | None = None) -> Any:
    async with session.post(server.url + "/v1/completions", json=body,
                            timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
        assert resp.status == 200, await resp.text()
        return await resp.json()


async def _prefill_then_decode(
    prefill: SimServer, decode: SimServer, prompt: str, tweak: dict[str, Any] | None = None,
    timeout: float | None = None,
) -> tuple[Any, Any]:
    async with aiohttp.ClientSession() as session:
        p = await _post(session, prefill, {"prompt": prompt, "max_tokens": 1, "stream": False,
                                           "kv_transfer_params": PREFILL_PARAMS})
        params = dict(p["kv_transfer_params"], **(tweak or {}))
        d = await _post(session, decode, {"prompt": prompt, "max_tokens": 8,
                                          "kv_transfer_params": params}, timeout)
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
        del sim_backend._REGISTRY[prefill.engine_id]  # as if it ran in another process
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


def _pd_configs(**decode_fields: Any) -> list[SimConfig]:
    """A prefiller that holds its blocks for good unless told to free them (its 480 s default pass in a wall
    second at this scale, which would hide a missing release), and a decoder."""
    return [SimConfig(role="prefill", time_scale=FAST, kv_hold_timeout_s=1e9),
            SimConfig(role="decode", time_scale=FAST, **decode_fields)]


async def _released(prefill: SimServer) -> bool:
    """Whether the prefiller has freed every held block (a release over HTTP lands a little later)."""
    for _ in range(200):
        if not prefill.engine.held:
            return True
        await asyncio.sleep(0.01)
    return False


async def test_full_local_prefix_hit_still_frees_the_prefillers_blocks() -> None:
    # vLLM's NixlConnector notifies the prefiller even when the decoder needs none of its blocks
    # ("a full prefix cache hit on the D worker ... send_notif ... to free the memory on the P").
    async with SimPool(_pd_configs()) as pool:
        prefill, decode = pool.servers
        prompt = "z" * 68  # 17 tokens: the decoder can hit the 16 before the last one
        async with aiohttp.ClientSession() as session:
            await _post(session, decode, {"prompt": prompt, "max_tokens": 1})
        _, d = await _prefill_then_decode(prefill, decode, prompt)
        assert d["usage"]["prompt_tokens_details"]["cached_tokens"] == 16  # all local: nothing to pull
        assert await _released(prefill)
        assert prefill.engine.bm.num_free == prefill.cfg.num_gpu_blocks
        assert decode.pull_sources == {}


async def test_one_token_prompt_frees_the_prefillers_blocks() -> None:
    async with SimPool(_pd_configs()) as pool:
        prefill, decode = pool.servers
        p, d = await _prefill_then_decode(prefill, decode, "abcd")  # one token
        assert p["kv_transfer_params"]["remote_block_ids"] and d["usage"]["prompt_tokens"] == 1
        assert await _released(prefill)
        assert decode.pull_sources == {}


async def test_decode_aborted_before_its_pull_frees_the_prefillers_blocks() -> None:
    # vLLM's request_finished: a request that still has do_remote_prefill when it ends notifies the
    # prefiller with no blocks, "to avoid stranding the prefill blocks in the prefill instance".
    slow_pull = TimeModel(kv_transfer_latency_s=1000.0)  # about 2 wall seconds at this scale
    async with SimPool(_pd_configs(time_model=slow_pull)) as pool:
        prefill, decode = pool.servers
        with pytest.raises(asyncio.TimeoutError):
            await _prefill_then_decode(prefill, decode, "w" * 400, timeout=0.3)
        assert await _aborted(decode)
        assert await _released(prefill)
        assert decode.pull_sources == {}


async def _aborted(server: SimServer) -> bool:
    for _ in range(200):
        if server.engine.stats.finished["abort"]:
            return True
        await asyncio.sleep(0.01)
    return False
