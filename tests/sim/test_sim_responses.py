"""``POST /v1/responses`` on the simulator: the official ``openai`` client and the raw SSE event order."""

from __future__ import annotations

import aiohttp
import openai
import orjson
import pytest

from epp_sim import SimServer


def _client(server: SimServer) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="sim", max_retries=0)


async def test_responses_non_streaming(sim_server: SimServer) -> None:
    async with _client(sim_server) as client:
        out = await client.responses.create(model="sim-model", instructions="be brief " * 20,
                                            input="Tell me a story.", max_output_tokens=6)
    assert out.object == "response" and out.id.startswith("resp_") and out.model == "sim-model"
    assert out.status == "incomplete" and out.incomplete_details.reason == "max_output_tokens"
    [item] = out.output
    assert (item.type, item.role, item.content[0].type) == ("message", "assistant", "output_text")
    assert out.output_text and out.output_text == item.content[0].text
    assert out.usage.output_tokens == 6 and out.usage.input_tokens > 40
    assert out.usage.total_tokens == out.usage.input_tokens + 6
    assert out.usage.input_tokens_details.cached_tokens == 0


async def test_responses_message_list_input_counts_like_the_same_chat(sim_server: SimServer) -> None:
    messages = [{"role": "user", "content": [{"type": "input_text", "text": "Hello there"}]}]
    async with _client(sim_server) as client:
        out = await client.responses.create(model="sim-model", input=messages, max_output_tokens=3)
        chat = await client.chat.completions.create(model="sim-model", max_tokens=3,
                                                    messages=[{"role": "user", "content": "Hello there"}])
    assert out.usage.input_tokens == chat.usage.prompt_tokens


async def test_responses_streaming_events_in_openai_order(sim_server: SimServer) -> None:
    async with _client(sim_server) as client:
        stream = await client.responses.create(model="sim-model", input="Hi!", max_output_tokens=5, stream=True)
        events = [event async for event in stream]
    kinds = [e.type for e in events]
    assert kinds == ["response.created", "response.in_progress", "response.output_item.added",
                     "response.content_part.added"] + ["response.output_text.delta"] * 5 + [
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.completed"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    final = events[-1].response
    assert deltas and final.output_text == deltas == events[-4].text
    assert events[0].response.status == "in_progress" and events[0].response.usage is None
    assert final.usage.output_tokens == 5 and final.usage.input_tokens > 0


async def test_responses_sse_lines_name_each_event(sim_server: SimServer) -> None:
    body = {"model": "sim-model", "input": "Hi", "max_output_tokens": 2, "stream": True}
    async with aiohttp.ClientSession() as session, session.post(sim_server.url + "/v1/responses", json=body) as resp:
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        raw = await resp.read()
    blocks = [b for b in raw.split(b"\n\n") if b]
    for block in blocks:
        event, data = block.split(b"\n")
        assert event.startswith(b"event: ") and data.startswith(b"data: ")
        assert orjson.loads(data[6:])["type"] == event[7:].decode()
    assert b"[DONE]" not in raw


async def test_responses_rejects_what_it_cannot_honour(sim_server: SimServer) -> None:
    async with _client(sim_server) as client:
        for kw in ({"input": "x", "previous_response_id": "resp_1"},
                   {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
                   {"input": []}):
            with pytest.raises(openai.BadRequestError):
                await client.responses.create(model="sim-model", **kw)
