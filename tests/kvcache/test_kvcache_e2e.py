"""End to end: a real simulator publishes KV events over ZMQ, EPP's subscriber and apply_events index them, and the
keys of the prompt ids the simulator renders for the same chat body are all found for that server."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest

from epp.kvcache import (
    KVBlockIndex,
    KVEventSubscribers,
    TokenProcessor,
    apply_events,
    decode_batch,
    longest_prefix,
    parse_topic,
)
from epp_sim import SimConfig, SimServer

from ..conftest import Servers

StartServer = Callable[..., Awaitable[SimServer]]
BLOCK = 16
CHAT = {"messages": [{"role": "system", "content": "You route prompts to the pod that cached them."},
                     {"role": "user", "content": "Which pod holds this conversation prefix, please tell me?"}],
        "max_tokens": 1}


@pytest.fixture
def start_server(servers: Servers) -> StartServer:
    """``await start_server(**SimConfig fields)`` -> a started simulator; stopped after."""

    async def start(**fields: Any) -> SimServer:
        return await servers.start(SimServer(SimConfig(time_scale=0.002, block_size=BLOCK, **fields)), "127.0.0.1", 0)

    return start


class Indexer:
    """What the precise producer does with a message: decode it and apply it under the socket's owner, or else the
    topic's endpoint id."""

    def __init__(self) -> None:
        self.index = KVBlockIndex()
        self.processor = TokenProcessor(BLOCK)
        self.messages = 0

    def on_message(self, topic: str, payload: bytes, owner: str | None) -> None:
        self.messages += 1
        pod, model = parse_topic(topic)
        apply_events(self.index, self.processor, owner or pod, model, decode_batch(payload))


async def post(server: SimServer, path: str, body: dict[str, Any]) -> Any:
    async with aiohttp.ClientSession() as session:
        async with session.post(server.url + path, json=body) as resp:
            assert resp.status == 200, await resp.text()
            return await resp.json()


async def warm_up(server: SimServer, indexer: Indexer) -> None:
    """Send distinct completions until an event arrives (ZMQ's slow joiner drops the ones sent before)."""
    async with asyncio.timeout(60):
        i = 0
        while not indexer.messages:
            await post(server, "/v1/completions", {"prompt": f"warm-up {i} " * 8, "max_tokens": 1})
            await asyncio.sleep(0.02)
            i += 1


async def indexed(indexer: Indexer, keys: list[int], pod: str) -> dict[str, int]:
    """Poll until ``pod`` holds every key; the per-endpoint block counts then."""
    async with asyncio.timeout(60):
        while True:
            counts = longest_prefix(indexer.index.lookup(keys))[1]
            if counts.get(pod) == len(keys):
                return counts
            await asyncio.sleep(0.01)


@pytest.mark.parametrize(("mode", "fmt"), [("connect", "map"), ("bind", "array")],
                         ids=["epp-connects-map", "epp-binds-array"])
async def test_rendered_prompt_blocks_are_indexed_for_the_server(start_server: StartServer, mode: str,
                                                                 fmt: str, unused_tcp_port: int) -> None:
    indexer = Indexer()
    subs = KVEventSubscribers(indexer.on_message, retry_interval=0.05)
    try:
        if mode == "connect":  # discoverPods: vLLM binds, EPP connects and files events under the endpoint
            server = await start_server(kv_events_endpoint="tcp://127.0.0.1:0", kv_events_bind=True,
                                        kv_events_format=fmt)
            assert server.kv_publisher is not None
            subs.ensure("sim", server.kv_publisher.endpoint, owner=server.address)
        else:  # zmqEndpoint: EPP binds, vLLM connects, events are filed under the topic's endpoint id
            address = f"tcp://127.0.0.1:{unused_tcp_port}"
            subs.ensure("global", address, bind=True)
            server = await start_server(kv_events_endpoint=address, kv_events_format=fmt)
        await warm_up(server, indexer)

        body = {**CHAT, "model": server.cfg.model}
        rendered = await post(server, "/v1/chat/completions/render", body)
        ids = rendered["token_ids"]
        keys = indexer.processor.keys(ids, server.cfg.model)
        assert len(keys) == len(ids) // BLOCK >= 2
        assert longest_prefix(indexer.index.lookup(keys))[1] == {}

        await post(server, "/v1/chat/completions", body)
        counts = await indexed(indexer, keys, server.address)
        assert counts == {server.address: len(keys)}
        assert indexer.index.pods() == [server.address]
    finally:
        await subs.close()
