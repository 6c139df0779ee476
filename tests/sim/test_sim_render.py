"""vLLM's prompt render routes: the ids they return are the ids the engine caches and publishes in KV events."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest

from epp_sim import SimServer, decode_batch

from .kv_subscriber import Subscriber

StartServer = Callable[..., Awaitable[SimServer]]
BLOCK = 16
LORA = "sql-lora"




async def _post(server: SimServer, path: str, body: Any) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as session:
        kw: dict[str, Any] = {"data": body} if isinstance(body, bytes) else {"json": body}
        async with session.post(server.url + path, **kw) as resp:
            return resp.status, await resp.json()


async def _connected(server: SimServer, sub: Subscriber) -> None:
    """Send throw-away completions until the PUB/SUB connection is up (ZMQ's slow joiner), then drain."""
    for i in range(50):
        await _post(server, "/v1/completions", {"prompt": f"warm-up {i} " * 8, "max_tokens": 1})
        if await sub.receive():
            return
    raise AssertionError("no KV events arrived")


def _stored_tokens(frames: list[list[bytes]]) -> tuple[list[int], set[str | None]]:
    """The token ids of every BlockStored event, in order, and the LoRA names they carry."""
    tokens: list[int] = []
    loras: set[str | None] = set()
    for _, _, payload in frames:
        for ev in decode_batch(payload)[1]:
            if ev["type"] == "BlockStored":
                tokens += ev["token_ids"]
                loras.add(ev["lora_name"])
    return tokens, loras


# Whole blocks, so that every rendered id lands in a stored block: the chat renders to 128 bytes of template and
# text (32 tokens), the completion is 192 bytes (48 tokens); the one output token completes no block.
_CHAT = {"messages": [{"role": "system", "content": "You route prompts to the pod that cached them."},
                      {"role": "user", "content": "Which pod holds this conversation prefix, pls?"}],
         "max_tokens": 1}
_COMPLETION = {"prompt": "precise prefix routing hashes the rendered prompt ids, not text " * 3, "max_tokens": 1}


@pytest.mark.parametrize("model", [None, LORA], ids=["base", "lora"])
@pytest.mark.parametrize(("route", "body"), [("/v1/chat/completions", _CHAT), ("/v1/completions", _COMPLETION)],
                         ids=["chat", "completions"])
async def test_render_ids_are_the_ids_the_engine_stores(
    start_server: StartServer, subscriber: Subscriber, route: str, body: dict[str, Any], model: str | None
) -> None:
    server = await start_server(kv_events_endpoint=subscriber.endpoint, lora_adapters=[LORA])
    await _connected(server, subscriber)
    body = {**body, "model": model or server.cfg.model}
    status, rendered = await _post(server, route + "/render", body)
    assert status == 200
    ids = (rendered if route == "/v1/chat/completions" else rendered[0])["token_ids"]
    assert len(ids) in (2 * BLOCK, 3 * BLOCK)

    status, _ = await _post(server, route, body)
    assert status == 200
    tokens, loras = _stored_tokens(await subscriber.receive())
    assert tokens == ids
    assert loras == {model}


async def test_render_submits_nothing_to_the_engine(sim_server: SimServer) -> None:
    status, _ = await _post(sim_server, "/v1/chat/completions/render", _CHAT)
    assert status == 200
    status, _ = await _post(sim_server, "/v1/completions/render", _COMPLETION)
    assert status == 200
    stats = sim_server.engine.stats
    assert (stats.prefix_cache_queries, sim_server.engine.num_waiting, sim_server.engine.num_running) == (0, 0, 0)


async def test_completions_render_answers_one_request_per_prompt(sim_server: SimServer) -> None:
    async def tokenize(prompt: Any) -> list[int]:
        return (await _post(sim_server, "/tokenize", {"prompt": prompt}))[1]["tokens"]

    hello, bye = await tokenize("Hello world"), await tokenize("Goodbye world")
    cases: list[tuple[Any, list[list[int]]]] = [
        ("Hello world", [hello]),
        (["Hello world"], [hello]),
        (["Hello world", "Goodbye world"], [hello, bye]),
        ([5, 6, 7], [[5, 6, 7]]),
        ([[5, 6], [7, 8, 9]], [[5, 6], [7, 8, 9]]),
    ]
    for prompt, expected in cases:
        status, rendered = await _post(sim_server, "/v1/completions/render",
                                       {"model": "sim-model", "prompt": prompt, "return_token_offsets": True})
        assert status == 200, prompt
        assert [r["token_ids"] for r in rendered] == expected
        for r in rendered:
            assert r["request_id"].startswith("cmpl-")
            assert r["model"] == "sim-model"
            assert (r["token_offsets"], r["features"], r["stream"], r["stream_options"]) == (None, None, False, None)
            # vLLM's SamplingParams dump omits defaults: max_tokens is the completion default of 16.
            assert r["sampling_params"] == {"output_kind": 2, "skip_clone": True}
    assert len({r["request_id"] for r in rendered}) == 2


async def test_chat_render_keeps_the_request_fields_vllm_keeps(sim_server: SimServer) -> None:
    body = {**_CHAT, "model": "sim-model", "max_tokens": None, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
            "temperature": 0.123, "top_p": 0.456, "frequency_penalty": 1.1, "stop": "END", "cache_salt": "tenant",
            "priority": "3", "add_generation_prompt": True, "chat_template_kwargs": {"enable_thinking": False}}
    status, rendered = await _post(sim_server, "/v1/chat/completions/render", body)
    assert status == 200
    assert rendered["request_id"].startswith("chatcmpl-")
    assert rendered["model"] == "sim-model"
    assert rendered["stream"] is True
    assert rendered["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert (rendered["assistant_tokens_mask"], rendered["token_offsets"], rendered["features"]) == (None, None, None)
    assert (rendered["cache_salt"], rendered["priority"]) == ("tenant", 3)
    tokens = (await _post(sim_server, "/tokenize", {"messages": _CHAT["messages"]}))[1]["tokens"]
    assert rendered["token_ids"] == tokens
    assert rendered["sampling_params"] == {
        "temperature": 0.123, "top_p": 0.456, "frequency_penalty": 1.1, "stop": ["END"],
        # No output limit: up to the context length, as vLLM's get_max_tokens gives it.
        "max_tokens": sim_server.cfg.max_model_len - len(tokens), "output_kind": 1, "skip_clone": True,
    }


@pytest.mark.parametrize("route", ["/v1/completions/render", "/v1/chat/completions/render"])
async def test_unknown_model_is_vllms_404(sim_server: SimServer, route: str) -> None:
    status, body = await _post(sim_server, route, {**_CHAT, **_COMPLETION, "model": "no-such-model"})
    assert status == 404
    assert body == {"error": {"message": "The model `no-such-model` does not exist.", "type": "NotFoundError",
                              "param": "model", "code": 404}}


@pytest.mark.parametrize(("route", "body", "param"), [
    ("/v1/completions/render", b"{not json", None),
    ("/v1/completions/render", {"model": "sim-model"}, "prompt"),
    ("/v1/completions/render", {"prompt": {"text": "x"}}, "prompt"),
    ("/v1/completions/render", {"prompt": ""}, "prompt"),
    ("/v1/completions/render", {"prompt": "x", "max_tokens": 0}, "max_tokens"),
    ("/v1/completions/render", {"prompt": "x" * 4 * 40000}, "input_tokens"),
    ("/v1/completions/render", {"prompt": "x", "stream_options": {"include_usage": True}}, "stream_options"),
    ("/v1/chat/completions/render", [1, 2], None),
    ("/v1/chat/completions/render", {"model": "sim-model"}, "messages"),
    ("/v1/chat/completions/render", {"messages": []}, "messages"),
    ("/v1/chat/completions/render", {"messages": [{"content": "no role"}]}, "messages"),
    ("/v1/chat/completions/render", {"messages": [{"role": "user", "content": "x"}], "priority": "high"}, None),
], ids=["malformed-json", "no-prompt", "prompt-object", "empty-prompt", "max-tokens-0", "too-long",
        "stream-options-without-stream", "not-an-object", "no-messages", "empty-messages", "message-without-role",
        "priority-not-int"])
async def test_bad_bodies_are_400s(sim_server: SimServer, route: str, body: Any, param: str | None) -> None:
    if isinstance(body, list):
        body = repr(body).encode()
    status, answer = await _post(sim_server, route, body)
    assert status == 400
    assert answer["error"]["type"] == "BadRequestError" and answer["error"]["code"] == 400
    assert answer["error"]["param"] == param
