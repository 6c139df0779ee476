"""vLLM's KV-cache events, decoded and applied to a :class:`~epp.kvcache.index.KVBlockIndex`.

Wire format (``vllm/distributed/kv_events.py``): a ZMQ PUB message of three frames, ``[topic, seq (8 bytes big
endian), msgpack payload]``. The topic is ``kv@<endpoint id>@<model>`` by llm-d's convention; the payload is an
``EventBatch``. Current vLLM encodes the batch and its events as maps (``{"ts", "events", "data_parallel_rank"}``,
events tagged by ``"type"``); older vLLM (msgspec ``array_like``) as arrays (``[ts, events, rank]``, events
``["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium, lora_name, ...]``,
``["BlockRemoved", block_hashes, medium]``, ``["AllBlocksCleared"]``). Both are accepted, for the batch and for each
event, as llm-d's adapter does.

Block hashes are 64-bit integers (``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1``, the default) or raw bytes, of which
the last 8 are read big-endian, as llm-d reads them. ``medium`` is the device tier (``GPU``, ``CPU``, ...; lowered,
default ``gpu``).

Applying (llm-d-kv-cache ``pool.go``): ``BlockStored`` computes request keys from its ``token_ids`` in EPP's block
size, chained from the request key its ``parent_block_hash`` maps to (an unknown parent drops the event: its chain
cannot be placed) and rooted at ``lora_name`` when set, else the topic's model; a ``BlockStored`` without tokens
re-tiers blocks already known (offload). ``BlockRemoved`` evicts by engine key. ``AllBlocksCleared`` forgets the
endpoint's blocks (llm-d only logs it; vLLM sends it when the prefix cache is reset, after which every entry of that
endpoint is wrong).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Union

import msgpack

from .index import KVBlockIndex, PodEntry, TokenProcessor

__all__ = ["BlockStored", "BlockRemoved", "AllBlocksCleared", "KVEvent", "EventDecodeError", "decode_batch",
           "parse_topic", "apply_events", "hash_int"]

_STORED_FIELDS = ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name")
_REMOVED_FIELDS = ("block_hashes", "medium")


class EventDecodeError(ValueError):
    """A payload that is not a vLLM ``EventBatch``."""


@dataclass(frozen=True, slots=True)
class BlockStored:
    block_hashes: list[int]
    parent: int | None
    token_ids: list[int]
    tier: str
    lora_name: str | None
    block_size: int | None = None


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    block_hashes: list[int]
    tier: str


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    pass


KVEvent = Union[BlockStored, BlockRemoved, AllBlocksCleared]


def parse_topic(topic: str) -> tuple[str, str]:
    """``kv@<endpoint id>@<model>`` -> (endpoint id, model); any other topic -> (topic, "") as llm-d does."""
    parts = topic.split("@")
    if len(parts) == 3:
        return parts[1], parts[2]
    return topic, ""


def hash_int(raw: Any) -> int:
    """A block hash as an unsigned 64-bit int: ints as they are (negative ones wrapped), bytes by their last 8 bytes
    big-endian (shorter ones zero-padded on the left)."""
    if isinstance(raw, bool):
        raise EventDecodeError("a block hash is a boolean")
    if isinstance(raw, int):
        return raw & 0xFFFF_FFFF_FFFF_FFFF
    if isinstance(raw, (bytes, bytearray)):
        if not raw:
            raise EventDecodeError("a block hash is empty")
        return int.from_bytes(bytes(raw[-8:]), "big")
    raise EventDecodeError(f"unsupported block hash type {type(raw).__name__}")


def decode_batch(payload: bytes) -> list[KVEvent]:
    """The events of one msgpack ``EventBatch`` (map or array form); unknown event types are skipped.

    Raises :class:`EventDecodeError` for anything else."""
    try:
        batch = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except (ValueError, msgpack.UnpackException) as exc:
        raise EventDecodeError(f"not msgpack: {exc}") from exc
    if isinstance(batch, dict):
        events = batch.get("events")
    elif isinstance(batch, (list, tuple)) and len(batch) >= 2:
        events = batch[1]
    else:
        raise EventDecodeError("an EventBatch is a map or an array of at least 2 items")
    if not isinstance(events, (list, tuple)):
        raise EventDecodeError("EventBatch.events is not an array")
    out: list[KVEvent] = []
    for raw in events:
        event = _decode_event(raw)
        if event is not None:
            out.append(event)
    return out


def _decode_event(raw: Any) -> KVEvent | None:
    if isinstance(raw, dict):
        tag = raw.get("type")
        fields = raw
    elif isinstance(raw, (list, tuple)) and raw and isinstance(raw[0], str):
        tag = raw[0]
        names = _STORED_FIELDS if tag == "BlockStored" else _REMOVED_FIELDS if tag == "BlockRemoved" else ()
        fields = dict(zip(names, raw[1:]))
    else:
        raise EventDecodeError("an event is a map with a 'type' or an array starting with its tag")
    if tag == "BlockStored":
        tokens = fields.get("token_ids") or []
        if not isinstance(tokens, (list, tuple)) or not all(isinstance(t, int) for t in tokens):
            raise EventDecodeError("BlockStored.token_ids is not an array of integers")
        parent = fields.get("parent_block_hash")
        lora = fields.get("lora_name")
        size = fields.get("block_size")
        return BlockStored(_hashes(fields), None if parent is None else hash_int(parent), list(tokens),
                           _tier(fields), lora if isinstance(lora, str) and lora else None,
                           size if isinstance(size, int) and not isinstance(size, bool) else None)
    if tag == "BlockRemoved":
        return BlockRemoved(_hashes(fields), _tier(fields))
    if tag == "AllBlocksCleared":
        return AllBlocksCleared()
    return None


def _hashes(fields: dict[str, Any]) -> list[int]:
    raw = fields.get("block_hashes") or []
    if not isinstance(raw, (list, tuple)):
        raise EventDecodeError("block_hashes is not an array")
    return [hash_int(h) for h in raw]


def _tier(fields: dict[str, Any]) -> str:
    medium = fields.get("medium")
    return medium.lower() if isinstance(medium, str) and medium else "gpu"


def apply_events(index: KVBlockIndex, processor: TokenProcessor, pod: str, model: str,
                 events: list[KVEvent]) -> None:
    """Apply one batch's events, in order, for endpoint id ``pod`` serving ``model`` (see the module doc)."""
    for event in events:
        if isinstance(event, BlockStored):
            _stored(index, processor, pod, model, event)
        elif isinstance(event, BlockRemoved):
            entries = (PodEntry(pod, event.tier),)
            for h in event.block_hashes:
                index.evict(h, entries, engine=True)
        else:
            index.remove_pod(pod)


def _stored(index: KVBlockIndex, processor: TokenProcessor, pod: str, model: str, event: BlockStored) -> None:
    entry = PodEntry(pod, event.tier)
    if not event.token_ids:  # an offload/tier update: blocks already indexed, now (also) on another tier
        known = [rk for rk in (index.request_key(h) for h in event.block_hashes) if rk is not None]
        if known:
            index.add(list(dict.fromkeys(known)), (entry,))
        return
    parent = None
    if event.parent is not None:
        parent = index.request_key(event.parent)
        if parent is None:
            return  # the chain it continues is unknown (evicted, or stored before EPP subscribed)
    try:
        keys = processor.keys(event.token_ids, event.lora_name or model, parent)
    except OverflowError:
        return
    if keys:
        index.add(keys, (entry,), event.block_hashes)
