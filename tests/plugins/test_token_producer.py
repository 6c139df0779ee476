"""``token-producer`` against a real simulator's vLLM render routes: the ids it stores are the render's, the render
request is the client's body with ``modelName``, and every failure leaves the ids unset without raising."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from epp.errors import ConfigError
from epp.framework.plugins import Handle
from epp.framework.request import InferenceRequest, parse_request
from epp.plugins.producers.token_producer import TokenProducer
from epp_sim import SimConfig, SimServer

from ..conftest import Servers
from .helpers import registry

MODEL = "sim-model"
CHAT = {"model": MODEL, "messages": [{"role": "system", "content": "be brief"},
                                     {"role": "user", "content": "the render route gives these ids " * 4}]}


class Relay:
    """A recording relay in front of one simulator: keeps each request body it forwards."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.bodies: list[tuple[str, dict[str, Any]]] = []
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self.url = ""

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/{tail:.*}", self._relay)
        self._session = aiohttp.ClientSession()
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    async def _relay(self, request: web.Request) -> web.Response:
        raw = await request.read()
        self.bodies.append((request.path, orjson.loads(raw)))
        assert self._session is not None
        async with self._session.post(self.target + request.path, data=raw,
                                      headers={"content-type": "application/json"}) as resp:
            return web.Response(status=resp.status, body=await resp.read(), content_type="application/json")


@pytest.fixture
async def sim() -> AsyncIterator[SimServer]:
    server = SimServer(SimConfig(model=MODEL, time_scale=0.002))
    await server.start("127.0.0.1", 0)
    yield server
    await server.stop()


@pytest.fixture
async def relay(sim: SimServer) -> AsyncIterator[Relay]:
    r = Relay(sim.url)
    await r.start()
    yield r
    await r.stop()


@pytest.fixture
def producers(servers: Servers) -> Callable[..., Awaitable[TokenProducer]]:
    """``await producers(url, **vllm)`` -> a started token-producer asking ``url``; stopped after."""

    async def make(url: str, **vllm: Any) -> TokenProducer:
        p = registry().create("token-producer", "tp", {"modelName": MODEL, "vllm": {"http": url, **vllm}}, Handle())
        return await servers.start(p, None)

    return make


def _request(path: str, body: dict[str, Any]) -> InferenceRequest:
    return parse_request(path, orjson.dumps(body), {})


async def _render(sim: SimServer, path: str, body: dict[str, Any]) -> Any:
    async with aiohttp.ClientSession() as session:
        async with session.post(sim.url + path, json=body) as resp:
            assert resp.status == 200, await resp.text()
            return await resp.json()


async def test_chat_ids_are_the_render_routes_ids(sim: SimServer, relay: Relay, producers: Any) -> None:
    tp = await producers(relay.url)
    body = {**CHAT, "model": "client-alias", "chat_template_kwargs": {"enable_thinking": False}, "max_tokens": 8,
            "stream": True}
    request = _request("/v1/chat/completions", body)
    await tp.prepare(request)
    expected = (await _render(sim, "/v1/chat/completions/render", {**body, "model": MODEL}))["token_ids"]
    assert request.token_ids == expected and len(expected) > 40
    [(path, sent)] = relay.bodies
    # the client's body, every field that can change the rendering included, with modelName as the model
    assert path == "/v1/chat/completions/render" and sent == {**body, "model": MODEL}
    assert (tp.successes, tp.failures) == (1, 0)


@pytest.mark.parametrize("prompt", ["a completion prompt to render " * 3, ["a one-element batch " * 3]],
                         ids=["text", "one-element-batch"])
async def test_completion_ids_are_the_render_routes_ids(sim: SimServer, relay: Relay, producers: Any,
                                                         prompt: Any) -> None:
    tp = await producers(relay.url)
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 4, "add_special_tokens": False}
    request = _request("/v1/completions", body)
    await tp.prepare(request)
    [expected] = await _render(sim, "/v1/completions/render", body)
    assert request.token_ids == expected["token_ids"] and request.token_ids
    assert relay.bodies == [("/v1/completions/render", body)]


@pytest.mark.parametrize("prompt", [[5, 6, 7, 8, 9], [[5, 6, 7, 8, 9]]], ids=["ids", "one-element-batch"])
async def test_a_token_id_prompt_is_used_as_is(relay: Relay, producers: Any, prompt: Any) -> None:
    tp = await producers(relay.url)
    request = _request("/v1/completions", {"model": MODEL, "prompt": prompt})
    await tp.prepare(request)
    assert request.token_ids == [5, 6, 7, 8, 9] and relay.bodies == []


@pytest.mark.parametrize("path,body", [
    ("/v1/responses", {"model": MODEL, "input": "hello there"}),
    ("/v1/embeddings", {"model": MODEL, "input": "hello there"}),
    ("/v1/completions", {"model": MODEL, "prompt": ["two", "prompts"]}),
], ids=["responses", "embeddings", "batch"])
async def test_other_requests_are_left_alone(relay: Relay, producers: Any, path: str, body: dict) -> None:
    tp = await producers(relay.url)
    request = _request(path, body)
    await tp.prepare(request)
    assert request.token_ids is None and relay.bodies == [] and (tp.successes, tp.failures) == (0, 0)


async def test_ids_already_on_the_request_are_kept(relay: Relay, producers: Any) -> None:
    tp = await producers(relay.url)
    request = _request("/v1/chat/completions", CHAT)
    request.token_ids = [1, 2, 3]
    await tp.prepare(request)
    assert request.token_ids == [1, 2, 3] and relay.bodies == []


def _refused_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"  # nothing listens there any more


async def test_connection_refused_leaves_no_ids(producers: Any) -> None:
    tp = await producers(_refused_url())
    for _ in range(2):
        request = _request("/v1/chat/completions", CHAT)
        await tp.prepare(request)
        assert request.token_ids is None
    assert (tp.successes, tp.failures) == (0, 2)


@pytest.mark.parametrize("path,body", [
    ("/v1/chat/completions", {**CHAT, "max_tokens": 10**9}),  # the render refuses what generation would (400)
    ("/v1/completions", {"model": MODEL, "prompt": ""}),
], ids=["chat-400", "empty-prompt-400"])
async def test_non_200_leaves_no_ids(sim: SimServer, producers: Any, path: str, body: dict) -> None:
    tp = await producers(sim.url)
    request = _request(path, body)
    await tp.prepare(request)
    assert request.token_ids is None and (tp.successes, tp.failures) == (0, 1)


async def test_unknown_model_name_is_a_404_and_leaves_no_ids(sim: SimServer) -> None:
    tp = registry().create("token-producer", "tp", {"modelName": "not-served", "vllm": {"http": sim.url}}, Handle())
    try:
        request = _request("/v1/chat/completions", CHAT)
        await tp.prepare(request)
        assert request.token_ids is None and tp.failures == 1
    finally:
        await tp.stop()


async def test_timeout_leaves_no_ids(sim: SimServer, producers: Any) -> None:
    tp = await producers(sim.url, timeout="100ms", mmTimeout="100ms")
    sim.set_hung(True)
    try:
        request = _request("/v1/chat/completions", CHAT)
        await tp.prepare(request)
    finally:
        sim.set_hung(False)
    assert request.token_ids is None and (tp.successes, tp.failures) == (0, 1)


async def test_tokenizer_alias_loads_the_same_plugin(sim: SimServer) -> None:
    tp = registry().create("tokenizer", "legacy", {"modelName": MODEL, "vllm": {"http": sim.url + "/"}}, Handle())
    try:
        assert isinstance(tp, TokenProducer) and tp.type_name == "token-producer" and tp.base_url == sim.url
        request = _request("/v1/chat/completions", CHAT)
        await tp.prepare(request)
        assert request.token_ids
    finally:
        await tp.stop()


@pytest.mark.parametrize("params", [
    None, {}, {"estimate": {"image": {"mode": "static", "static": {"staticToken": 256}}}},
], ids=["no-parameters", "empty", "estimate-block"])
async def test_without_vllm_or_model_name_it_is_the_estimate_backend(params: dict | None) -> None:
    """llm-d-router's default backend: loads without modelName; EPP leaves the ids to its byte estimates."""
    tp = registry().create("token-producer", "tp", params, Handle())
    try:
        request = _request("/v1/chat/completions", CHAT)
        await tp.prepare(request)
        assert tp.backend == "estimate" and request.token_ids is None and (tp.successes, tp.failures) == (0, 0)
    finally:
        await tp.stop()


def test_a_vllm_block_without_model_name_is_refused() -> None:
    with pytest.raises(ConfigError, match="'modelName' must be specified") as info:
        registry().create("token-producer", "tp", {"vllm": {"http": "http://127.0.0.1:1"}}, Handle())
    assert info.value.field == "modelName"
