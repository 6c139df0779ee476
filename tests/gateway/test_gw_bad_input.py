"""Bad client input gets an OpenAI-format error with the shared status table, and harms no other request."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from ..conftest import eventually
from .helpers import MODEL, chat, random_config, sim, spec_for


@pytest.fixture
async def st(sims, stack):
    [server] = await sims(sim())
    return await stack(random_config(), [spec_for(server)], body_limit=4096)


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/v1/chat/completions", b"{not json", None),
    ("/v1/chat/completions", b"[1, 2]", None),
    ("/v1/chat/completions", b"", None),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}]}', "model"),
    ("/v1/chat/completions", b'{"model": 7, "messages": []}', "model"),
    ("/v1/chat/completions", b'{"model": "m"}', "messages"),
    ("/v1/completions", b'{"model": "m"}', "prompt"),
    ("/v1/embeddings", b'{"model": "m"}', "input"),
    ("/v1/completions", b'{"model": "m", "prompt": "x", "max_tokens": -1}', "max_tokens"),
], ids=["not-json", "not-object", "empty", "no-model", "model-not-string", "chat-no-messages",
        "completions-no-prompt", "embeddings-no-input", "negative-max-tokens"])
async def test_bad_body_is_400_in_openai_format(st, path, body, param):
    status, err = await st.post(path, body, headers={"Content-Type": "application/json"})
    assert status == 400
    assert err["error"]["type"] == "invalid_request_error" and err["error"]["code"] == "BadRequest"
    assert err["error"]["param"] == param and err["error"]["message"]
    assert st.recorder.done == [] and st.inflight() == 0


async def test_body_over_the_limit_is_413(st):
    status, err = await st.post("/v1/chat/completions", chat("x" * 5000))
    assert status == 413 and err["error"]["code"] == "body_too_large"


async def test_chunked_body_over_the_limit_is_413(st):
    async def chunks():
        for _ in range(10):
            yield b"x" * 1000

    async with st.session.post(st.url + "/v1/chat/completions", data=chunks()) as resp:
        assert resp.status == 413
        assert (await resp.json())["error"]["code"] == "body_too_large"


async def test_unknown_route_is_404_in_openai_format(st):
    status, err = await st.post("/v1/nope", chat())
    assert status == 404 and err["error"]["type"] == "not_found_error"


async def test_a_good_request_is_unaffected_by_bad_ones(st):
    async with st.openai() as client:
        stream = await client.chat.completions.create(**chat(max_tokens=30, stream=True))
        first = await stream.__anext__()
        bad = await asyncio.gather(*(st.post("/v1/chat/completions", body) for body in
                                     (b"{", b'{"model": 1}', chat("y" * 9000))))
        rest = [chunk async for chunk in stream]
    assert [status for status, _ in bad] == [400, 400, 413]
    assert first.model == MODEL and rest[-1].choices[0].finish_reason == "length"
    assert [info.status for info in st.recorder.infos] == [200]


async def test_refused_requests_are_counted_by_error_code(st):
    """A body that does not parse and a body over the limit (declared, or found while reading a chunked body) are
    counted in inference_objective_request_error_total, with empty model labels: the body was never parsed."""
    from prometheus_client import CollectorRegistry

    from epp.metrics.families import EppMetrics

    metrics = st.director.metrics = EppMetrics(CollectorRegistry())

    async def chunks():
        for _ in range(10):
            yield b"x" * 1000

    assert (await st.post("/v1/chat/completions", b"{not json"))[0] == 400
    assert (await st.post("/v1/chat/completions", chat("x" * 5000)))[0] == 413
    async with st.session.post(st.url + "/v1/chat/completions", data=chunks()) as resp:
        assert resp.status == 413

    def count(code: str) -> float | None:
        return metrics.registry.get_sample_value("inference_objective_request_error_total",
                                                 {"model_name": "", "target_model_name": "", "error_code": code})

    assert count("BadRequest") == 1 and count("PayloadTooLarge") == 2


async def test_gateway_records_sizes_and_chunk_gaps_as_ext_proc_does(st):
    """Request and response body sizes and the gap between streamed chunks are recorded on the gateway too (the
    Director's lifecycle calls, shared with ext_proc)."""
    from prometheus_client import CollectorRegistry

    from epp.metrics.families import EppMetrics

    metrics = st.director.metrics = EppMetrics(CollectorRegistry())
    body = orjson.dumps(chat(max_tokens=8, stream=True))
    async with st.session.post(st.url + "/v1/chat/completions", data=body) as resp:
        streamed = await resp.read()
    assert resp.status == 200
    labels = {"model_name": MODEL, "target_model_name": MODEL}
    sample = metrics.registry.get_sample_value
    await eventually(lambda: sample("inference_objective_response_sizes_count", labels) == 1,
                     what="the completion recorded")
    assert sample("inference_objective_request_sizes_sum", labels) == len(body)
    assert 0 < sample("inference_objective_response_sizes_sum", labels) <= len(streamed)  # without chunk framing
    assert sample("llm_d_epp_request_streaming_itl_seconds_count",
                  {**labels, "fairness_id": "default-flow", "priority": "0"}) >= 1
