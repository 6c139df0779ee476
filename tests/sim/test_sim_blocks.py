"""Block manager: allocation, reference counts, prefix hits, LRU eviction, events."""

from __future__ import annotations

from array import array

from epp_sim.blocks import BlockManager
from epp_sim.engine import Seq


def _seq(tokens: list[int], lora: str | None = None) -> Seq:
    seq = Seq("r", array("I", tokens), 0.0)
    if lora:
        seq.lora = lora
        seq.extra_key = b"lora\0" + lora.encode()
    return seq


def test_allocate_rounds_up_and_free_returns_blocks() -> None:
    bm = BlockManager(8, 4)
    seq = _seq(list(range(10)))
    assert bm.allocate(seq, 10)
    assert len(seq.blocks) == 3
    assert bm.num_free == 5
    bm.free_seq(seq)
    assert bm.num_free == 8
    bm.check([])


def test_allocation_fails_without_side_effects() -> None:
    bm = BlockManager(2, 4)
    seq = _seq(list(range(12)))
    assert not bm.allocate(seq, 12)
    assert seq.blocks == [] and bm.num_free == 2


def test_prefix_hit_reuses_full_blocks_and_leaves_last_token() -> None:
    bm = BlockManager(16, 4)
    first = _seq(list(range(12)))
    assert bm.allocate(first, 12)
    bm.free_seq(first)
    same = _seq(list(range(12)))
    hits = bm.lookup(same)
    # At most num_tokens - 1 tokens may hit, so the last full block is recomputed.
    assert len(hits) == 2
    longer = _seq(list(range(12)) + [99, 98])
    assert len(bm.lookup(longer)) == 3


def test_different_prefix_or_lora_does_not_hit() -> None:
    bm = BlockManager(16, 4)
    base = _seq(list(range(9)))
    assert bm.allocate(base, 9)
    assert bm.lookup(_seq([7] + list(range(1, 9)))) == []
    assert bm.lookup(_seq(list(range(9)), lora="a")) == []
    assert len(bm.lookup(_seq(list(range(9))))) == 2


def test_shared_blocks_are_reference_counted() -> None:
    bm = BlockManager(16, 4)
    a = _seq(list(range(9)))
    assert bm.allocate(a, 9)
    b = _seq(list(range(9)))
    hits = bm.lookup(b)
    assert bm.allocate(b, 9, hits)
    assert b.blocks[:2] == a.blocks[:2]
    assert [bm.ref[x] for x in a.blocks[:2]] == [2, 2]
    bm.check([a, b])
    bm.free_seq(a)
    bm.check([b])


def test_lru_evicts_least_recently_freed_and_tail_first() -> None:
    bm = BlockManager(4, 2, record_events=True)
    old = _seq([1, 2, 3, 4])
    assert bm.allocate(old, 4)
    bm.free_seq(old)
    new = _seq([5, 6, 7, 8])
    assert bm.allocate(new, 4)
    bm.free_seq(new)
    # One block is needed: the least recently freed sequence loses its tail block first.
    third = _seq([9, 10])
    assert bm.allocate(third, 2)
    assert len(bm.lookup(_seq([1, 2, 3, 4, 0]))) == 1
    assert len(bm.lookup(_seq([5, 6, 7, 8, 0]))) == 2
    removed = [e for e in bm.events if e[0] == "removed"]
    assert len(removed) == 1


def test_events_describe_stored_blocks() -> None:
    bm = BlockManager(8, 2, record_events=True)
    seq = _seq([1, 2, 3, 4, 5])
    assert bm.allocate(seq, 5)
    [(kind, hashes, parent, tokens, lora)] = bm.events
    assert kind == "stored" and parent is None and lora is None
    assert hashes == seq.block_hashes[:2]
    assert tokens == [1, 2, 3, 4]
    assert all(0 <= h < 2**64 for h in hashes)


def test_reset_prefix_cache_only_when_idle() -> None:
    bm = BlockManager(8, 2, record_events=True)
    seq = _seq([1, 2, 3, 4])
    assert bm.allocate(seq, 4)
    assert not bm.reset_prefix_cache()
    bm.free_seq(seq)
    assert bm.reset_prefix_cache()
    assert bm.events[-1] == ("cleared",)
    assert bm.lookup(_seq([1, 2, 3, 4, 5])) == []
