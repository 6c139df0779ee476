"""``/v1/responses`` end to end: the official ``openai`` client through the gateway to simulated servers."""

from __future__ import annotations

import pytest

from epp.gateway._pd import PREFILL_KV_PARAMS

from .helpers import ALWAYS_DISAGG, MODEL, PD_CONFIG, random_config, sim, spec_for


async def test_responses_non_streaming(sims, stack):
    servers = await sims(sim(), sim())
    st = await stack(random_config(), [spec_for(s) for s in servers])
    async with st.openai() as client:
        out = await client.responses.create(model=MODEL, instructions="Answer briefly.", input="Hi there!",
                                            max_output_tokens=7)
    assert out.object == "response" and out.model == MODEL and out.output_text
    assert out.usage.output_tokens == 7
    info = st.recorder.infos[-1]
    assert (info.status, info.prompt_tokens, info.completion_tokens, info.streamed) == (
        200, out.usage.input_tokens, 7, False)
    assert st.inflight() == 0


async def test_responses_streaming_relays_every_event_and_reads_usage(sims, stack):
    [server] = await sims(sim())
    st = await stack(random_config(), [spec_for(server)])
    async with st.openai() as client:
        stream = await client.responses.create(model=MODEL, input="Tell me something.", max_output_tokens=9,
                                               stream=True)
        events = [event async for event in stream]
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    final = events[-1].response
    assert len(deltas) == 9 and final.output_text == "".join(deltas)
    info = st.recorder.infos[-1]
    assert (info.status, info.prompt_tokens, info.completion_tokens, info.streamed) == (
        200, final.usage.input_tokens, 9, True)
    assert st.inflight() == 0


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_responses_prefill_decode(sims, stack, taps, stream):
    prefill, decode = await sims(sim(role="prefill"), sim(role="decode"))
    ptap, dtap = await taps(prefill), await taps(decode)
    st = await stack(PD_CONFIG % {"decider": ALWAYS_DISAGG},
                     [spec_for(prefill, "prefill", ptap.port), spec_for(decode, "decode", dtap.port)])
    prompt = "A long shared prompt for the prefix cache. " * 20
    async with st.openai() as client:
        for _ in range(2):  # the second prefill hits the prefiller's prefix cache
            if stream:
                events = [e async for e in await client.responses.create(model=MODEL, input=prompt,
                                                                         max_output_tokens=4, stream=True)]
                out = events[-1].response
            else:
                out = await client.responses.create(model=MODEL, input=prompt, max_output_tokens=4)
    pre, dec = ptap.records[-1], dtap.records[-1]
    assert pre.body["kv_transfer_params"] == PREFILL_KV_PARAMS
    assert (pre.body["stream"], pre.body["max_output_tokens"]) == (False, 1)
    assert dec.body["kv_transfer_params"] == pre.answer["kv_transfer_params"]
    assert (dec.body["max_output_tokens"], bool(dec.body.get("stream"))) == (4, stream)
    prefiller_cached = pre.answer["usage"]["input_tokens_details"]["cached_tokens"]
    assert prefiller_cached > 0
    assert out.usage.output_tokens == 4 and out.usage.input_tokens_details.cached_tokens == prefiller_cached
    assert st.recorder.infos[-1].cached_tokens == prefiller_cached and st.inflight() == 0
