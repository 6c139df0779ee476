"""Precise prefix-cache routing end to end: EPP (``EppApp`` with the HTTP gateway) in front of three simulated vLLM
servers that publish KV-cache events over ZMQ, as llm-d deploys it.

Each simulator listens on its own loopback address (127.0.0.1, .2, .3) and binds its KV-event publisher there on
one shared port, like pods that all bind ``tcp://*:5557``; EPP's producer connects to ``<address>:<socketPort>``
of every endpoint. A ``token-producer`` gets the prompt's ids from one simulator's render route. Which server
answered is read from the simulators' own finished-request counters."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import openai
import orjson
import pytest
import zmq

from epp.framework.endpoint import EndpointSpec
from epp.framework.request import parse_request
from epp.kvcache import longest_prefix
from epp.runtime.app import EppApp, ServeOptions
from epp.runtime.ports import free_ports
from epp_sim import SimConfig, SimServer

from ..conftest import Servers, eventually

MODEL = "sim-model"
BLOCK = 16
HOSTS = ("127.0.0.1", "127.0.0.2", "127.0.0.3")
NAMES = ("a", "b", "c")

TOKENS = """\
- type: token-producer
  parameters: {modelName: sim-model, vllm: {http: "%(render)s"}}
"""
PRODUCER = TOKENS + """\
- type: precise-prefix-cache-producer
  parameters:
    tokenProcessorConfig: {blockSize: %(block)d}
    kvEventsConfig: {podDiscoveryConfig: {socketPort: %(port)d}}
    indexerConfig: {kvBlockIndexConfig: {enableMetrics: %(metrics)s}}
    speculativeIndexing: %(speculative)s
    speculativeTTL: 10m
- type: prefix-cache-scorer
  parameters: {prefixMatchInfoProducerName: precise-prefix-cache-producer}
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins: [{pluginRef: prefix-cache-scorer}, {pluginRef: max-score-picker}]
"""
LEGACY = TOKENS + """\
- type: precise-prefix-cache-scorer
  parameters:
    tokenProcessorConfig: {blockSize: %(block)d}
    kvEventsConfig: {podDiscoveryConfig: {socketPort: %(port)d}}
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins: [{pluginRef: precise-prefix-cache-scorer}, {pluginRef: max-score-picker}]
"""


class Pool:
    """Three simulators on 127.0.0.1-3, KV events (when enabled) bound on ``port`` at each one's address."""

    def __init__(self, servers: list[SimServer], port: int) -> None:
        self.servers, self.port = servers, port

    def specs(self) -> list[EndpointSpec]:
        return [EndpointSpec(name=n, address=s.host, port=s.port) for n, s in zip(NAMES, self.servers)]

    def finished(self) -> list[int]:
        return [sum(s.engine.stats.finished.values()) for s in self.servers]

    def by_name(self, name: str) -> SimServer:
        return self.servers[NAMES.index(name)]


async def _start_pool(kv_events: bool) -> Pool:
    """Start the three servers; with ``kv_events`` retry on another port if one address has it taken."""
    for _ in range(5):
        port, servers = free_ports(hosts=tuple(HOSTS)), []
        try:
            for i, host in enumerate(HOSTS):
                events = {"kv_events_endpoint": f"tcp://{host}:{port}", "kv_events_bind": True} if kv_events else {}
                server = SimServer(SimConfig(model=MODEL, block_size=BLOCK, time_scale=0.002, seed=i, **events))
                servers.append(server)
                await server.start(host, 0)
            return Pool(servers, port)
        except zmq.ZMQError:
            for server in servers:
                await server.stop()
    raise RuntimeError("no free KV-event port on all three addresses")


@pytest.fixture
def pools(servers: Servers) -> Callable[..., Awaitable[Pool]]:
    """``await pools(kv_events=True)`` -> three started simulators (see ``_start_pool``); stopped after."""

    async def start(kv_events: bool = True) -> Pool:
        pool = await _start_pool(kv_events)
        for server in pool.servers:
            servers.defer(server.stop)
        return pool

    return start


@pytest.fixture
def epps(tmp_path: Path, servers: Servers) -> Callable[..., Awaitable[EppApp]]:
    """``await epps(template, pool, metrics=False, speculative=False)`` -> a started EppApp; stopped after."""
    names = (f"epp{i}.yaml" for i in itertools.count())

    async def start(template: str, pool: Pool, *, metrics: bool = False, speculative: bool = False) -> EppApp:
        config = tmp_path / next(names)
        config.write_text("plugins:\n" + template % {
            "render": pool.servers[0].url, "block": BLOCK, "port": pool.port,
            "metrics": str(metrics).lower(), "speculative": str(speculative).lower()})
        app = EppApp(ServeOptions(config=str(config), endpoints=pool.specs(), host="127.0.0.1", grpc_port=None,
                                  health_port=None, metrics_port=0, http_port=0))
        servers.defer(app.stop)  # before start: a half-started app is stopped too
        await app.start()
        return app

    return start


# ------------------------------------------------------------------ helpers


async def _chat(url: str, messages: list[dict[str, str]], max_tokens: int = 1) -> dict[str, Any]:
    """One chat completion sent straight to a simulator (bypassing EPP)."""
    async with aiohttp.ClientSession() as session:
        body = {"model": MODEL, "messages": messages, "max_tokens": max_tokens}
        async with session.post(url + "/v1/chat/completions", json=body) as resp:
            assert resp.status == 200, await resp.text()
            return await resp.json()


def _cache(app: EppApp) -> Any:
    """The plugin holding the KV-block index (the producer, or the legacy scorer)."""
    return next(p for p in app.pipeline.handle.plugins() if hasattr(p, "index") and hasattr(p, "processor"))


async def _subscribed(app: EppApp, pool: Pool) -> None:
    """Send throw-away prompts to each server until EPP's index has heard of it (ZMQ connects asynchronously, and
    a publisher drops what it sends before the subscriber is there)."""
    cache = _cache(app)
    for server in pool.servers:
        for i in range(100):
            if server.address in cache.index.pods():
                break
            await _chat(server.url, [{"role": "user", "content": f"warm-up {server.address} {i} " * 6}])
            await asyncio.sleep(0.05)
        await eventually(lambda: server.address in cache.index.pods(), f"KV events from {server.address}")


async def _keys(app: EppApp, messages: list[dict[str, str]]) -> list[int]:
    """The prompt's block keys as EPP computes them (render, then hash)."""
    tp = app.pipeline.handle.plugin("token-producer")
    request = parse_request("/v1/chat/completions", orjson.dumps({"model": MODEL, "messages": messages}), {})
    await tp.prepare(request)  # type: ignore[union-attr]
    assert request.token_ids, "the render route gave no ids"
    return _cache(app).processor.keys(request.token_ids, MODEL)  # type: ignore[no-any-return]


def _held_blocks(app: EppApp, keys: list[int]) -> dict[str, int]:
    """Per endpoint id: how many of ``keys`` (from the first) the index says it holds."""
    return longest_prefix(_cache(app).index.lookup(keys))[1]


async def _through_epp(app: EppApp, pool: Pool, messages: list[dict[str, str]]) -> tuple[str, Any]:
    """Send one chat completion through EPP with the openai client; (name of the server that ran it, response)."""
    before = pool.finished()
    client = openai.AsyncOpenAI(base_url=app.gateway.url + "/v1", api_key="unused", max_retries=0)
    try:
        response = await client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2)  # type: ignore
    finally:
        await client.close()
    served = [name for name, b, a in zip(NAMES, before, pool.finished()) if a > b]
    assert len(served) == 1, served
    return served[0], response


def _prompt(topic: str) -> list[dict[str, str]]:
    """A long prompt whose first block already depends on ``topic`` (prompts share no block)."""
    return [{"role": "user", "content": f"{topic}: explain them in detail, with examples. " * 12}]


# ------------------------------------------------------------------ tests


@pytest.mark.parametrize("template,target", [(PRODUCER, "b"), (LEGACY, "c")], ids=["producer+scorer", "legacy"])
async def test_request_goes_where_the_server_says_the_prefix_is(pools: Any, epps: Any, template: str,
                                                               target: str) -> None:
    """A prompt run directly on one server (EPP never saw it) is routed there once that server's KV events reach
    EPP; after the server resets its prefix cache (AllBlocksCleared), the index no longer places it there."""
    pool = await pools()
    app = await epps(template, pool)
    await _subscribed(app, pool)
    server = pool.by_name(target)
    messages = _prompt("precise prefix-cache routing")
    keys = await _keys(app, messages)
    assert len(keys) >= 10

    await _chat(server.url, messages)
    await eventually(lambda: _held_blocks(app, keys).get(server.address) == len(keys), "the prompt's blocks indexed")
    assert set(_held_blocks(app, keys)) == {server.address}

    served, response = await _through_epp(app, pool, messages)
    assert served == target
    assert response.usage.prompt_tokens_details.cached_tokens >= BLOCK * (len(keys) - 1)  # it hit the cache

    async with aiohttp.ClientSession() as session:
        async with session.post(server.url + "/reset_prefix_cache") as resp:
            assert (await resp.json())["success"] is True
    await eventually(lambda: server.address not in _cache(app).index.pods(), "AllBlocksCleared applied")
    assert server.address not in _held_blocks(app, keys)
    others = {s.address for s in pool.servers if s is not server}
    assert others <= set(_cache(app).index.pods())  # the other servers' blocks stay


async def test_speculative_indexing_keeps_a_prefix_together_before_any_event(pools: Any, epps: Any) -> None:
    """Without KV events (the servers publish none), two same-prefix requests sent back to back still land on the
    same server: the first pick is recorded in the index for speculativeTTL. Six prefixes: by chance alone all six
    pairs would meet with probability (1/3)^6."""
    pool = await pools(kv_events=False)
    app = await epps(PRODUCER, pool, speculative=True)
    cache = _cache(app)
    for topic in ("tries", "ropes", "skip lists", "B-trees", "radix sorts", "bloom filters"):
        first, _ = await _through_epp(app, pool, _prompt(topic))
        follow_up = _prompt(topic) + [{"role": "user", "content": "And a follow-up question."}]
        second, _ = await _through_epp(app, pool, follow_up)
        assert first == second, topic
        keys = await _keys(app, _prompt(topic))
        entries = [e for holders in cache.index.lookup(keys) for e in holders]
        assert entries and all(e.speculative for e in entries)  # nothing but routing-time guesses
        assert {e.pod for e in entries} == {pool.by_name(first).address}
    assert all(server.kv_publisher is None for server in pool.servers)


@pytest.mark.parametrize("enabled", [True, False], ids=["enableMetrics", "off"])
async def test_index_metrics_on_epps_metrics_port(pools: Any, epps: Any, enabled: bool) -> None:
    pool = await pools()
    app = await epps(PRODUCER, pool, metrics=enabled)
    await _subscribed(app, pool)
    await _through_epp(app, pool, _prompt("metrics"))
    async with aiohttp.ClientSession() as session:
        async with session.get(f"http://127.0.0.1:{app.metrics_port}/metrics") as resp:
            text = await resp.text()
    samples = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
               for line in text.splitlines() if line.startswith("kvcache_index_")}
    if not enabled:
        assert samples == {}
        return
    assert samples['kvcache_index_admissions_total{backend="in_memory"}'] > 0
    # events may still arrive after the scrape; nothing is evicted here, so the index only grows
    assert 0 < samples['kvcache_index_entries{backend="in_memory"}'] <= len(_cache(app).index)
    assert samples["kvcache_index_lookup_requests_total"] >= 1
    assert {'kvcache_index_evictions_total{backend="in_memory"}', "kvcache_index_lookup_hits_total",
            'kvcache_index_hit_rate{backend="in_memory"}'} <= set(samples)
