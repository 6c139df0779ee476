"""vLLM KV-event payloads: decoding both wire forms, and applying events to the index."""

from __future__ import annotations

import hashlib
from typing import Any

import msgpack
import pytest

from epp.kvcache import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventDecodeError,
    KVBlockIndex,
    PodEntry,
    TokenProcessor,
    apply_events,
    decode_batch,
    longest_prefix,
    parse_topic,
)
from epp.kvcache.events import hash_int
from epp_sim.kvevents import encode_batch

MODEL = "sim-model"
POD, OTHER = "10.0.0.1:8000", "10.0.0.2:8000"
BLOCK = 16


def ids(n: int, start: int = 0) -> list[int]:
    return list(range(start, start + n))


def pack(body: Any) -> bytes:
    return msgpack.packb(body, use_bin_type=True)


def stored(hashes: list[Any], parent: Any, token_ids: list[int], *, medium: str | None = "GPU",
           lora: str | None = None, **extra: Any) -> dict[str, Any]:
    """A BlockStored as current vLLM's msgspec encodes it: a map, tag under "type", defaulted fields omitted."""
    return {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent, "token_ids": token_ids,
            "block_size": BLOCK, "lora_id": None, "medium": medium, "lora_name": lora, **extra}


def removed(hashes: list[Any], *, medium: str | None = "GPU", **extra: Any) -> dict[str, Any]:
    return {"type": "BlockRemoved", "block_hashes": hashes, "medium": medium, **extra}


def batch(*events: Any) -> bytes:
    return pack({"ts": 1.0, "events": list(events)})


class Setup:
    """An index, the processor keys are computed with, and a helper applying payloads for an endpoint."""

    def __init__(self, block: int = BLOCK) -> None:
        self.index = KVBlockIndex()
        self.tp = TokenProcessor(block)

    def apply(self, payload: bytes, pod: str = POD, model: str = MODEL) -> None:
        apply_events(self.index, self.tp, pod, model, decode_batch(payload))

    def held(self, token_ids: list[int], model: str = MODEL, pod: str = POD) -> int:
        """How many blocks of ``token_ids`` ``pod`` holds from the first."""
        return longest_prefix(self.index.lookup(self.tp.keys(token_ids, model)))[1].get(pod, 0)


# ---------------------------------------------------------------- decoding


SIM_EVENTS = [("stored", [1, 2**64 - 1], None, ids(32), "sql"), ("stored", [3], 2**64 - 1, ids(16, 32), None),
              ("removed", [7]), ("cleared",)]
DECODED = [BlockStored([1, 2**64 - 1], None, ids(32), "gpu", "sql", BLOCK),
           BlockStored([3], 2**64 - 1, ids(16, 32), "gpu", None, BLOCK),
           BlockRemoved([7], "gpu"), AllBlocksCleared()]


@pytest.mark.parametrize("fmt", ["map", "array"])
def test_decodes_what_the_simulator_publishes(fmt: str) -> None:
    payload = encode_batch(SIM_EVENTS, block_size=BLOCK, fmt=fmt, lora_ids={"sql": 1}, ts=2.5)
    assert decode_batch(payload) == DECODED


def test_decodes_vllm_map_events_with_bytes_hashes() -> None:
    digests = [hashlib.sha256(bytes([i])).digest() for i in range(3)]
    payload = pack({"ts": 1.0, "events": [
        stored(digests[1:], digests[0], ids(32)),
        removed([digests[2]], medium="CPU"),
        {"type": "AllBlocksCleared"},
    ]})  # data_parallel_rank omitted: msgspec's omit_defaults
    first, second, third = decode_batch(payload)
    last8 = [int.from_bytes(d[-8:], "big") for d in digests]
    assert first == BlockStored(last8[1:], last8[0], ids(32), "gpu", None, BLOCK)
    assert second == BlockRemoved([last8[2]], "cpu")
    assert third == AllBlocksCleared()


@pytest.mark.parametrize(("raw", "value"), [
    (5, 5), (-1, 2**64 - 1), (b"\x01\x02", 0x0102), (bytes(range(32)), int.from_bytes(bytes(range(24, 32)), "big")),
], ids=["int", "negative-int", "short-bytes", "sha256-bytes"])
def test_hash_int(raw: Any, value: int) -> None:
    assert hash_int(raw) == value


def test_decodes_old_array_events_with_trailing_defaults_omitted() -> None:
    payload = pack([1.0, [
        ["BlockStored", [11, 12], None, ids(32), BLOCK],
        ["BlockStored", [13], 12, ids(16, 32), BLOCK, 4, "CPU"],
        ["BlockRemoved", [11]],
        ["AllBlocksCleared"],
    ]])  # no data_parallel_rank either
    assert decode_batch(payload) == [
        BlockStored([11, 12], None, ids(32), "gpu", None, BLOCK),
        BlockStored([13], 12, ids(16, 32), "cpu", None, BLOCK),
        BlockRemoved([11], "gpu"),
        AllBlocksCleared(),
    ]


@pytest.mark.parametrize("form", ["map", "array"])
def test_decodes_hybrid_model_group_fields(form: str) -> None:
    if form == "map":
        events: list[Any] = [stored([1], None, ids(16), extra_keys=[None], group_idx=1,
                                    kv_cache_spec_kind="sliding_window", kv_cache_spec_sliding_window=128),
                             removed([1], group_idx=1)]
    else:
        events = [["BlockStored", [1], None, ids(16), BLOCK, None, "GPU", None, [None], 1, "sliding_window", 128],
                  ["BlockRemoved", [1], "GPU", 1]]
    first, second = decode_batch(pack([1.0, events, 0]))
    assert first == BlockStored([1], None, ids(16), "gpu", None, BLOCK, group=1, kind="sliding_window")
    assert not first.indexable
    assert second == BlockRemoved([1], "gpu", group=1)


def test_unknown_event_types_are_skipped() -> None:
    payload = batch({"type": "BlockMigrated", "block_hashes": [1]}, removed([2]), ["SomethingNew", 1, 2])
    assert decode_batch(payload) == [BlockRemoved([2], "gpu")]


@pytest.mark.parametrize("payload", [
    b"\xc1",  # a byte msgpack never uses
    pack({"ts": 1.0, "events": []})[:-1],  # truncated
    pack({"ts": 1.0, "events": []}) + b"\x00",  # trailing data
    pack(42),
    pack([1.0]),
    pack({"ts": 1.0}),
    pack({"ts": 1.0, "events": 5}),
    batch(5),
    batch([7, [1]]),
    batch({"block_hashes": [1]}),
    batch(removed("not-a-list")),
    batch(removed([1.5])),
    batch(removed([b""])),
    batch(removed([True])),
    batch(stored([1], None, ["a", "b"])),
    batch(stored([1], None, ids(16), group_idx=-1)),
], ids=["not-msgpack", "truncated", "trailing-bytes", "scalar", "short-array", "no-events", "events-not-array",
        "event-scalar", "array-tag-not-str", "map-without-type", "hashes-not-array", "float-hash", "empty-bytes-hash",
        "bool-hash", "str-tokens", "negative-group"])
def test_malformed_payloads_raise(payload: bytes) -> None:
    with pytest.raises(EventDecodeError):
        decode_batch(payload)


@pytest.mark.parametrize(("topic", "parsed"), [
    ("kv@10.0.0.1:8000@meta/llama", ("10.0.0.1:8000", "meta/llama")),
    ("kv@pod-a@", ("pod-a", "")),
    ("my-topic", ("my-topic", "")),
    ("kv@a@b@c", ("kv@a@b@c", "")),
], ids=["llm-d", "empty-model", "plain", "too-many-parts"])
def test_parse_topic(topic: str, parsed: tuple[str, str]) -> None:
    assert parse_topic(topic) == parsed


# ---------------------------------------------------------------- applying


@pytest.mark.parametrize("fmt", ["map", "array"])
def test_a_chain_continues_across_batches_through_its_parent(fmt: str) -> None:
    s = Setup()
    s.apply(encode_batch([("stored", [101, 102], None, ids(32), None)], block_size=BLOCK, fmt=fmt))
    s.apply(encode_batch([("stored", [103], 102, ids(16, 32), None)], block_size=BLOCK, fmt=fmt))
    assert s.held(ids(48)) == 3
    assert s.held(ids(50)) == 3
    assert s.index.request_key(103) == s.tp.keys(ids(48), MODEL)[2]


def test_an_unknown_parent_drops_the_event() -> None:
    s = Setup()
    s.apply(batch(stored([103], 999, ids(16, 32))))
    assert len(s.index) == 0
    assert s.index.request_key(103) is None


def test_block_removed_evicts_by_engine_key() -> None:
    s = Setup()
    s.apply(batch(stored([101, 102, 103], None, ids(48))))
    s.apply(batch(stored([101, 102, 103], None, ids(48))), pod=OTHER)
    s.apply(batch(removed([102])))
    assert s.held(ids(48)) == 1
    assert s.held(ids(48), pod=OTHER) == 3
    s.apply(batch(removed([999])))  # unknown: nothing to do
    assert s.held(ids(48), pod=OTHER) == 3


def test_block_removed_only_evicts_its_own_tier() -> None:
    s = Setup()
    s.apply(batch(stored([101], None, ids(16))))
    s.apply(batch(removed([101], medium="CPU")))
    assert s.held(ids(16)) == 1


def test_all_blocks_cleared_forgets_only_that_endpoint() -> None:
    s = Setup()
    s.apply(batch(stored([101, 102], None, ids(32))))
    s.apply(batch(stored([101, 102], None, ids(32))), pod=OTHER)
    s.apply(pack({"ts": 1.0, "events": [{"type": "AllBlocksCleared"}]}))
    assert s.held(ids(32)) == 0
    assert s.held(ids(32), pod=OTHER) == 2
    assert s.index.pods() == [OTHER]


@pytest.mark.parametrize("fmt", ["map", "array"])
def test_the_lora_name_roots_the_chain(fmt: str) -> None:
    s = Setup()
    s.apply(encode_batch([("stored", [101, 102], None, ids(32), "sql-lora")], block_size=BLOCK, fmt=fmt,
                         lora_ids={"sql-lora": 1}))
    assert s.held(ids(32), model="sql-lora") == 2
    assert s.held(ids(32)) == 0
    s.apply(encode_batch([("stored", [103], 102, ids(16, 32), "sql-lora")], block_size=BLOCK, fmt=fmt,
                         lora_ids={"sql-lora": 1}))
    assert s.held(ids(48), model="sql-lora") == 3


def test_a_tokenless_block_stored_adds_a_tier() -> None:
    s = Setup()
    s.apply(batch(stored([101, 102], None, ids(32))))
    s.apply(batch(stored([101, 102, 555], None, [], medium="CPU")))  # offloaded; 555 was never indexed
    keys = s.tp.keys(ids(32), MODEL)
    assert s.index.lookup(keys) == [[PodEntry(POD, "gpu"), PodEntry(POD, "cpu")]] * 2
    assert len(s.index) == 2
    s.apply(batch(removed([101, 102])))  # gone from the GPU, still in CPU memory
    weighted, counts = longest_prefix(s.index.lookup(keys))
    assert counts == {POD: 2} and weighted == pytest.approx({POD: 1.6})


def test_block_ids_outside_uint32_drop_the_event() -> None:
    s = Setup()
    s.apply(batch(stored([101], None, [2**32] * BLOCK)))
    assert len(s.index) == 0


def test_larger_engine_blocks_map_one_to_many() -> None:
    """vLLM blocks of 64 tokens, EPP blocks of 16: removing one engine block evicts its four request keys."""
    s = Setup(block=16)
    s.apply(batch(stored([201], None, ids(64)), stored([202], 201, ids(64, 64))))
    assert s.held(ids(128)) == 8
    s.apply(batch(removed([202])))
    assert s.held(ids(128)) == 4


def test_a_tier_update_of_a_larger_engine_block_covers_its_whole_span() -> None:
    s = Setup(block=16)
    s.apply(batch(stored([201], None, ids(64))))
    s.apply(batch(stored([201], None, [], medium="CPU")))
    s.apply(batch(removed([201])))
    weighted, counts = longest_prefix(s.index.lookup(s.tp.keys(ids(64), MODEL)))
    assert counts == {POD: 4} and weighted == pytest.approx({POD: 3.2})


def test_smaller_engine_blocks_map_many_to_one() -> None:
    """vLLM blocks of 16 tokens, EPP blocks of 64: any of the four engine blocks' removal evicts the request key."""
    s = Setup(block=64)
    s.apply(batch(stored([1, 2, 3, 4, 5, 6, 7, 8], None, ids(128))))
    assert s.held(ids(128)) == 2
    s.apply(batch(stored([9, 10, 11, 12], 8, ids(64, 128))))
    assert s.held(ids(192)) == 3
    s.apply(batch(removed([6])))
    assert s.held(ids(192)) == 1


def test_hybrid_models_index_only_whole_prefix_groups() -> None:
    """A sliding-window group's stores are ignored and its removals leave the full-attention group's blocks."""
    s = Setup()
    full = {"group_idx": 0, "kv_cache_spec_kind": "full_attention"}
    window = {"group_idx": 1, "kv_cache_spec_kind": "sliding_window", "kv_cache_spec_sliding_window": 32}
    s.apply(batch(stored([101, 102, 103], None, ids(48), **full), stored([101, 102, 103], None, ids(48), **window)))
    s.apply(batch(stored([301], None, ids(16, 500), **window)))
    assert s.held(ids(48)) == 3
    assert s.held(ids(16, 500)) == 0
    s.apply(batch(removed([101, 102], group_idx=1)))  # the window slides past the first blocks
    assert s.held(ids(48)) == 3
    s.apply(batch(removed([102], group_idx=0)))
    assert s.held(ids(48)) == 1
