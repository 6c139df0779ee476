"""The KV-block index: request keys, engine-key mapping, LRU bounds, per-endpoint bookkeeping, longest prefix."""

from __future__ import annotations

import pytest

from epp.kvcache import DEFAULT_TIER_WEIGHTS, KVBlockIndex, PodEntry, TokenProcessor, longest_prefix

MODEL = "meta/llama"
A, B, C = "10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"


def tokens(n: int, start: int = 0) -> list[int]:
    return list(range(start, start + n))


def keys(n_blocks: int, block: int = 4) -> list[int]:
    return TokenProcessor(block).keys(tokens(n_blocks * block), MODEL)


def held_by(index: KVBlockIndex, request_keys: list[int]) -> list[set[str]]:
    """Per key found (from the first, up to the first nobody holds): the endpoints holding it."""
    return [{e.pod for e in holders} for holders in index.lookup(request_keys)]


# ---------------------------------------------------------------- TokenProcessor


@pytest.mark.parametrize("split", [4, 8, 12, 16], ids=lambda s: f"at-{s}")
def test_keys_chain_the_same_split_or_whole(split: int) -> None:
    tp = TokenProcessor(4)
    ids = tokens(20)
    head = tp.keys(ids[:split], MODEL)
    tail = tp.keys(ids[split:], MODEL, parent=head[-1])
    assert head + tail == tp.keys(ids, MODEL)
    assert len(set(head + tail)) == 5


def test_a_partial_block_gets_no_key() -> None:
    tp = TokenProcessor(4)
    assert tp.keys(tokens(3), MODEL) == []
    assert tp.keys(tokens(11), MODEL) == tp.keys(tokens(8), MODEL)
    assert len(tp.keys(tokens(11), MODEL)) == 2
    assert tp.keys(tokens(16), MODEL, limit=2) == tp.keys(tokens(8), MODEL)


@pytest.mark.parametrize(("processor", "model"), [
    (TokenProcessor(4), "sql-lora"),
    (TokenProcessor(4, hash_seed="42"), MODEL),
    (TokenProcessor(4, hash_seed="43"), MODEL),
], ids=["lora-name", "seed-42", "seed-43"])
def test_model_lora_and_seed_change_every_key(processor: TokenProcessor, model: str) -> None:
    base = TokenProcessor(4).keys(tokens(16), MODEL)
    other = processor.keys(tokens(16), model)
    assert len(other) == 4 and not set(base) & set(other)
    assert processor.root(model) != TokenProcessor(4).root(MODEL)


def test_a_changed_block_changes_its_key_and_every_later_one() -> None:
    tp = TokenProcessor(4)
    ids = tokens(16)
    changed = ids[:5] + [999] + ids[6:]
    base, other = tp.keys(ids, MODEL), tp.keys(changed, MODEL)
    assert base[0] == other[0]
    assert all(b != o for b, o in zip(base[1:], other[1:]))


@pytest.mark.parametrize("bad", [-1, 2**32], ids=["negative", "over-uint32"])
def test_token_ids_outside_uint32_raise_overflow(bad: int) -> None:
    with pytest.raises(OverflowError):
        TokenProcessor(4).keys([1, 2, bad, 3], MODEL)


def test_block_size_must_be_positive() -> None:
    with pytest.raises(ValueError, match="blockSize"):
        TokenProcessor(0)


# ---------------------------------------------------------------- add / lookup / evict


def test_lookup_stops_at_the_first_key_nobody_holds() -> None:
    index = KVBlockIndex()
    k = keys(5)
    index.add(k[:3], [PodEntry(A)])
    index.add(k[4:], [PodEntry(A)])
    assert held_by(index, k) == [{A}, {A}, {A}]
    assert index.lookup([k[3], k[4]]) == []
    assert len(index) == 4


def test_lookup_filters_endpoints_but_follows_the_chain() -> None:
    index = KVBlockIndex()
    k = keys(3)
    index.add(k, [PodEntry(A)])
    index.add(k[:1], [PodEntry(B)])
    per_key = index.lookup(k, {B})
    assert per_key == [[PodEntry(B)], [], []]
    assert longest_prefix(per_key) == ({B: 1.0}, {B: 1})


def test_evict_a_request_key_drops_it_when_nobody_is_left() -> None:
    index = KVBlockIndex()
    k = keys(2)
    index.add(k, [PodEntry(A), PodEntry(B)])
    index.evict(k[1], [PodEntry(A)], engine=False)
    assert held_by(index, k) == [{A, B}, {B}]
    index.evict(k[1], [PodEntry(B)], engine=False)
    assert held_by(index, k) == [{A, B}]
    assert len(index) == 1
    index.evict(k[1], [PodEntry(B)], engine=False)  # already gone: no-op
    assert index.stats.evictions == 2


def test_eviction_is_per_tier_and_group() -> None:
    index = KVBlockIndex()
    k = keys(1)
    index.add(k, [PodEntry(A, "gpu"), PodEntry(A, "cpu"), PodEntry(A, "gpu", group=1)])
    index.evict(k[0], [PodEntry(A, "gpu")], engine=False)
    index.evict(k[0], [PodEntry(A, "gpu", group=1)], engine=False)
    assert index.lookup(k) == [[PodEntry(A, "cpu")]]
    assert index.pods() == [A]


# ---------------------------------------------------------------- engine keys


def test_engine_keys_one_to_one() -> None:
    index = KVBlockIndex()
    k = keys(4)
    engine = [101, 102, 103, 104]
    index.add(k, [PodEntry(A)], engine)
    assert [index.request_key(e) for e in engine] == k
    index.evict(103, [PodEntry(A)], engine=True)
    assert held_by(index, k) == [{A}, {A}]
    assert index.request_key(103) is None  # nothing left under it
    assert index.request_key(104) == k[3]


def test_engine_keys_many_to_one() -> None:
    """Engine blocks of 16 tokens under EPP blocks of 64: four engine keys name one request key."""
    tp = TokenProcessor(64)
    k = tp.keys(tokens(64), MODEL)
    index = KVBlockIndex()
    index.add(k, [PodEntry(A)], [101, 102, 103, 104])
    assert {index.request_key(e) for e in (101, 102, 103, 104)} == {k[0]}
    index.evict(104, [PodEntry(A)], engine=True)
    assert index.lookup(k) == []
    assert index.request_key(104) is None


def test_engine_keys_one_to_many() -> None:
    """Engine blocks of 64 tokens under EPP blocks of 16: one engine key spans four request keys; removing it
    evicts all four, and a chain stored after it continues from the last."""
    tp = TokenProcessor(16)
    ids = tokens(128)
    k = tp.keys(ids, MODEL)
    index = KVBlockIndex()
    index.add(k[:4], [PodEntry(A)], [201])
    assert index.request_key(201) == k[3]
    assert index.request_keys(201) == tuple(k[:4])
    index.add(tp.keys(ids[64:], MODEL, parent=index.request_key(201)), [PodEntry(A)], [202])
    assert held_by(index, k) == [{A}] * 8
    index.evict(201, [PodEntry(A)], engine=True)
    assert index.lookup(k) == []
    assert held_by(index, k[4:]) == [{A}] * 4
    assert index.request_key(201) is None


def test_engine_keys_uneven_ratio_cover_every_request_key() -> None:
    k = keys(3)
    index = KVBlockIndex()
    index.add(k, [PodEntry(A)], [301, 302])
    index.evict(301, [PodEntry(A)], engine=True)
    index.evict(302, [PodEntry(A)], engine=True)
    assert len(index) == 0


def test_engine_key_stays_mapped_while_another_endpoint_holds_the_block() -> None:
    k = keys(1)
    index = KVBlockIndex()
    index.add(k, [PodEntry(A)], [401])
    index.add(k, [PodEntry(B)], [401])
    index.evict(401, [PodEntry(A)], engine=True)
    assert held_by(index, k) == [{B}]
    assert index.request_key(401) == k[0]


def test_speculative_entries_map_no_engine_keys() -> None:
    k = keys(2)
    index = KVBlockIndex()
    index.add(k, [PodEntry(A, speculative=True)])
    assert held_by(index, k) == [{A}, {A}]
    index.evict(k[0], [PodEntry(A, speculative=True)], engine=False)
    assert index.lookup(k) == []


# ---------------------------------------------------------------- LRU bounds


def test_pod_cache_size_keeps_the_most_recent_holders() -> None:
    k = keys(1)
    index = KVBlockIndex(pod_cache_size=2)
    index.add(k, [PodEntry(A)])
    index.add(k, [PodEntry(B)])
    index.add(k, [PodEntry(A)])  # A is now the most recent
    index.add(k, [PodEntry(C)])
    assert held_by(index, k) == [{A, C}]
    assert sorted(index.pods()) == [A, C]
    assert index.remove_pod(B) == 0
    assert index.stats.admissions == 3 and index.stats.evictions == 1


def test_size_lru_evicts_the_oldest_key_and_its_endpoints() -> None:
    k = keys(5)
    index = KVBlockIndex(size=3)
    index.add(k[0:2], [PodEntry(A)])
    index.add(k[2:3], [PodEntry(B)])
    index.add(k[0:1], [PodEntry(A)])  # k0 becomes the most recent key; k1 the oldest
    index.add(k[3:4], [PodEntry(C)])
    assert len(index) == 3
    assert index.lookup(k[1:2]) == []
    assert held_by(index, k[0:1]) == [{A}]
    index.add(k[4:5], [PodEntry(C)])  # evicts k2, B's only key
    assert sorted(index.pods()) == [A, C]
    assert index.remove_pod(B) == 0
    assert index.remove_pod(A) == 1
    assert sorted(index.pods()) == [C]
    assert held_by(index, k[3:5]) == [{C}, {C}]


def test_size_bounds_the_engine_key_map_too() -> None:
    k = keys(4)
    index = KVBlockIndex(size=2)
    index.add(k, [PodEntry(A)], [1, 2, 3, 4])
    assert [index.request_key(e) for e in (1, 2, 3, 4)] == [None, None, k[2], k[3]]


def test_sizes_must_be_positive() -> None:
    with pytest.raises(ValueError):
        KVBlockIndex(size=0)
    with pytest.raises(ValueError):
        KVBlockIndex(pod_cache_size=0)


# ---------------------------------------------------------------- remove_pod


def test_remove_pod_forgets_every_tier_and_leaves_others() -> None:
    k = keys(3)
    index = KVBlockIndex()
    index.add(k, [PodEntry(A)])
    index.add(k[:1], [PodEntry(A, "cpu"), PodEntry(B), PodEntry(A, speculative=True)])
    assert index.remove_pod(A) == 5
    assert held_by(index, k) == [{B}]
    assert len(index) == 1
    assert index.pods() == [B]
    assert index.remove_pod(A) == 0


# ---------------------------------------------------------------- longest_prefix


def test_longest_prefix_weights_tiers_and_stops_at_a_broken_chain() -> None:
    gpu, cpu = PodEntry(A, "gpu"), PodEntry(B, "cpu")
    per_key = [
        [gpu, PodEntry(A, "cpu"), cpu],
        [gpu, cpu, PodEntry(C)],  # C joins late: not a prefix hit
        [cpu, PodEntry(C)],  # A's chain breaks here
        [gpu, cpu],
    ]
    weighted, counts = longest_prefix(per_key)
    assert counts == {A: 2, B: 4}
    assert weighted == pytest.approx({A: 2.0, B: 3.2})
    weighted, _ = longest_prefix(per_key, {"gpu": 1.0, "cpu": 0.5})
    assert weighted == pytest.approx({A: 2.0, B: 2.0})


def test_longest_prefix_counts_an_unknown_tier_as_one() -> None:
    weighted, counts = longest_prefix([[PodEntry(A, "disk")]], DEFAULT_TIER_WEIGHTS)
    assert weighted == {A: 1.0} and counts == {A: 1}
    assert longest_prefix([]) == ({}, {})


def test_lookup_then_longest_prefix() -> None:
    k = keys(4)
    index = KVBlockIndex()
    index.add(k, [PodEntry(A)])
    index.add(k[:2], [PodEntry(B, "cpu")])
    index.add(k[3:], [PodEntry(B)])
    weighted, counts = longest_prefix(index.lookup(k, {A, B}))
    assert counts == {A: 4, B: 2}
    assert weighted == pytest.approx({A: 4.0, B: 1.6})


def test_lookup_counts_hits_as_the_longest_single_endpoint_run() -> None:
    k = keys(3)
    index = KVBlockIndex()
    index.add(k[:2], [PodEntry(A)])
    index.add(k[:1], [PodEntry(B)])
    index.lookup(k)
    index.lookup(k, {B})
    index.lookup(k, {C})
    s = index.stats
    assert (s.lookups, s.lookup_keys, s.lookup_hits) == (3, 9, 2 + 1 + 0)
