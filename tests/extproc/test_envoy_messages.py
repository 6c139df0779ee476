"""``/v1/messages`` (the Anthropic Messages API) through a real Envoy and EPP's ext_proc to simulated vLLM servers,
with the official ``anthropic`` client: answers, streams, token metrics, model rewrite and error envelopes."""

from __future__ import annotations

import anthropic
import orjson
import pytest
from prometheus_client import CollectorRegistry

from epp.headers import MODEL_REWRITE_HEADER, HeaderTrust
from epp.metrics.families import EppMetrics

from ..conftest import eventually
from .helpers import make_director
from .test_envoy import MODES, sim_specs

pytestmark = pytest.mark.envoy

HELLO = [{"role": "user", "content": "Hello there, how are you?"}]


def _client(url: str, **kw: object) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=url, api_key="test-key", max_retries=0, **kw)  # type: ignore[arg-type]


@MODES
async def test_messages_answers_and_streams_with_token_metrics(stack, sims, mode: str) -> None:
    servers = await sims(2)
    registry = CollectorRegistry()
    director = make_director(sim_specs(servers), metrics=EppMetrics(registry))
    st = await stack(director, mode=mode)
    async with _client(st.url) as client:
        out = await client.messages.create(model="m", max_tokens=6, system="Be brief.", messages=HELLO)
        async with client.messages.stream(model="m", max_tokens=9, messages=HELLO) as stream:
            kinds = [event.type async for event in stream if event.type != "text"]
            final = await stream.get_final_message()
    assert out.model == "m" and out.content[0].text and out.usage.output_tokens == 6
    assert kinds[:2] == ["message_start", "content_block_start"] and kinds[-1] == "message_stop"
    assert final.usage.output_tokens == 9 and final.content[0].text
    labels = {"model_name": "m", "target_model_name": "m"}
    sample = registry.get_sample_value
    await eventually(lambda: sample("inference_objective_output_tokens_count", labels) == 2)
    assert sample("inference_objective_output_tokens_sum", labels) == 6 + 9
    assert sample("inference_objective_input_tokens_sum", labels) == out.usage.input_tokens + final.usage.input_tokens
    assert sample("inference_objective_running_requests", {"model_name": "m"}) == 0
    assert all(ep.inflight_requests == 0 for ep in director.datastore.endpoints())


async def test_messages_model_rewrite_is_invisible_to_the_client(stack, sims) -> None:
    servers = await sims(1)
    st = await stack(make_director(sim_specs(servers), header_trust=HeaderTrust([MODEL_REWRITE_HEADER])))
    async with _client(st.url, default_headers={"x-gateway-model-name-rewrite": "m"}) as client:
        out = await client.messages.create(model="alias", max_tokens=3, messages=HELLO)
        async with client.messages.stream(model="alias", max_tokens=3, messages=HELLO) as stream:
            start = [event async for event in stream if event.type == "message_start"][0]
            final = await stream.get_final_message()
    assert out.model == "alias" and start.message.model == "alias" and final.model == "alias"
    assert out.usage.output_tokens == final.usage.output_tokens == 3  # the sim serves only "m": it was rewritten


async def test_messages_errors_use_anthropics_envelope(stack, sims) -> None:
    servers = await sims(1)
    director = make_director(sim_specs(servers))
    st = await stack(director)
    async with _client(st.url) as client:
        with pytest.raises(anthropic.BadRequestError) as bad:
            await client.messages.create(model="m", max_tokens=4, messages=[])
    assert bad.value.status_code == 400
    assert bad.value.body == {"type": "error", "error": {
        "type": "invalid_request_error", "message": "messages request needs a non-empty 'messages' array"}}
    director.datastore.replace_all([])
    status, _, body = await st.post("/v1/messages", {"model": "m", "max_tokens": 4, "messages": HELLO})
    assert status == 503 and orjson.loads(body) == {"type": "error", "error": {
        "type": "overloaded_error", "message": orjson.loads(body)["error"]["message"]}}
