"""Failures: dead and dying endpoints, 5xx, slow upstreams, clients that go away."""

from __future__ import annotations

import asyncio
import logging

import aiohttp
import openai
import orjson
import pytest

from epp.framework.endpoint import EndpointSpec

from ..conftest import eventually
from .helpers import MODEL, RawServer, TcpRelay, chat, dead_spec, random_config, sim, spec_for


@pytest.mark.parametrize("fallbacks", [2, 1], ids=["picker-fallback", "fresh-pick"])
async def test_refused_connection_is_retried_on_another_endpoint(sims, stack, caplog, fallbacks):
    [live] = await sims(sim())
    st = await stack(random_config(fallbacks), [dead_spec(), spec_for(live)])
    with caplog.at_level(logging.INFO, logger="epp.gateway"):
        results = await asyncio.gather(*(st.post("/v1/chat/completions", chat(max_tokens=2)) for _ in range(20)))
    assert [status for status, _ in results] == [200] * 20
    assert [ep.name for _, ep, _ in st.recorder.done] == [spec_for(live).name] * 20
    # Each request picks the dead endpoint first with probability 1/2: some did, and were retried.
    assert any(r.message.startswith("retrying request") for r in caplog.records)
    assert st.inflight() == 0


async def test_no_endpoint_left_is_502(stack):
    st = await stack(random_config(), [dead_spec("a"), dead_spec("b")])
    status, body = await st.post("/v1/chat/completions", chat())
    assert status == 502
    assert body["error"]["type"] == "server_error" and body["error"]["code"] == "upstream_unavailable"
    assert st.recorder.infos[-1].status == 502 and st.inflight() == 0


async def test_5xx_is_retried_once_then_passed_through(sims, stack):
    failing, healthy = await sims(sim(failure_rate=1.0), sim())
    st = await stack(random_config(), [spec_for(failing), spec_for(healthy)])
    results = await asyncio.gather(*(st.post("/v1/chat/completions", chat(max_tokens=2)) for _ in range(10)))
    assert [status for status, _ in results] == [200] * 10

    healthy.set_failure_rate(1.0)
    status, body = await st.post("/v1/chat/completions", chat(max_tokens=2))
    assert status == 503 and "injected failure" in body["error"]["message"]  # the upstream's own answer


async def test_streamed_5xx_answer_is_retried_before_any_byte_reached_the_client(sims, stack):
    """A model server that answers 5xx with an SSE content type is retried like a JSON 5xx: nothing had reached
    the client yet."""
    [healthy] = await sims(sim())
    answer = (b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: text/event-stream\r\n"
              b"Transfer-Encoding: chunked\r\n\r\n1c\r\ndata: {\"error\": \"overload\"}\n\n\r\n0\r\n\r\n")
    async with RawServer(answer) as raw:
        st = await stack(random_config(2), [EndpointSpec("failing", "127.0.0.1", raw.port), spec_for(healthy)])
        results = await asyncio.gather(*(st.post("/v1/chat/completions", chat(max_tokens=2)) for _ in range(8)))
    assert [status for status, _ in results] == [200] * 8
    assert {ep.name for _, ep, _ in st.recorder.done} == {spec_for(healthy).name}


async def test_errors_made_by_epp_carry_a_request_id(stack):
    """EPP's own 400 and 503 answers carry x-request-id: the client's, or a new one."""
    st = await stack(random_config(), [])
    async with st.session.post(st.url + "/v1/chat/completions", data=b"{not json") as resp:
        assert resp.status == 400 and len(resp.headers["x-request-id"]) == 36
    async with st.session.post(st.url + "/v1/chat/completions", data=orjson.dumps(chat()),
                               headers={"x-request-id": "abc-1"}) as resp:
        assert resp.status == 503 and resp.headers["x-request-id"] == "abc-1"


async def test_upstream_4xx_passes_through_unchanged(sims, stack):
    [server] = await sims(sim())
    st = await stack(random_config(), [spec_for(server)])
    status, body = await st.post("/v1/chat/completions", chat() | {"model": "no-such-model"})
    assert status == 404 and "no-such-model" in body["error"]["message"]
    assert st.recorder.infos[-1].status == 404


async def test_slow_upstream_times_out_with_504(sims, stack):
    slow, other = await sims(sim(), sim())
    slow.set_hung(True)
    st = await stack(random_config(), [spec_for(slow)], upstream_timeout=0.3)
    status, body = await st.post("/v1/chat/completions", chat())
    assert status == 504 and body["error"]["code"] == "upstream_timeout"
    assert st.recorder.infos[-1].status == 504 and st.inflight() == 0
    slow.set_hung(False)


async def test_endpoint_dying_mid_load_loses_no_request_that_had_not_started_streaming(sims, stack, relays):
    servers = await sims(*[sim(time_scale=0.05) for _ in range(3)])
    dying = servers[0]
    dying.set_hung(True)  # it accepts requests but sends no byte back before it dies
    relay = await relays(dying)
    st = await stack(random_config(), [spec_for(dying, "dying", relay.port)] + [spec_for(s) for s in servers[1:]])
    failed: list[str] = []

    async def one(i: int) -> None:
        async with st.openai() as client:
            try:
                if i % 2:
                    async for _ in await client.chat.completions.create(**chat(f"req {i}", max_tokens=20,
                                                                               stream=True)):
                        pass
                else:
                    await client.chat.completions.create(**chat(f"req {i}", max_tokens=20))
            except openai.APIError as exc:
                failed.append(f"{i}: {exc!r}")

    tasks = [asyncio.create_task(one(i)) for i in range(40)]
    dying_ep = st.datastore.get("dying")
    await eventually(lambda: dying_ep.inflight_requests >= 4, what="requests waiting on the dying endpoint")
    relay.kill()  # the endpoint crashes: its connections are reset, new ones refused
    await asyncio.wait_for(asyncio.gather(*tasks), 30)
    assert failed == []
    assert [(ep.name != "dying", info.status) for _, ep, info in st.recorder.done] == [(True, 200)] * 40
    assert st.inflight() == 0


async def test_stream_whose_server_dies_after_its_head_before_any_token_is_retried(sims, stack):
    """A model server sends its SSE head at once, before the first token (vLLM does): dying then loses no
    request, since nothing has reached the client yet (its head leaves with the first token)."""
    [other] = await sims(sim())
    sse_head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    raw_server = RawServer([sse_head])
    async with raw_server as raw:
        relay = TcpRelay(raw.spec.port)
        await relay.start()
        try:
            st = await stack(random_config(), [EndpointSpec("dying", "127.0.0.1", relay.port)])
            async with aiohttp.ClientSession() as session:
                request = asyncio.create_task(session.post(
                    st.url + "/v1/chat/completions", data=orjson.dumps(chat(max_tokens=5, stream=True))))
                await eventually(lambda: len(raw_server.requests) == 1, what="the request reached the server")
                await asyncio.sleep(0.2)  # its SSE head reaches the gateway
                st.datastore.upsert(spec_for(other, "other"))
                relay.kill()
                async with await request as resp:
                    assert resp.status == 200
                    text = await resp.text()
        finally:
            await relay.stop()
    assert text.rstrip().endswith("data: [DONE]") and text.count("data: ") >= 6
    await eventually(lambda: len(st.recorder.done) == 1, what="request completed")
    _, endpoint, info = st.recorder.done[0]
    assert (endpoint.name, info.status, info.streamed) == ("other", 200, True)
    assert st.inflight() == 0


async def test_no_retry_once_streaming_started(sims, stack, relays):
    breaking, other = await sims(sim(time_scale=0.05), sim())
    relay = await relays(breaking)
    st = await stack(random_config(), [spec_for(breaking, "breaking", relay.port)])
    async with aiohttp.ClientSession() as session:
        async with session.post(st.url + "/v1/chat/completions",
                                data=orjson.dumps(chat(max_tokens=5000, stream=True))) as resp:
            assert resp.status == 200
            await resp.content.readline()
            st.datastore.upsert(spec_for(other, "other"))  # another endpoint exists now, and must not be used
            relay.kill()  # the model server dies mid-stream
            with pytest.raises(aiohttp.ClientPayloadError):
                await resp.read()  # the client sees a broken stream, never a complete-looking one
    await eventually(lambda: len(st.recorder.done) == 1, what="request completed")
    _, endpoint, info = st.recorder.done[0]
    assert (endpoint.name, info.status, info.streamed) == ("breaking", 502, True)
    assert other.engine.stats.prompt_tokens == 0 and st.inflight() == 0


async def test_client_disconnect_mid_stream_frees_upstream_and_inflight(sims, stack):
    [server] = await sims(sim(time_scale=0.05))
    st = await stack(random_config(), [spec_for(server)])
    async with aiohttp.ClientSession() as session:
        resp = await session.post(st.url + "/v1/chat/completions",
                                  data=orjson.dumps(chat(max_tokens=5000, stream=True)))
        assert resp.status == 200
        await resp.content.readline()
        assert st.inflight() == 1 and server.engine.num_running == 1
        resp.close()  # the client goes away mid-stream
    await eventually(lambda: st.inflight() == 0, what="in-flight count released")
    await eventually(lambda: server.engine.num_running == 0, what="the upstream request aborted")
    assert st.recorder.infos[-1].status == 499


async def test_client_disconnect_before_first_byte_frees_upstream_and_inflight(sims, stack, relays):
    [server] = await sims(sim())
    server.set_hung(True)
    relay = await relays(server)
    st = await stack(random_config(), [spec_for(server, port=relay.port)])
    async with aiohttp.ClientSession() as session:
        task = asyncio.create_task(session.post(st.url + "/v1/chat/completions", data=orjson.dumps(chat())))
        await eventually(lambda: st.inflight() == 1 and relay.open == 1, what="request sent upstream")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    await eventually(lambda: st.inflight() == 0, what="in-flight count released")
    await eventually(lambda: relay.open == 0, what="the upstream connection closed")
    assert st.recorder.infos[-1].status == 499
    server.set_hung(False)


async def test_empty_pool_is_503(stack):
    st = await stack(random_config(), [])
    status, body = await st.post("/v1/chat/completions", chat())
    assert status == 503 and body["error"]["code"] == "ServiceUnavailable"
    assert MODEL  # the request was well formed; the pool was not
