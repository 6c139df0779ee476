"""KV events over ZMQ, decoded by a subscriber the way llm-d's kv-cache indexer reads them."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import msgpack
import zmq
import zmq.asyncio

from epp_sim import ByteTokenizer, SimServer, decode_batch, encode_batch

from .kv_subscriber import Subscriber

StartServer = Callable[..., Awaitable[SimServer]]


async def _complete(server: SimServer, prompt: str, max_tokens: int = 1) -> Any:
    async with aiohttp.ClientSession() as session:
        body = {"prompt": prompt, "max_tokens": max_tokens}
        async with session.post(server.url + "/v1/completions", json=body) as resp:
            return await resp.json()


async def _receive(sock: Any, timeout: float = 0.2) -> list[list[bytes]]:
    out = []
    while await sock.poll(timeout * 1000):
        out.append(await sock.recv_multipart())
        timeout = 0.05
    return out


async def _connect(server: SimServer, sock: Any) -> list[list[bytes]]:
    """Send throw-away requests until the PUB/SUB connection is up (ZMQ slow joiner)."""
    for i in range(50):
        await _complete(server, f"warm-up {i} " * 8)
        frames = await _receive(sock)
        if frames:
            return frames
    raise AssertionError("no KV events arrived")


async def test_events_name_the_blocks_the_server_caches(
    start_server: StartServer, subscriber: Subscriber
) -> None:
    server = await start_server(kv_events_endpoint=subscriber.endpoint)
    await _connect(server, subscriber.sock)
    prompt = "precise prefix routing needs the same tokens " * 8  # 360 bytes = 90 tokens
    await _complete(server, prompt)
    frames = await _receive(subscriber.sock)
    again = await _complete(server, prompt)

    stored: dict[int, dict[str, Any]] = {}
    for topic, seq, payload in frames:
        assert topic == f"kv@127.0.0.1:{server.port}@sim-model".encode()
        assert len(seq) == 8
        _, events, rank = decode_batch(payload)
        assert rank == 0
        for ev in events:
            if ev["type"] == "BlockStored":
                assert ev["block_size"] == 16 and ev["medium"] == "GPU"
                stored[ev["block_hashes"][0]] = ev
    seqs = [int.from_bytes(f[1], "big") for f in frames]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))

    # Follow the chain from the root: the stored token ids are the prompt's tokens.
    tokens = ByteTokenizer().encode(prompt).tolist()
    [first] = [ev for ev in stored.values() if ev["parent_block_hash"] is None
               and ev["token_ids"] == tokens[: len(ev["token_ids"])]]
    chain = first["block_hashes"]
    assert first["token_ids"] == tokens[: 16 * len(chain)]
    assert len(chain) == 90 // 16
    cached = again["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached == 16 * len(chain)
    assert set(chain) <= set(server.engine.bm.cached)


async def test_eviction_and_reset_publish_removed_and_cleared(
    start_server: StartServer, subscriber: Subscriber
) -> None:
    server = await start_server(kv_events_endpoint=subscriber.endpoint, num_gpu_blocks=8,
                                kv_events_format="array")
    await _connect(server, subscriber.sock)
    for i in range(4):
        await _complete(server, f"{i} fills the tiny cache " * 6)
    async with aiohttp.ClientSession() as session:
        async with session.post(server.url + "/reset_prefix_cache") as resp:
            assert (await resp.json())["success"] is True
    kinds = []
    for _, _, payload in await _receive(subscriber.sock):
        body = msgpack.unpackb(payload)
        assert isinstance(body, list) and all(isinstance(e, list) for e in body[1])
        kinds += [e[0] for e in body[1]]
    assert "BlockStored" in kinds and "BlockRemoved" in kinds
    assert kinds[-1] == "AllBlocksCleared"


def test_both_encodings_decode_to_the_same_events() -> None:
    events = [("stored", [1, 2**64 - 1], None, list(range(32)), "sql", [("sql", "salt"), ("sql",)]),
              ("removed", [7]), ("cleared",)]
    as_map = decode_batch(encode_batch(events, block_size=16, lora_ids={"sql": 3}, ts=1.5))
    as_array = decode_batch(
        encode_batch(events, block_size=16, fmt="array", lora_ids={"sql": 3}, ts=1.5)
    )
    assert as_map == as_array
    ts, decoded, rank = as_map
    assert ts == 1.5 and rank == 0
    assert decoded[0] == {
        "type": "BlockStored", "block_hashes": [1, 2**64 - 1], "parent_block_hash": None,
        "token_ids": list(range(32)), "block_size": 16, "lora_id": 3, "medium": "GPU",
        "lora_name": "sql", "extra_keys": [["sql", "salt"], ["sql"]],
    }
    assert decoded[1] == {"type": "BlockRemoved", "block_hashes": [7], "medium": "GPU"}
    assert decoded[2] == {"type": "AllBlocksCleared"}


async def test_publisher_binds_for_wildcard_endpoints(start_server: StartServer) -> None:
    server = await start_server(kv_events_endpoint="tcp://127.0.0.1:0", kv_events_bind=True)
    assert server.kv_publisher is not None
    assert server.kv_publisher.endpoint.startswith("tcp://127.0.0.1:")
    ctx = zmq.asyncio.Context()
    sock = ctx.socket(zmq.SUB)
    sock.setsockopt(zmq.SUBSCRIBE, b"")
    sock.connect(server.kv_publisher.endpoint)
    try:
        frames = await _connect(server, sock)
        assert frames[0][0].startswith(b"kv@")
    finally:
        sock.close(linger=0)
        ctx.term()
    await asyncio.sleep(0)
