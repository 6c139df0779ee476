"""Prefill/decode orchestration with simulated prefill and decode servers (NIXL v2 protocol)."""

from __future__ import annotations

import pytest

from epp.gateway._pd import PREFILL_KV_PARAMS

from ..conftest import eventually
from .helpers import ALWAYS_DISAGG, MODEL, NEVER_DISAGG, PD_CONFIG, chat, sim, spec_for


async def _pd(sims, stack, taps, decider: str = ALWAYS_DISAGG, prefill_cfg: dict | None = None, **kw):
    prefill, decode = await sims(sim(role="prefill", **(prefill_cfg or {})), sim(role="decode"))
    ptap, dtap = await taps(prefill), await taps(decode)
    st = await stack(PD_CONFIG % {"decider": decider},
                     [spec_for(prefill, "prefill", ptap.port), spec_for(decode, "decode", dtap.port)], **kw)
    return st, prefill, decode, ptap, dtap


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_decode_receives_the_prefillers_kv_transfer_params(sims, stack, taps, stream):
    st, prefill, decode, ptap, dtap = await _pd(sims, stack, taps)
    body = chat(max_tokens=6, stream=stream, stream_options={"include_usage": True} if stream else None)
    async with st.openai() as client:
        if stream:
            chunks = [c async for c in await client.chat.completions.create(**body)]
            usage = chunks[-1].usage
        else:
            usage = (await client.chat.completions.create(**body)).usage

    [pre] = ptap.records
    assert pre.body["kv_transfer_params"] == PREFILL_KV_PARAMS
    assert (pre.body["stream"], pre.body["max_tokens"], pre.body["max_completion_tokens"]) == (False, 1, 1)
    assert "stream_options" not in pre.body
    [dec] = dtap.records
    assert dec.body["kv_transfer_params"] == pre.answer["kv_transfer_params"]
    assert dec.body["kv_transfer_params"]["remote_engine_id"] == prefill.engine_id
    assert (dec.body["max_tokens"], dec.body.get("stream")) == (6, stream)
    assert dec.headers["x-request-id"] == pre.headers["x-request-id"]
    assert "x-prefiller-host-port" not in dec.headers
    # The decoder pulled the blocks (the prefiller frees what it held for it), and generated the answer.
    await eventually(lambda: not prefill.engine.held, what="prefiller's KV released")
    assert usage.completion_tokens == 6
    # cached_tokens shown to the client are the prefiller's.
    assert usage.prompt_tokens_details.cached_tokens == (
        pre.answer["usage"].get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    assert st.recorder.infos[-1].status == 200 and st.inflight() == 0


async def test_cached_tokens_come_from_the_prefiller(sims, stack, taps):
    st, prefill, decode, ptap, dtap = await _pd(sims, stack, taps)
    long_prompt = "The same long system prompt, repeated for caching. " * 20
    async with st.openai() as client:
        for _ in range(2):
            resp = await client.chat.completions.create(**chat(long_prompt, max_tokens=3))
    prefiller_cached = ptap.records[-1].answer["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert prefiller_cached > 0  # the second prefill hit the prefiller's prefix cache
    assert resp.usage.prompt_tokens_details.cached_tokens == prefiller_cached
    assert st.recorder.infos[-1].cached_tokens == prefiller_cached


async def test_decode_only_when_the_decider_says_so(sims, stack, taps):
    st, prefill, decode, ptap, dtap = await _pd(sims, stack, taps, decider=NEVER_DISAGG)
    async with st.openai() as client:
        resp = await client.chat.completions.create(**chat(max_tokens=4))
    assert resp.usage.completion_tokens == 4
    assert ptap.records == []
    [dec] = dtap.records
    assert "kv_transfer_params" not in dec.body


async def test_prefill_failure_falls_back_to_decode_only(sims, stack, taps):
    st, prefill, decode, ptap, dtap = await _pd(sims, stack, taps, prefill_cfg={"failure_rate": 1.0})
    async with st.openai() as client:
        resp = await client.chat.completions.create(**chat(max_tokens=4))
    assert resp.usage.completion_tokens == 4
    assert [r.status for r in ptap.records] == [503]
    [dec] = dtap.records
    assert "kv_transfer_params" not in dec.body and dec.body["max_tokens"] == 4


async def test_unreachable_prefiller_falls_back_to_decode_only(sims, stack, taps):
    st, prefill, decode, ptap, dtap = await _pd(sims, stack, taps)
    await ptap.stop()
    status, body = await st.post("/v1/chat/completions", chat(max_tokens=3))
    assert status == 200 and body["usage"]["completion_tokens"] == 3
    assert "kv_transfer_params" not in dtap.records[0].body


async def test_prefill_client_error_goes_to_the_client(sims, stack, taps):
    st, prefill, decode, ptap, dtap = await _pd(sims, stack, taps,
                                                prefill_cfg={"failure_rate": 1.0, "failure_status": 429})
    status, body = await st.post("/v1/chat/completions", chat(max_tokens=3))
    assert status == 429 and "injected failure" in body["error"]["message"]
    assert dtap.records == []
    assert st.recorder.infos[-1].status == 429 and st.inflight() == 0


async def test_sidecar_mode_forwards_the_prefiller_header(sims, stack, taps):
    st, prefill, decode, ptap, dtap = await _pd(sims, stack, taps, pd_orchestration=False)
    status, _ = await st.post("/v1/chat/completions", chat(max_tokens=2))
    assert status == 200
    assert ptap.records == []
    assert dtap.records[0].headers["x-prefiller-host-port"] == f"127.0.0.1:{ptap.port}"
    assert MODEL == dtap.records[0].body["model"]
