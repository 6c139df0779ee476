"""The HTTP surface against the official `openai` client and raw aiohttp requests."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import openai
import pytest

from epp_sim import SimServer

StartServer = Callable[..., Awaitable[SimServer]]


def _client(server: SimServer, **kw: Any) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="sim", max_retries=0, **kw)


async def _post(server: SimServer, path: str, body: Any, **kw: Any) -> tuple[int, Any, Any]:
    async with aiohttp.ClientSession() as session:
        data = body if isinstance(body, (bytes, str)) else None
        json_body = None if data is not None else body
        async with session.post(server.url + path, data=data, json=json_body, **kw) as resp:
            text = await resp.text()
            try:
                payload: Any = await resp.json(content_type=None)
            except ValueError:
                payload = text
            return resp.status, payload, resp.headers


async def test_completion_non_streaming(sim_server: SimServer) -> None:
    async with _client(sim_server) as client:
        out = await client.completions.create(model="sim-model", prompt="hello " * 50, max_tokens=7)
    assert out.object == "text_completion"
    assert out.choices[0].finish_reason == "length"
    assert out.choices[0].text
    assert out.usage is not None
    assert out.usage.completion_tokens == 7
    assert out.usage.prompt_tokens == 75  # 300 bytes / 4
    assert out.usage.prompt_tokens_details is not None
    assert out.usage.prompt_tokens_details.cached_tokens == 0


async def test_chat_streaming_with_usage_counts_every_token(sim_server: SimServer) -> None:
    messages = [{"role": "system", "content": "be brief " * 30}, {"role": "user", "content": "hi"}]
    async with _client(sim_server) as client:
        stream = await client.chat.completions.create(
            model="sim-model", messages=messages, max_tokens=12, stream=True,
            stream_options={"include_usage": True},
        )
        pieces, finish, usage = [], None, None
        async for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage
            for choice in chunk.choices:
                if choice.delta.content:
                    pieces.append(choice.delta.content)
                finish = choice.finish_reason or finish
    assert finish == "length"
    assert usage is not None and usage.completion_tokens == len(pieces) == 12
    again = await _post(sim_server, "/v1/chat/completions",
                        {"model": "sim-model", "messages": messages, "max_tokens": 12})
    assert again[1]["choices"][0]["message"]["content"] == "".join(pieces)
    assert again[1]["usage"]["prompt_tokens_details"]["cached_tokens"] > 0


async def test_completion_streaming(sim_server: SimServer) -> None:
    async with _client(sim_server) as client:
        stream = await client.completions.create(
            model="sim-model", prompt="abc " * 10, max_tokens=5, stream=True
        )
        texts = [c.choices[0].text async for c in stream if c.choices]
    assert len([t for t in texts if t]) == 5


async def test_repeated_prompt_reports_cached_tokens(sim_server: SimServer) -> None:
    prompt = "the same long system prompt " * 40
    async with _client(sim_server) as client:
        first = await client.completions.create(model="sim-model", prompt=prompt, max_tokens=2)
        second = await client.completions.create(model="sim-model", prompt=prompt, max_tokens=2)
    assert first.usage and second.usage
    assert first.usage.prompt_tokens_details.cached_tokens == 0  # type: ignore[union-attr]
    cached = second.usage.prompt_tokens_details.cached_tokens  # type: ignore[union-attr]
    assert cached == (second.usage.prompt_tokens - 1) // 16 * 16
    assert sim_server.engine.stats.prefix_cache_hits == cached


async def test_embeddings_are_deterministic(sim_server: SimServer) -> None:
    async with _client(sim_server) as client:
        a = await client.embeddings.create(model="sim-model", input=["one", "two"])
        b = await client.embeddings.create(model="sim-model", input="one", encoding_format="float")
    assert len(a.data) == 2 and len(a.data[0].embedding) == 32
    assert a.data[0].embedding == pytest.approx(b.data[0].embedding)
    assert a.data[0].embedding != pytest.approx(a.data[1].embedding)
    assert a.usage.prompt_tokens == 2


async def test_models_and_lora_lifecycle(start_server: StartServer) -> None:
    server = await start_server(lora_adapters=["sql"])
    async with _client(server) as client:
        ids = [m.id async for m in client.models.list()]
        assert ids == ["sim-model", "sql"]
        status, _, _ = await _post(server, "/v1/load_lora_adapter",
                                   {"lora_name": "chat", "lora_path": "/adapters/chat"})
        assert status == 200
        out = await client.completions.create(model="chat", prompt="x", max_tokens=1)
        assert out.model == "chat"
        assert (await _post(server, "/v1/load_lora_adapter",
                            {"lora_name": "chat", "lora_path": "p"}))[0] == 400
        assert (await _post(server, "/v1/unload_lora_adapter", {"lora_name": "chat"}))[0] == 200
        assert (await _post(server, "/v1/unload_lora_adapter", {"lora_name": "chat"}))[0] == 404
        with pytest.raises(openai.NotFoundError):
            await client.completions.create(model="chat", prompt="x", max_tokens=1)


async def test_model_cards_have_vllms_fields(start_server: StartServer) -> None:
    # vLLM's models serving: the base card has max_model_len and root, no parent; a LoRA card has root = its
    # path, parent = the base model and no max_model_len; both carry one ModelPermission.
    server = await start_server(max_model_len=512, enable_lora=True)
    await _post(server, "/v1/load_lora_adapter", {"lora_name": "chat", "lora_path": "/adapters/chat"})
    async with aiohttp.ClientSession() as session:
        async with session.get(server.url + "/v1/models") as resp:
            base, lora = (await resp.json())["data"]
    assert list(base) == ["id", "object", "created", "owned_by", "root", "parent", "max_model_len", "permission"]
    assert (base["root"], base["parent"], base["max_model_len"]) == ("sim-model", None, 512)
    assert (lora["id"], lora["root"], lora["parent"], lora["max_model_len"]) == ("chat", "/adapters/chat",
                                                                                 "sim-model", None)
    [permission] = lora["permission"]
    assert permission["id"].startswith("modelperm-") and permission["object"] == "model_permission"
    assert {k: permission[k] for k in ("allow_sampling", "allow_fine_tuning", "organization", "group")} == {
        "allow_sampling": True, "allow_fine_tuning": False, "organization": "*", "group": None}


@pytest.mark.parametrize(
    ("path", "body", "status", "err_type", "message"),
    [("/v1/load_lora_adapter", {"lora_name": "a"}, 400, "InvalidUserInput",
      "Both 'lora_name' and 'lora_path' must be provided."),
     ("/v1/load_lora_adapter", {"lora_name": "sql", "lora_path": "p"}, 400, "InvalidUserInput",
      "The lora adapter 'sql' has already been loaded. If you want to load the adapter in place, set 'load_inplace'"
      " to True."),
     ("/v1/unload_lora_adapter", {}, 400, "InvalidUserInput",
      "'lora_name' needs to be provided to unload a LoRA adapter."),
     ("/v1/unload_lora_adapter", {"lora_name": "nope"}, 404, "NotFoundError",
      "The lora adapter 'nope' cannot be found.")],
    ids=["no-path", "loaded", "unload-no-name", "unload-unknown"],
)
async def test_lora_errors_are_vllms(
    start_server: StartServer, path: str, body: dict[str, Any], status: int, err_type: str, message: str
) -> None:
    server = await start_server(lora_adapters=["sql"])
    got, payload, _ = await _post(server, path, body)
    assert got == status
    assert payload["error"] == {"message": message, "type": err_type, "param": None, "code": status}


async def test_load_inplace_replaces_a_loaded_adapter(start_server: StartServer) -> None:
    server = await start_server(lora_adapters=["sql"])
    body = {"lora_name": "sql", "lora_path": "/adapters/sql-v2", "load_inplace": True}
    assert (await _post(server, "/v1/load_lora_adapter", body))[0] == 200
    assert server.loras["sql"] == "/adapters/sql-v2"


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
async def test_non_streaming_answers_carry_a_null_kv_transfer_params(sim_server: SimServer, path: str) -> None:
    # vLLM's CompletionResponse and ChatCompletionResponse declare kv_transfer_params (None unless P/D) and are
    # answered with model_dump(), so the key is always there.
    body = {"prompt": "hi", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    _, out, _ = await _post(sim_server, path, body)
    assert "kv_transfer_params" in out and out["kv_transfer_params"] is None


@pytest.mark.parametrize(
    ("path", "body", "status"),
    [
        ("/v1/completions", b"{not json", 400),
        ("/v1/completions", b"[1, 2]", 400),
        ("/v1/completions", {"model": "sim-model"}, 400),
        ("/v1/chat/completions", {"model": "sim-model", "messages": []}, 400),
        ("/v1/completions", {"prompt": "x", "max_tokens": 0}, 400),
        ("/v1/completions", {"prompt": "x", "max_tokens": 40000}, 400),
        ("/v1/completions", {"prompt": [1, -1]}, 400),
        ("/v1/completions", {"model": "nope", "prompt": "x"}, 404),
        ("/v1/completions", {"prompt": "x", "stream": True,
                             "kv_transfer_params": {"do_remote_decode": True}}, 400),
        ("/v1/completions", {"prompt": "x", "stream_options": {"include_usage": True}}, 400),
        ("/v1/embeddings", {"model": "sim-model"}, 400),
        ("/v1/load_lora_adapter", {"lora_name": "a"}, 400),
    ],
    ids=["malformed", "not-object", "no-prompt", "no-messages", "zero-max", "too-long",
         "bad-token", "unknown-model", "stream-prefill", "options-no-stream", "no-input",
         "lora-no-path"],
)
async def test_bad_input_gets_openai_error(
    sim_server: SimServer, path: str, body: Any, status: int
) -> None:
    got, payload, _ = await _post(sim_server, path, body)
    assert got == status
    assert payload["error"]["code"] == status and payload["error"]["message"]


async def test_full_waiting_queue_is_429(start_server: StartServer) -> None:
    server = await start_server(max_waiting=0)
    async with _client(server) as client:
        with pytest.raises(openai.RateLimitError):
            await client.completions.create(model="sim-model", prompt="x", max_tokens=1)


async def test_request_id_is_echoed(sim_server: SimServer) -> None:
    headers = {"x-request-id": "trace-42"}
    _, body, got = await _post(sim_server, "/v1/completions",
                               {"prompt": "x", "max_tokens": 1}, headers=headers)
    assert got["x-request-id"] == "trace-42" and body["id"] == "cmpl-trace-42"
    _, _, got = await _post(sim_server, "/v1/completions",
                            {"prompt": "x", "max_tokens": 2, "stream": True}, headers=headers)
    assert got["x-request-id"] == "trace-42"


async def test_failure_injection_rate(start_server: StartServer) -> None:
    server = await start_server(failure_rate=1.0, failure_status=429)
    assert (await _post(server, "/v1/completions", {"prompt": "x", "max_tokens": 1}))[0] == 429
    server.set_failure_rate(0.0)
    assert (await _post(server, "/v1/completions", {"prompt": "x", "max_tokens": 1}))[0] == 200


async def test_hung_server_answers_nothing_until_released(sim_server: SimServer) -> None:
    sim_server.set_hung(True)
    timeout = aiohttp.ClientTimeout(total=0.3)
    with pytest.raises(asyncio.TimeoutError):
        async with aiohttp.ClientSession(timeout=timeout) as session:
            async with session.get(sim_server.url + "/health"):
                pass
    sim_server.set_hung(False)
    async with aiohttp.ClientSession() as session:
        async with session.get(sim_server.url + "/health") as resp:
            assert resp.status == 200


async def test_slow_metrics(start_server: StartServer) -> None:
    server = await start_server(metrics_delay_s=0.5)
    timeout = aiohttp.ClientTimeout(total=0.05)
    with pytest.raises(asyncio.TimeoutError):
        async with aiohttp.ClientSession(timeout=timeout) as session:
            async with session.get(server.url + "/metrics"):
                pass


async def test_client_disconnect_aborts_the_request(start_server: StartServer) -> None:
    server = await start_server(time_scale=0.05)
    async with aiohttp.ClientSession() as session:
        body = {"prompt": "x", "max_tokens": 5000, "stream": True}
        async with session.post(server.url + "/v1/completions", json=body) as resp:
            await resp.content.readline()
    for _ in range(200):
        if server.engine.stats.finished["abort"]:
            break
        await asyncio.sleep(0.01)
    assert server.engine.stats.finished["abort"] == 1
    assert server.engine.num_running == 0


async def test_client_timeout_aborts_a_non_streaming_request(start_server: StartServer) -> None:
    server = await start_server(time_scale=0.05)  # 5000 tokens take over a wall second
    timeout = aiohttp.ClientTimeout(total=0.2)
    with pytest.raises(asyncio.TimeoutError):
        async with aiohttp.ClientSession(timeout=timeout) as session:
            body = {"prompt": "x", "max_tokens": 5000}
            async with session.post(server.url + "/v1/completions", json=body):
                pass
    for _ in range(200):
        if server.engine.stats.finished["abort"]:
            break
        await asyncio.sleep(0.01)
    assert server.engine.stats.finished["abort"] == 1


async def test_tokenize_round_trip(sim_server: SimServer) -> None:
    _, out, _ = await _post(sim_server, "/tokenize", {"prompt": "hello world!"})
    assert out["count"] == 3 and len(out["tokens"]) == 3
    _, back, _ = await _post(sim_server, "/detokenize", {"tokens": out["tokens"]})
    assert back["prompt"] == "hello world!"


async def test_many_concurrent_requests(start_server: StartServer) -> None:
    server = await start_server(max_num_seqs=4, num_gpu_blocks=64)
    async with _client(server) as client:
        outs = await asyncio.gather(*(
            client.completions.create(model="sim-model", prompt=f"{i} " * 30, max_tokens=20)
            for i in range(24)
        ))
    assert all(o.usage and o.usage.completion_tokens == 20 for o in outs)
    assert server.engine.stats.generation_tokens == 24 * 20


async def test_finishing_a_request_whose_client_just_left_is_harmless(
    sim_server: SimServer,
) -> None:
    # The handler's future is cancelled before its except-block runs; the driver must
    # not call set_result on it (that crashed the driver once).
    seq = sim_server.submit("gone", [1, 2, 3], max_tokens=1)
    fut = asyncio.get_running_loop().create_future()
    fut.cancel()
    seq.waiter = fut
    sim_server.engine.finished.append(seq)
    sim_server._dispatch()
    out = await _post(sim_server, "/v1/completions", {"prompt": "still alive", "max_tokens": 2})
    assert out[0] == 200


async def test_stop_is_not_lost_when_the_driver_wakes_at_the_same_moment(start_server: StartServer) -> None:
    # Python 3.11's asyncio.wait_for returns the awaited result when it is cancelled just as that completes,
    # swallowing the cancellation; the driver must stop all the same.
    server = await start_server()
    body = {"prompt": "y" * 400, "max_tokens": 1, "kv_transfer_params": {"do_remote_decode": True}}
    assert (await _post(server, "/v1/completions", body))[0] == 200
    assert server.engine.held  # so the idle driver waits with a timeout (the hold's expiry)
    await asyncio.sleep(0.01)
    loop = asyncio.get_running_loop()
    start = loop.time()
    server._wake.set()
    await asyncio.wait_for(server.stop(), 3)  # stop() swallows this cancellation: time it
    assert loop.time() - start < 1
