"""``cache_salt`` in precise prefix-cache routing, end to end: EPP's HTTP gateway in front of three simulated vLLM
servers that publish KV events (the fixtures of ``test_precise_routing.py``).

vLLM folds a request's ``cache_salt`` into its first block's hash, so a salted prompt and the same prompt unsalted
(or under another salt) share no cached block; the simulator does the same and publishes the salt in the block's
``extra_keys``. EPP keys the blocks the same way on both sides, so each request's affinity goes only to the server
holding blocks stored for its own salt."""

from __future__ import annotations

from typing import Any

import aiohttp
import openai
import orjson

from epp.framework.plugins import CycleState
from epp.framework.request import parse_request
from epp.runtime.app import EppApp

from ..conftest import eventually
from . import test_precise_routing as routing
from .test_precise_routing import BLOCK, MODEL, NAMES, PRODUCER, Pool, _cache, _held_blocks, _prompt, _subscribed

pools, epps = routing.pools, routing.epps  # that module's fixtures: three simulators, and EPP in front of them


async def _direct(url: str, messages: list[dict[str, str]], salt: str | None) -> None:
    """One chat completion sent straight to a simulator (EPP never sees it)."""
    body: dict[str, Any] = {"model": MODEL, "messages": messages, "max_tokens": 1}
    if salt is not None:
        body["cache_salt"] = salt
    async with aiohttp.ClientSession() as session:
        async with session.post(url + "/v1/chat/completions", json=body) as resp:
            assert resp.status == 200, await resp.text()


async def _request(app: EppApp, messages: list[dict[str, str]], salt: str | None) -> Any:
    """The request as EPP parses and renders it (token ids from the token-producer)."""
    body: dict[str, Any] = {"model": MODEL, "messages": messages}
    if salt is not None:
        body["cache_salt"] = salt
    request = parse_request("/v1/chat/completions", orjson.dumps(body), {})
    await app.pipeline.handle.plugin("token-producer").prepare(request)  # type: ignore[union-attr]
    assert request.token_ids, "the render route gave no ids"
    return request


async def _matches(app: EppApp, messages: list[dict[str, str]], salt: str | None) -> dict[str, int]:
    """What the producer stores for the request: matched blocks by endpoint name."""
    cache, cycle = _cache(app), CycleState()
    cache.produce(cycle, await _request(app, messages, salt), app.datastore.endpoints())
    return dict(cycle[cache.state_key].matches)


async def _through_epp(app: EppApp, pool: Pool, messages: list[dict[str, str]], salt: str | None) -> tuple[str, Any]:
    """One chat completion through EPP (the openai client, ``cache_salt`` in the body); (server that ran it,
    response)."""
    before = pool.finished()
    client = openai.AsyncOpenAI(base_url=app.gateway.url + "/v1", api_key="unused", max_retries=0)
    extra = {"cache_salt": salt} if salt is not None else None
    try:
        response = await client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2,  # type: ignore
                                                        extra_body=extra)
    finally:
        await client.close()
    served = [name for name, b, a in zip(NAMES, before, pool.finished()) if a > b]
    assert len(served) == 1, served
    return served[0], response


async def test_salted_and_unsalted_prompts_get_only_their_own_affinity(pools: Any, epps: Any) -> None:
    """The same long prompt is run directly on b with salt "alice" and on c without a salt. EPP's index then has the
    salted blocks on b only and the plain ones on c only; routed through EPP, the salted request goes to b and hits
    its cache there, the unsalted one goes to c, and a request salted "bob" matches no server at all."""
    pool = await pools()
    app = await epps(PRODUCER, pool)
    await _subscribed(app, pool)
    b, c = pool.by_name("b"), pool.by_name("c")
    messages = _prompt("tenants sharing one model")
    cache = _cache(app)
    salted = cache.block_keys(await _request(app, messages, "alice"))
    plain = cache.block_keys(await _request(app, messages, None))
    n = len(plain)
    assert n >= 10 and len(salted) == n and not set(salted) & set(plain)

    await _direct(b.url, messages, "alice")
    await _direct(c.url, messages, None)
    await eventually(lambda: _held_blocks(app, salted) == {b.address: n} and _held_blocks(app, plain) == {c.address: n},
                     "the salted blocks on b and the plain ones on c")

    assert await _matches(app, messages, "alice") == {"b": n}
    assert await _matches(app, messages, None) == {"c": n}
    assert await _matches(app, messages, "bob") == {}

    served, response = await _through_epp(app, pool, messages, "alice")
    assert served == "b"
    assert response.usage.prompt_tokens_details.cached_tokens >= BLOCK * (n - 1)  # the same salt shares the cache
    served, response = await _through_epp(app, pool, messages, None)
    assert served == "c"
    assert response.usage.prompt_tokens_details.cached_tokens >= BLOCK * (n - 1)
