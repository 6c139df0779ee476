"""``/v1/messages`` (the Anthropic Messages API) end to end: the official ``anthropic`` client through the gateway
to simulated vLLM servers, on both front ends (the ``transport`` fixture)."""

from __future__ import annotations

import asyncio
import logging

import anthropic
import pytest
from prometheus_client import CollectorRegistry

from epp.framework.request import ApiKind
from epp.gateway._pd import PREFILL_KV_PARAMS
from epp.headers import MODEL_REWRITE_HEADER, HeaderTrust
from epp.metrics.families import EppMetrics

from .helpers import ALWAYS_DISAGG, MODEL, PD_CONFIG, dead_spec, random_config, sim, spec_for

HELLO = [{"role": "user", "content": "Hello there, how are you?"}]
SYSTEM = "You are a careful assistant. " * 20


async def test_messages_non_streaming_and_token_metrics(sims, stack):
    servers = await sims(sim(), sim())
    st = await stack(random_config(), [spec_for(s) for s in servers])
    registry = CollectorRegistry()
    st.director.metrics = EppMetrics(registry)
    async with st.anthropic() as client:
        out = await client.messages.create(model=MODEL, max_tokens=7, system=SYSTEM, messages=HELLO)
    assert out.type == "message" and out.model == MODEL and out.content[0].text
    assert out.usage.output_tokens == 7 and out.stop_reason == "max_tokens"
    request, _, info = st.recorder.done[-1]
    assert request.api is ApiKind.MESSAGES and request.max_tokens == 7
    assert request.prompt_text.startswith(SYSTEM + "user")
    assert (info.status, info.prompt_tokens, info.completion_tokens, info.streamed) == (
        200, out.usage.input_tokens, 7, False)
    labels = {"model_name": MODEL, "target_model_name": MODEL}
    assert registry.get_sample_value("inference_objective_input_tokens_sum", labels) == out.usage.input_tokens
    assert registry.get_sample_value("inference_objective_output_tokens_sum", labels) == 7
    assert st.inflight() == 0


async def test_messages_streaming_relays_every_event_and_reads_usage(sims, stack):
    [server] = await sims(sim())
    st = await stack(random_config(), [spec_for(server)])
    async with st.anthropic() as client:
        async with client.messages.stream(model=MODEL, max_tokens=9, messages=HELLO) as stream:
            kinds = [event.type async for event in stream if event.type != "text"]
            final = await stream.get_final_message()
    assert kinds == ["message_start", "content_block_start"] + ["content_block_delta"] * 9 + [
        "content_block_stop", "message_delta", "message_stop"]
    assert final.usage.output_tokens == 9 and final.content[0].text
    info = st.recorder.infos[-1]
    assert (info.status, info.prompt_tokens, info.completion_tokens, info.streamed) == (
        200, final.usage.input_tokens, 9, True)
    assert st.inflight() == 0


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_model_rewrite_goes_upstream_and_the_client_sees_its_own_name(sims, stack, taps, stream):
    [server] = await sims(sim())
    tap = await taps(server)
    st = await stack(random_config(), [spec_for(server, port=tap.port)])
    st.director.header_trust = HeaderTrust([MODEL_REWRITE_HEADER])  # the rewrite comes from a trusted gateway
    async with st.anthropic(default_headers={"x-gateway-model-name-rewrite": MODEL}) as client:
        if stream:
            async with client.messages.stream(model="alias", max_tokens=3, messages=HELLO) as events:
                start = [e async for e in events if e.type == "message_start"][0]
                out = await events.get_final_message()
            assert start.message.model == "alias"
        else:
            out = await client.messages.create(model="alias", max_tokens=3, messages=HELLO)
    assert out.model == "alias" and tap.records[-1].body["model"] == MODEL
    request, _, info = st.recorder.done[-1]
    assert request.target_model == MODEL and info.completion_tokens == 3


async def test_epp_errors_use_anthropics_envelope(sims, stack):
    [server] = await sims(sim())
    st = await stack(random_config(), [spec_for(server)])
    async with st.anthropic() as client:
        with pytest.raises(anthropic.BadRequestError) as bad:
            await client.messages.create(model=MODEL, max_tokens=4, messages=[])
        with pytest.raises(anthropic.NotFoundError) as unknown:  # the model server's own answer, passed on
            await client.messages.create(model="nope", max_tokens=4, messages=HELLO)
    assert bad.value.body == {"type": "error", "error": {
        "type": "invalid_request_error", "message": "messages request needs a non-empty 'messages' array"}}
    assert unknown.value.body["type"] == "error" and unknown.value.body["error"]["type"] == "NotFoundError"
    st.datastore.replace_all([])
    status, body = await st.post("/v1/messages", {"model": MODEL, "max_tokens": 4, "messages": HELLO})
    assert status == 503 and body["type"] == "error" and body["error"]["type"] == "overloaded_error"
    status, body = await st.get("/v1/messages")  # no route for GET: a 404, in the envelope of the path
    assert status == 404 and body == {"type": "error", "error": {"type": "not_found_error",
                                                  "message": "no route for GET /v1/messages"}}


async def test_refused_connection_is_retried_on_another_endpoint(sims, stack, caplog):
    [live] = await sims(sim())
    st = await stack(random_config(2), [dead_spec(), spec_for(live)])
    with caplog.at_level(logging.INFO, logger="epp.gateway"):
        async with st.anthropic() as client:
            outs = await asyncio.gather(*(client.messages.create(model=MODEL, max_tokens=2, messages=HELLO)
                                          for _ in range(12)))
    assert all(out.usage.output_tokens == 2 for out in outs)
    assert [ep.name for _, ep, _ in st.recorder.done] == [spec_for(live).name] * 12
    assert any(r.message.startswith("retrying request") for r in caplog.records)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_messages_prefill_decode(sims, stack, taps, stream):
    """vLLM's Anthropic endpoint takes ``kv_transfer_params`` and returns the prefiller's: the gateway runs P/D
    for ``/v1/messages`` as for chat, capping ``max_tokens`` (the API's only limit) at 1 for the prefill."""
    prefill, decode = await sims(sim(role="prefill"), sim(role="decode"))
    ptap, dtap = await taps(prefill), await taps(decode)
    st = await stack(PD_CONFIG % {"decider": ALWAYS_DISAGG},
                     [spec_for(prefill, "prefill", ptap.port), spec_for(decode, "decode", dtap.port)])
    messages = [{"role": "user", "content": "A long shared prompt for the prefix cache. " * 20}]
    async with st.anthropic() as client:
        if stream:
            async with client.messages.stream(model=MODEL, max_tokens=4, messages=messages) as events:
                out = await events.get_final_message()
        else:
            out = await client.messages.create(model=MODEL, max_tokens=4, messages=messages)
    pre, dec = ptap.records[-1], dtap.records[-1]
    assert pre.path == dec.path == "/v1/messages"
    assert pre.body["kv_transfer_params"] == PREFILL_KV_PARAMS
    assert (pre.body["stream"], pre.body["max_tokens"], "max_completion_tokens" in pre.body) == (False, 1, False)
    assert dec.body["kv_transfer_params"] == pre.answer["kv_transfer_params"]
    assert (dec.body["max_tokens"], bool(dec.body.get("stream"))) == (4, stream)
    assert out.usage.output_tokens == 4 and out.usage.cache_read_input_tokens is None
    assert decode.engine.stats.iteration_tokens.sum == 1 + 3  # the decoder computed one prompt token
    assert st.recorder.infos[-1].completion_tokens == 4 and st.inflight() == 0
