"""``POST /v1/messages`` on the simulator: the official ``anthropic`` client, the raw SSE events, vLLM's errors,
prefix caching and P/D, as vLLM's Anthropic entrypoint serves them."""

from __future__ import annotations

from typing import Any

import aiohttp
import anthropic
import openai
import orjson
import pytest

from epp_sim import SimConfig, SimPool, SimServer

PREFILL_PARAMS = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                  "remote_block_ids": None, "remote_host": None, "remote_port": None}


def _client(server: SimServer) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=server.url, api_key="sim", max_retries=0)


async def _post(server: SimServer, body: dict[str, Any]) -> tuple[int, str, bytes]:
    async with aiohttp.ClientSession() as session, session.post(server.url + "/v1/messages", json=body) as resp:
        return resp.status, resp.headers["Content-Type"], await resp.read()


async def test_messages_non_streaming(sim_server: SimServer) -> None:
    async with _client(sim_server) as client:
        out = await client.messages.create(model="sim-model", max_tokens=6, system="Be brief. " * 10,
                                           messages=[{"role": "user", "content": "Tell me a story."}])
    assert out.type == "message" and out.role == "assistant" and out.model == "sim-model"
    assert out.id.startswith("chatcmpl-")  # vLLM answers with its chat completion's id
    [block] = out.content
    assert block.type == "text" and block.text
    assert out.stop_reason == "max_tokens" and out.usage.output_tokens == 6 and out.usage.input_tokens > 20
    assert out.usage.cache_read_input_tokens is None  # vLLM reports no cache counts in this API


async def test_messages_count_the_prompt_as_the_equivalent_chat_and_share_its_prefix_cache(
        sim_server: SimServer) -> None:
    system, user = "You are a careful assistant. " * 20, "Hello there"
    async with _client(sim_server) as client:
        out = await client.messages.create(model="sim-model", max_tokens=2, system=system,
                                           messages=[{"role": "user", "content": [{"type": "text", "text": user}]}])
    hits = sim_server.engine.stats.prefix_cache_hits
    async with openai.AsyncOpenAI(base_url=sim_server.url + "/v1", api_key="sim", max_retries=0) as oai:
        chat = await oai.chat.completions.create(model="sim-model", max_tokens=2, messages=[
            {"role": "system", "content": system}, {"role": "user", "content": user}])
    assert chat.usage.prompt_tokens == out.usage.input_tokens  # vLLM converts it into this chat request
    assert chat.usage.prompt_tokens_details.cached_tokens > 100  # the Messages request filled the cache
    assert sim_server.engine.stats.prefix_cache_hits > hits


async def test_messages_streaming_events_in_vllms_order(sim_server: SimServer) -> None:
    async with _client(sim_server) as client:
        async with client.messages.stream(model="sim-model", max_tokens=5,
                                          messages=[{"role": "user", "content": "Hi!"}]) as stream:
            events = [event async for event in stream if not event.type == "text"]
            final = await stream.get_final_message()
    assert [e.type for e in events] == ["message_start", "content_block_start"] + ["content_block_delta"] * 5 + [
        "content_block_stop", "message_delta", "message_stop"]
    assert events[0].message.usage.input_tokens == final.usage.input_tokens > 0
    assert events[0].message.usage.output_tokens == 0
    assert final.usage.output_tokens == 5 and final.stop_reason == "max_tokens"
    assert final.content[0].text == "".join(e.delta.text for e in events if e.type == "content_block_delta")


async def test_messages_sse_lines_as_vllm_dumps_them(sim_server: SimServer) -> None:
    body = {"model": "sim-model", "max_tokens": 2, "stream": True, "messages": [{"role": "user", "content": "x"}]}
    status, ctype, raw = await _post(sim_server, body)
    assert status == 200 and ctype.startswith("text/event-stream")
    blocks = [b.split(b"\n") for b in raw.strip().split(b"\n\n")]
    names = [block[0].removeprefix(b"event: ").decode() for block in blocks]
    data = [orjson.loads(block[1].removeprefix(b"data: ")) for block in blocks]
    assert [d["type"] for d in data] == names and b"[DONE]" not in raw
    start = data[0]["message"]
    assert "type" not in start and "role" not in start  # exclude_unset: vLLM leaves the defaults out
    assert (start["content"], start["stop_reason"], start["stop_sequence"]) == ([], None, None)
    assert list(data[1]) == ["type", "content_block", "index"]  # pydantic's field order
    assert data[-2] == {"type": "message_delta", "delta": {"stop_reason": "max_tokens"},
                        "usage": {"input_tokens": start["usage"]["input_tokens"], "output_tokens": 2}}
    assert data[-1] == {"type": "message_stop"}


@pytest.mark.parametrize("body, status, shape", [
    ({"model": "sim-model", "messages": [{"role": "user", "content": "x"}]}, 400, "openai"),
    ({"model": "sim-model", "max_tokens": 0, "messages": [{"role": "user", "content": "x"}]}, 400, "openai"),
    ({"model": "sim-model", "max_tokens": 4, "messages": [{"role": "tool", "content": "x"}]}, 400, "openai"),
    ({"model": "nope", "max_tokens": 4, "messages": [{"role": "user", "content": "x"}]}, 404, "anthropic"),
    ({"model": "sim-model", "max_tokens": 10 ** 6, "messages": [{"role": "user", "content": "x"}]}, 400,
     "anthropic"),
], ids=["no-max-tokens", "zero-max-tokens", "bad-role", "unknown-model", "over-the-context"])
async def test_errors_as_vllm_answers_them(sim_server: SimServer, body: dict[str, Any], status: int,
                                           shape: str) -> None:
    """A body vLLM's request model refuses gets its generic validation answer (OpenAI's shape); an error of the
    Messages handler is translated into Anthropic's envelope."""
    got, _, raw = await _post(sim_server, body)
    payload = orjson.loads(raw)
    assert got == status
    if shape == "openai":
        assert payload["error"]["type"] == "Bad Request" and payload["error"]["code"] == 400
    else:
        assert payload["type"] == "error" and set(payload["error"]) == {"type", "message"}
        assert payload["error"]["type"] == ("NotFoundError" if status == 404 else "BadRequestError")


async def test_messages_prefill_then_decode_with_kv_transfer_params() -> None:
    configs = [SimConfig(role=role, time_scale=0.002) for role in ("prefill", "decode")]
    prompt = [{"role": "user", "content": "doc " * 180}]
    async with SimPool(configs) as pool:
        prefill, decode = pool.servers
        _, _, raw = await _post(prefill, {"model": "sim-model", "max_tokens": 1, "messages": prompt,
                                          "kv_transfer_params": PREFILL_PARAMS})
        pre = orjson.loads(raw)
        kvp = pre["kv_transfer_params"]
        assert kvp["do_remote_prefill"] is True and kvp["remote_engine_id"] == prefill.engine_id
        status, _, raw = await _post(decode, {"model": "sim-model", "max_tokens": 8, "messages": prompt,
                                              "kv_transfer_params": kvp})
        dec = orjson.loads(raw)
    assert status == 200 and dec["usage"]["output_tokens"] == 8 and "kv_transfer_params" not in dec
    assert decode.engine.stats.iteration_tokens.sum == 1 + 7  # the decoder computed one prompt token
