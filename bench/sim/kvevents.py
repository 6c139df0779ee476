"""KV-cache events as vLLM publishes them.

Each engine step that changed the prefix cache sends one ZMQ PUB message of three frames:
the topic (`kv@<host:port>@<model>` by default), an 8-byte big-endian sequence number
counting from 0, and a msgpack `EventBatch`, in vLLM's "map" (current) or "array" (older,
msgspec `array_like`) encoding. Block hashes are unsigned 64-bit integers; `extra_keys`
has one entry per stored block, as vLLM's.
"""

from __future__ import annotations

import time
from typing import Any

import msgpack
import zmq

__all__ = ["KVEventPublisher", "decode_batch", "encode_batch"]

MEDIUM = "GPU"


def _extra_keys(ev: tuple[Any, ...]) -> list[Any]:
    """A stored event's per-block `extra_keys` (all None when the block manager gave none)."""
    return list(ev[5]) if len(ev) > 5 else [None] * len(ev[1])


def _map_event(ev: tuple[Any, ...], block_size: int, lora_ids: dict[str, int]) -> dict[str, Any]:
    kind = ev[0]
    if kind == "stored":
        hashes, parent, tokens, lora = ev[1:5]
        return {
            "type": "BlockStored",
            "block_hashes": hashes,
            "parent_block_hash": parent,
            "token_ids": tokens,
            "block_size": block_size,
            "lora_id": lora_ids.get(lora) if lora else None,
            "medium": MEDIUM,
            "lora_name": lora,
            "extra_keys": _extra_keys(ev),
        }
    if kind == "removed":
        return {"type": "BlockRemoved", "block_hashes": ev[1], "medium": MEDIUM}
    return {"type": "AllBlocksCleared"}


def _array_event(ev: tuple[Any, ...], block_size: int, lora_ids: dict[str, int]) -> list[Any]:
    kind = ev[0]
    if kind == "stored":
        hashes, parent, tokens, lora = ev[1:5]
        lora_id = lora_ids.get(lora) if lora else None
        return ["BlockStored", hashes, parent, tokens, block_size, lora_id, MEDIUM, lora, _extra_keys(ev)]
    if kind == "removed":
        return ["BlockRemoved", ev[1], MEDIUM]
    return ["AllBlocksCleared"]


def encode_batch(
    events: list[tuple[Any, ...]],
    *,
    block_size: int,
    fmt: str = "map",
    lora_ids: dict[str, int] | None = None,
    ts: float | None = None,
    dp_rank: int = 0,
) -> bytes:
    """msgpack payload of one EventBatch from block-manager event tuples."""
    ts = time.time() if ts is None else ts
    lora_ids = lora_ids or {}
    if fmt == "array":
        body: Any = [ts, [_array_event(e, block_size, lora_ids) for e in events], dp_rank]
    else:
        body = {
            "ts": ts,
            "events": [_map_event(e, block_size, lora_ids) for e in events],
            "data_parallel_rank": dp_rank,
        }
    return msgpack.packb(body, use_bin_type=True)


_FIELDS = {
    "BlockStored": ("block_hashes", "parent_block_hash", "token_ids", "block_size",
                    "lora_id", "medium", "lora_name", "extra_keys"),
    "BlockRemoved": ("block_hashes", "medium"),
    "AllBlocksCleared": (),
}


def decode_batch(payload: bytes) -> tuple[float, list[dict[str, Any]], int | None]:
    """Decode either encoding into (ts, events as dicts with "type", data_parallel_rank)."""
    body = msgpack.unpackb(payload, raw=False)
    if isinstance(body, dict):
        ts, raw, rank = body["ts"], body["events"], body.get("data_parallel_rank")
    else:
        ts, raw = body[0], body[1]
        rank = body[2] if len(body) > 2 else None
    events = []
    for ev in raw:
        if isinstance(ev, dict):
            events.append(ev)
        else:
            fields = _FIELDS.get(ev[0], ())
            events.append({"type": ev[0], **dict(zip(fields, ev[1:]))})
    return ts, events, rank


def _should_bind(endpoint: str) -> bool:
    # vLLM binds for wildcard and local transports and connects otherwise.
    return endpoint.startswith(("ipc://", "inproc://")) or "*" in endpoint or "::" in endpoint


class KVEventPublisher:
    """A ZMQ PUB socket that sends one 3-frame message per EventBatch; never blocks."""

    def __init__(
        self,
        endpoint: str,
        topic: str,
        *,
        block_size: int,
        fmt: str = "map",
        bind: bool | None = None,
    ) -> None:
        self.topic = topic.encode()
        self.block_size = block_size
        self.fmt = fmt
        self.seq = 0
        self._sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.PUB)
        self._sock.setsockopt(zmq.SNDHWM, 100_000)
        self._sock.setsockopt(zmq.LINGER, 0)
        if _should_bind(endpoint) if bind is None else bind:
            self._sock.bind(endpoint)
            self.endpoint: str = self._sock.getsockopt_string(zmq.LAST_ENDPOINT)
        else:
            self._sock.connect(endpoint)
            self.endpoint = endpoint

    def publish(self, events: list[tuple[Any, ...]], lora_ids: dict[str, int]) -> None:
        payload = encode_batch(events, block_size=self.block_size, fmt=self.fmt, lora_ids=lora_ids)
        try:
            self._sock.send_multipart(
                [self.topic, self.seq.to_bytes(8, "big"), payload], flags=zmq.NOBLOCK
            )
        except zmq.Again:
            pass  # a PUB socket drops at the high-water mark; so do we
        self.seq += 1

    def close(self) -> None:
        self._sock.close(linger=0)
