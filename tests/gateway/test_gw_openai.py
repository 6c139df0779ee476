"""The official ``openai`` client through the gateway to simulated vLLM servers."""

from __future__ import annotations

from epp.config.loader import DEFAULT_CONFIG_TEXT
from epp.framework.endpoint import Metrics
from epp.headers import MODEL_REWRITE_HEADER, HeaderTrust
from epp_sim import SimServer

from .helpers import MODEL, chat, random_config, sim, spec_for


async def _pool(sims, stack, n: int = 2, config: str = DEFAULT_CONFIG_TEXT, **cfg):
    servers: list[SimServer] = await sims(*[sim(**cfg) for _ in range(n)])
    return servers, await stack(config, [spec_for(s) for s in servers])


async def test_chat_completion(sims, stack):
    _, st = await _pool(sims, stack)
    async with st.openai() as client:
        resp = await client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi!"}],
                                                    max_tokens=8)
    assert resp.model == MODEL
    assert resp.choices[0].message.content
    assert resp.usage is not None and resp.usage.completion_tokens == 8
    info = st.recorder.infos[-1]
    assert (info.status, info.prompt_tokens, info.completion_tokens, info.streamed) == (
        200, resp.usage.prompt_tokens, 8, False)
    assert st.inflight() == 0


async def test_chat_completion_streaming_reports_usage(sims, stack):
    _, st = await _pool(sims, stack)
    async with st.openai() as client:
        stream = await client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi!"}],
                                                      max_tokens=12, stream=True,
                                                      stream_options={"include_usage": True})
        chunks = [chunk async for chunk in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    usage = chunks[-1].usage
    assert text
    assert usage is not None and usage.completion_tokens == 12
    info = st.recorder.infos[-1]
    assert (info.status, info.prompt_tokens, info.completion_tokens, info.streamed) == (
        200, usage.prompt_tokens, 12, True)
    assert st.inflight() == 0


async def test_completions_streaming_and_not(sims, stack):
    _, st = await _pool(sims, stack, config=random_config())
    async with st.openai() as client:
        plain = await client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=5)
        stream = await client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=5,
                                                 stream=True)
        pieces = [c.choices[0].text async for c in stream if c.choices]
    assert plain.choices[0].text and plain.usage.completion_tokens == 5
    assert "".join(pieces)
    assert [i.status for i in st.recorder.infos] == [200, 200]


async def test_embeddings(sims, stack):
    _, st = await _pool(sims, stack)
    async with st.openai() as client:
        resp = await client.embeddings.create(model=MODEL, input=["a sentence", "another one"])
    assert len(resp.data) == 2 and len(resp.data[0].embedding) > 0
    assert st.recorder.infos[-1].prompt_tokens == resp.usage.prompt_tokens


async def test_models_lists_the_pool_union_with_adapters(sims, stack):
    servers = await sims(sim(lora_adapters=["sql-lora"]), sim(model="other-model"))
    st = await stack(DEFAULT_CONFIG_TEXT, [spec_for(s) for s in servers])
    # An adapter only the metrics know about (loaded after the last model listing, say).
    st.datastore.endpoints()[1].metrics = Metrics(running_loras=frozenset({"metrics-lora"}))
    async with st.openai() as client:
        ids = {m.id async for m in client.models.list()}
    assert ids == {MODEL, "sql-lora", "other-model", "metrics-lora"}


async def test_request_id_is_propagated(sims, stack):
    _, st = await _pool(sims, stack, n=1)
    async with st.openai() as client:
        raw = await client.chat.completions.with_raw_response.create(
            model=MODEL, messages=[{"role": "user", "content": "Hi!"}], max_tokens=2,
            extra_headers={"x-request-id": "req-42"})
    # The simulator derives the completion id from the x-request-id it received.
    assert raw.parse().id == "chatcmpl-req-42"
    assert raw.headers["x-request-id"] == "req-42"


async def test_model_rewrite_is_invisible_to_the_client(sims, stack):
    _, st = await _pool(sims, stack, n=1)
    st.director.header_trust = HeaderTrust([MODEL_REWRITE_HEADER])  # the rewrite comes from a trusted gateway
    status, body = await st.post("/v1/chat/completions", chat(max_tokens=2) | {"model": "alias"},
                                 headers={"x-gateway-model-name-rewrite": MODEL})
    assert status == 200, body
    assert body["model"] == "alias"
    request, _, _ = st.recorder.done[-1]
    assert request.target_model == MODEL


async def test_health_and_readiness(sims, stack):
    servers = await sims(sim())
    st = await stack(DEFAULT_CONFIG_TEXT, [spec_for(servers[0])], synced=False)
    assert (await st.get("/health"))[0] == 200
    status, body = await st.get("/ready")
    assert status == 503 and "synced" in body["reason"]
    st.datastore.mark_synced()
    assert (await st.get("/ready"))[0] == 200
    st.datastore.replace_all([])
    status, body = await st.get("/ready")
    assert status == 503 and body["endpoints"] == 0
