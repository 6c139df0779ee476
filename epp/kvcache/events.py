"""vLLM's KV-cache events, decoded and applied to a :class:`~epp.kvcache.index.KVBlockIndex`.

A ZMQ PUB message is ``[topic, seq, msgpack EventBatch]`` with topic ``kv@<endpoint id>@<model>``; both of vLLM's
encodings (maps, and the older msgspec arrays) are accepted, for the batch and for each event, and an event with an
unknown tag is skipped. ``BlockStored`` computes request keys from its ``token_ids`` in EPP's block size, chained
from its parent's key (an unknown parent drops the event) and folding in each block's ``extra_keys``
(:mod:`.extra`); ``BlockRemoved`` evicts by engine key; ``AllBlocksCleared`` forgets the endpoint's blocks. Only
KV-cache groups whose kind holds the whole prefix (full attention) are indexed. Wire and mapping details:
docs/reference-parity.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Union

import msgpack

from epp.kvcache.extra import BlockExtras, parse_extra_keys, realign
from epp.kvcache.index import KVBlockIndex, PodEntry, TokenProcessor

__all__ = ["BlockStored", "BlockRemoved", "AllBlocksCleared", "KVEvent", "EventDecodeError", "decode_batch",
           "parse_topic", "apply_events", "hash_int", "PREFIX_KINDS"]

_STORED_FIELDS = ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name",
                  "extra_keys", "group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window")
_REMOVED_FIELDS = ("block_hashes", "medium", "group_idx")
PREFIX_KINDS = frozenset({"full_attention", "mla_attention", "sink_full_attention"})
"""KV-cache group kinds whose blocks hold the whole prefix (llm-d's ``isPrefixIndexableSpecKind``)."""


class EventDecodeError(ValueError):
    """A payload that is not a vLLM ``EventBatch``."""


@dataclass(frozen=True, slots=True)
class BlockStored:
    """Blocks entered the prefix cache: engine hashes, the engine hash of the block before the first (None at the
    start of a sequence), the blocks' token ids, tier (lowered ``medium``), LoRA adapter, engine block size, the
    KV-cache group and its kind (hybrid models; None otherwise), and per engine block its extra keys (None when no
    block has any; see :func:`~epp.kvcache.extra.parse_extra_keys`)."""

    block_hashes: list[int]
    parent: int | None
    token_ids: list[int]
    tier: str
    lora_name: str | None
    block_size: int | None = None
    group: int | None = None
    kind: str | None = None
    extra_keys: list[BlockExtras | None] | None = None

    @property
    def indexable(self) -> bool:
        """Whether the blocks tell which prefix is cached: engines without groups, or a whole-prefix group kind."""
        return self.group is None or self.kind in PREFIX_KINDS


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    """Blocks left the prefix cache (of ``tier``, and of KV-cache group ``group`` when the engine reports one)."""

    block_hashes: list[int]
    tier: str
    group: int | None = None


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
        if not isinstance(tag, str):
            raise EventDecodeError("a map event has no string 'type'")
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
        lora = lora if isinstance(lora, str) and lora else None
        kind = fields.get("kv_cache_spec_kind")
        try:
            extras = parse_extra_keys(fields.get("extra_keys"), lora)
        except ValueError as exc:
            raise EventDecodeError(str(exc)) from exc
        return BlockStored(_hashes(fields), None if parent is None else hash_int(parent), list(tokens),
                           _tier(fields), lora, _int_or_none(fields.get("block_size")), _group(fields),
                           kind if isinstance(kind, str) and kind else None, extras)
    if tag == "BlockRemoved":
        return BlockRemoved(_hashes(fields), _tier(fields), _group(fields))
    if tag == "AllBlocksCleared":
        return AllBlocksCleared()
    return None


def _hashes(fields: dict[str, Any]) -> list[int]:
    raw = fields.get("block_hashes") or []
    if not isinstance(raw, (list, tuple)):
        raise EventDecodeError("block_hashes is not an array")
    return [hash_int(h) for h in raw]


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _group(fields: dict[str, Any]) -> int | None:
    raw = fields.get("group_idx")
    group = _int_or_none(raw)
    if raw is not None and (group is None or group < 0):
        raise EventDecodeError(f"group_idx is not a non-negative integer: {raw!r}")
    return group


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
            entries = (PodEntry(pod, event.tier, group=event.group),)
            for h in event.block_hashes:
                index.evict(h, entries, engine=True)
        else:
            index.remove_pod(pod)


def _stored(index: KVBlockIndex, processor: TokenProcessor, pod: str, model: str, event: BlockStored) -> None:
    if not event.indexable:
        return  # a sliding-window/Mamba group: its blocks do not make a reusable prefix
    entry = PodEntry(pod, event.tier, group=event.group)
    if not event.token_ids:  # an offload/tier update: blocks already indexed, now (also) on another tier
        known = [rk for h in event.block_hashes for rk in index.request_keys(h)]
        if known:
            index.add(list(dict.fromkeys(known)), (entry,))
        return
    parent = None
    if event.parent is not None:
        parent = index.request_key(event.parent)
        if parent is None:
            return  # the chain it continues is unknown (evicted, or stored before EPP subscribed)
    extras = realign(event.extra_keys, len(event.token_ids) // processor.block_size)
    try:
        keys = processor.keys(event.token_ids, event.lora_name or model, parent, extras=extras)
    except OverflowError:
        return
    if keys:
        index.add(keys, (entry,), event.block_hashes)
