"""The approximate prefix cache: hashing, the index and its LRU, and the plugins that read it."""

from __future__ import annotations

import logging
import struct
import textwrap
from pathlib import Path

import pytest
import xxhash

from epp.config.loader import build_pipeline, load_raw
from epp.errors import ConfigError
from epp.framework.endpoint import Endpoint
from epp.framework.plugins import CycleState, Handle, ProfileRunResult, SchedulingResult
from epp.plugins.filters.prefix_cache_affinity import PrefixCacheAffinityFilter
from epp.plugins.producers.approx_prefix_cache import (
    ApproxPrefixCacheProducer,
    PrefixMatch,
    find_prefix_producer,
    hash_prompt,
)
from epp.plugins.scorers.no_hit_lru import NoHitLruScorer
from epp.plugins.scorers.prefix_cache import PrefixCacheScorer

from .helpers import approx_producer, bind_all, ep, make, names, registry, req

# Hand-computed: h0 = xxh64(b"m"), h1 = xxh64(b"aaaa" + LE64(h0)), h2 = xxh64(b"bbbb" + LE64(h1)).
H0 = 0xBA2E567083A2B2E8
H1 = 0x390FB08ECC2C3166
H2 = 0x38807F4DDD2B9645
H_TAIL_CC = 0x6A3E7D2133833C7B       # xxh64(b"cc" + LE64(H2)): the trailing partial block
H1_SALTED = 0x87597466157AA714       # xxh64(b"aaaa" + LE64(xxh64(b"msalt")))


def test_hand_checked_constants_follow_the_formula() -> None:
    le = lambda h: struct.pack("<Q", h)  # noqa: E731
    assert xxhash.xxh64_intdigest(b"m") == H0
    assert xxhash.xxh64_intdigest(b"aaaa" + le(H0)) == H1
    assert xxhash.xxh64_intdigest(b"bbbb" + le(H1)) == H2


@pytest.mark.parametrize("model,salt,text,block,max_blocks,expected", [
    ("m", None, "aaaabbbb", 4, 256, [H1, H2]),
    ("m", None, "aaaabbbbcc", 4, 256, [H1, H2, H_TAIL_CC]),
    ("m", None, "aaa", 4, 256, []),
    ("m", None, "", 4, 256, []),
    ("m", "salt", "aaaa", 4, 256, [H1_SALTED]),
    ("m", None, "aaaabbbbcccc", 4, 2, [H1, H2]),
    ("m", None, "aaaabbbbcc", 4, 2, [H1, H2]),
], ids=["two-blocks", "partial-tail-hashed", "shorter-than-a-block", "empty", "cache-salt-in-seed",
        "truncated-to-max-blocks", "truncation-drops-tail"])
def test_hash_prompt(model: str, salt: str | None, text: str, block: int, max_blocks: int,
                     expected: list[int]) -> None:
    assert hash_prompt(model, salt, text, block, max_blocks) == expected


def test_different_models_never_share_hashes() -> None:
    assert not set(hash_prompt("m1", None, "a" * 64, 16, 8)) & set(hash_prompt("m2", None, "a" * 64, 16, 8))


def test_chat_prefix_growth_keeps_leading_hashes() -> None:
    first = hash_prompt("m", None, "You are a helpful assistant. Hello, how are you?", 8, 256)
    longer = hash_prompt("m", None, "You are a helpful assistant. Hello, how are you? Fine, and you?", 8, 256)
    assert longer[:len(first) - 1] == first[:-1]    # every full block matches; the old partial tail does not


@pytest.mark.parametrize("raw,endpoints,text,expected_hashes", [
    ({"autoTune": False, "blockSizeTokens": 1}, [{}], "aaaabbbb", [H1, H2]),
    ({"autoTune": True, "blockSizeTokens": 32}, [{"block_size": 1}], "aaaabbbb", [H1, H2]),
    ({"autoTune": True, "blockSizeTokens": 1}, [{}], "aaaabbbb", [H1, H2]),
    ({"autoTune": True, "blockSizeTokens": 2}, [{}], "aaaabbbb", 1),
    ({"hashBlockSize": 4}, [{"block_size": 16}], "aaaabbbb", [H1, H2]),
    ({"autoTune": False, "blockSizeTokens": 1, "maxPrefixTokensToMatch": 1}, [{}], "aaaabbbb", [H1]),
    ({"autoTune": False, "blockSizeTokens": 1, "maxPrefixBlocksToMatch": 1}, [{}], "aaaabbbb", [H1]),
    ({"autoTune": False, "blockSizeTokens": 1, "maxPrefixBlocksToMatch": 0}, [{}], "aaaabbbb", []),
    ({"autoTune": False, "blockSizeTokens": 1, "prefixHashSource": "body"}, [{}], "aaaabbbb", [H1, H2]),
], ids=["fixed-tokens", "auto-tune-from-first-endpoint", "auto-tune-unknown-falls-back", "bigger-block",
        "v03-hash-block-size-chars", "max-tokens-overrides-blocks", "max-blocks", "zero-blocks-disables",
        "body-hash-source"])
def test_produce_block_size_and_limits(raw: dict, endpoints: list[dict], text: str,
                                       expected_hashes: list[int] | int) -> None:
    producer = make(ApproxPrefixCacheProducer, raw)
    cyc = CycleState()
    producer.produce(cyc, req(text), [ep(f"e{i}", **spec) for i, spec in enumerate(endpoints)])
    state = cyc[producer.state_key]
    assert isinstance(state, PrefixMatch)
    if isinstance(expected_hashes, int):
        assert len(state.hashes) == expected_hashes
    else:
        assert state.hashes == expected_hashes


@pytest.mark.parametrize("raw,field", [
    ({"blockSize": 64}, "blockSize"),
    ({"hashBlockSize": 5, "blockSizeTokens": 16}, "hashBlockSize"),
    ({"blockSizeTokens": 0}, "blockSizeTokens"),
    ({"lruCapacityPerServer": 0}, "lruCapacityPerServer"),
    ({"maxPrefixBlocksToMatch": -1}, "maxPrefixBlocksToMatch"),
    ({"lruCapacity": 10}, "lruCapacity"),
    ({"prefixHashSource": "header"}, "prefixHashSource"),
], ids=["deprecated-block-size-alone", "hash-block-size-and-tokens", "zero-tokens", "zero-lru", "negative-blocks",
        "unknown", "unknown-hash-source"])
@pytest.mark.parametrize("type_name", ["approx-prefix-cache-producer", "prefix-cache-scorer"])
def test_bad_prefix_params(type_name: str, raw: dict, field: str) -> None:
    with pytest.raises(ConfigError) as info:
        registry().create(type_name, "px", raw, Handle())
    assert info.value.plugin == "px" and info.value.field == field


def test_metadata_hash_source_is_refused_naming_the_field() -> None:
    with pytest.raises(ConfigError, match="prefixHashSource 'metadata'") as info:
        registry().create("approx-prefix-cache-producer", "px", {"prefixHashSource": "metadata"}, Handle())
    assert info.value.field == "prefixHashSource"


def test_deprecated_block_size_with_tokens_is_accepted_and_ignored() -> None:
    producer = make(ApproxPrefixCacheProducer, {"blockSize": 999, "blockSizeTokens": 1, "autoTune": False})
    assert producer.fixed_block_chars == 4


def test_match_stops_at_first_hash_nobody_holds() -> None:
    p = approx_producer()
    e1, e2, e3 = ep("e1"), ep("e2"), ep("e3")
    p.add([1, 2, 3], e1)
    p.add([1], e2)
    p.add([3], e3)
    # every holder of a walked hash gets +1, even e3 whose run does not start at block 1 (as the reference)
    assert p.match([1, 2, 3]) == {"e1": 3, "e2": 1, "e3": 1}
    assert p.match([1, 5, 3]) == {"e1": 1, "e2": 1}
    assert p.match([9, 1]) == {}
    assert p.match([]) == {}


def test_pick_indexes_primary_and_prefill_then_later_requests_match() -> None:
    p = approx_producer()
    pod1, pod2, pod3 = ep("pod1"), ep("pod2"), ep("pod3")
    pods = [pod1, pod2, pod3]
    first = req("aaaaaa")                                   # blocks "aaaa", "aa"
    cyc = CycleState()
    p.produce(cyc, first, pods)
    assert cyc[p.state_key].matches == {}
    result = SchedulingResult({"decode": ProfileRunResult([pod1]), "prefill": ProfileRunResult([pod3])},
                              "decode", prefill_profile="prefill", cycle=cyc)
    p.pre_request(first, result)
    second = req("aaaabbbb")
    cyc2 = CycleState()
    p.produce(cyc2, second, pods)
    state = cyc2[p.state_key]
    assert (state.match_blocks("pod1"), state.match_blocks("pod2"), state.match_blocks("pod3")) == (1, 0, 1)
    assert state.total_blocks == 2 and state.score("pod1") == 0.5
    assert sorted(p.indexed_endpoints()) == ["pod1", "pod3"]


def test_pre_request_without_produce_hashes_the_request_itself() -> None:
    p = approx_producer()
    target = ep("t")
    p.pre_request(req("aaaabbbb"), SchedulingResult({"default": ProfileRunResult([target])}, "default"))
    assert p.match([H1, H2]) == {"t": 2}


def test_lru_eviction_unlinks_oldest_hash() -> None:
    p = approx_producer({"lruCapacityPerServer": 3})
    e1, e2 = ep("e1"), ep("e2")
    p.add([1, 2, 3], e1)
    p.add([1], e2)
    p.add([4], e1)                   # evicts 1 from e1; e2 still holds it
    assert p.match([1]) == {"e2": 1}
    assert p.match([2, 3, 4]) == {"e1": 3}
    p.add([2], e1)                   # touch 2: now 3 is the oldest
    p.add([5], e1)
    assert p.match([3]) == {} and p.match([2, 4, 5]) == {"e1": 3}
    assert p.index_size() == 3 + 1


@pytest.mark.parametrize("raw,gpu_blocks,expected", [
    ({"autoTune": True}, 2, 2),
    ({"autoTune": True, "lruCapacityPerServer": 7}, None, 7),
    ({"autoTune": False, "lruCapacityPerServer": 7}, 2, 7),
], ids=["auto-tune-uses-gpu-blocks", "auto-tune-unknown-uses-param", "no-auto-tune-uses-param"])
def test_lru_capacity(raw: dict, gpu_blocks: int | None, expected: int) -> None:
    p = make(ApproxPrefixCacheProducer, raw)
    e = ep("e", gpu_blocks=gpu_blocks)
    p.add(list(range(10)), e)
    assert p.capacity("e") == expected and p.index_size() == expected
    assert p.match(list(range(10 - expected, 10))) == {"e": expected}


def test_removed_endpoints_are_forgotten() -> None:
    p = approx_producer()
    e1, e2 = ep("e1"), ep("e2")
    p.add([1, 2], e1)
    p.add([1], e2)
    p.on_endpoints_changed([], [e1])
    assert p.match([1, 2]) == {"e2": 1} and p.indexed_endpoints() == ["e2"] and p.index_size() == 1
    p.remove_endpoint("e2")
    p.remove_endpoint("never-seen")
    assert p.match([1]) == {} and p.index_size() == 0


def test_hit_ratio_stats() -> None:
    p = approx_producer()
    target = ep("t")
    for text in ("aaaabbbb", "aaaabbbb", "aaaacccc"):
        cyc = CycleState()
        p.produce(cyc, req(text), [target])
        p.pre_request(req(text), SchedulingResult({"d": ProfileRunResult([target])}, "d", cycle=cyc))
    st = p.stats()
    # matched: 0 of 2, then 2 of 2, then 1 of 2  ->  3 of 6 blocks, block = 1 token
    assert (st.requests, st.matched_blocks, st.total_blocks, st.matched_tokens, st.total_tokens) == (3, 3, 6, 3, 6)
    assert st.hit_ratio == 0.5


def _scorer_with_producer(raw: dict | None = None) -> tuple[PrefixCacheScorer, ApproxPrefixCacheProducer]:
    producer = approx_producer()
    scorer = make(PrefixCacheScorer, raw)
    bind_all(producer, scorer)
    return scorer, producer


def test_prefix_cache_scorer_is_match_over_total() -> None:
    scorer, producer = _scorer_with_producer()
    a, b, c = ep("a"), ep("b"), ep("c")
    producer.add([H1, H2], a)
    producer.add([H1], b)
    cyc = CycleState()
    producer.produce(cyc, req("aaaabbbbcccc"), [a, b, c])       # 3 blocks
    assert scorer.score(cyc, req("aaaabbbbcccc"), [a, b, c]) == pytest.approx([2 / 3, 1 / 3, 0.0])


@pytest.mark.parametrize("text,with_state", [("aa", True), ("aaaabbbb", False)],
                         ids=["no-blocks", "no-match-info"])
def test_prefix_cache_scorer_zero_without_information(text: str, with_state: bool) -> None:
    scorer, producer = _scorer_with_producer()
    eps = [ep("a"), ep("b")]
    cyc = CycleState()
    if with_state:
        producer.produce(cyc, req(text), eps)
    assert scorer.score(cyc, req(text), eps) == [0.0, 0.0]


# matchLengthWeight w / matchLengthScaleTokens S (llm-d PR #1459): 10 blocks of 64 bytes = 16 tokens each.
# a: 8 blocks = 128 tokens; b: 2 blocks = 32 tokens; c: none.
@pytest.mark.parametrize("raw,expected", [
    ({}, [0.8, 0.2, 0.0]),
    ({"matchLengthWeight": 0.5, "matchLengthScaleTokens": 256},
     [0.5 * 0.5 ** 2 + 0.5 * 0.8, 0.5 * 0.125 ** 2 + 0.5 * 0.2, 0.0]),
    ({"matchLengthWeight": 1.0, "matchLengthScaleTokens": 256}, [0.25, 0.015625, 0.0]),
    ({"matchLengthWeight": 0.5, "matchLengthScaleTokens": 64}, [0.5 * 1.0 + 0.5 * 0.8, 0.5 * 0.25 + 0.5 * 0.2, 0.0]),
    ({"matchLengthWeight": 0.5}, [0.5 * (128 / 8192) ** 2 + 0.4, 0.5 * (32 / 8192) ** 2 + 0.1, 0.0]),
    ({"matchLengthWeight": 0.0, "matchLengthScaleTokens": 0}, [0.8, 0.2, 0.0]),
], ids=["default-is-match-ratio", "half-and-half", "length-only", "length-saturates-at-one", "default-scale-8192",
        "scale-unused-without-weight"])
def test_prefix_cache_scorer_match_length(raw: dict, expected: list[float]) -> None:
    scorer, producer = _scorer_with_producer(raw)
    cyc = CycleState({producer.state_key: PrefixMatch(list(range(10)), {"a": 8, "b": 2}, 64)})
    assert scorer.score(cyc, req(), [ep("a"), ep("b"), ep("c")]) == pytest.approx(expected)


@pytest.mark.parametrize("raw,field", [
    ({"matchLengthWeight": 1.5}, "matchLengthWeight"),
    ({"matchLengthWeight": -0.1}, "matchLengthWeight"),
    ({"matchLengthWeight": 0.5, "matchLengthScaleTokens": 0}, "matchLengthScaleTokens"),
    ({"matchLengthWeight": 0.5, "matchLengthScaleTokens": -8}, "matchLengthScaleTokens"),
], ids=["weight-above-one", "weight-negative", "zero-scale-with-weight", "negative-scale-with-weight"])
def test_prefix_cache_scorer_match_length_bad_params(raw: dict, field: str) -> None:
    with pytest.raises(ConfigError, match=field) as info:
        registry().create("prefix-cache-scorer", "s", raw, Handle())
    assert info.value.plugin == "s" and info.value.field == field


def test_prefix_cache_scorer_match_length_through_the_loader() -> None:
    pipeline = _load("""\
        plugins:
        - type: prefix-cache-scorer
          parameters: {matchLengthWeight: 0.3, matchLengthScaleTokens: 8192}
        schedulingProfiles:
        - name: default
          plugins: [{pluginRef: prefix-cache-scorer}]
        """)
    [ws] = pipeline.scheduler.profiles["default"].scorers
    assert isinstance(ws.scorer, PrefixCacheScorer) and ws.scorer.params.match_length_weight == 0.3


def _two_producers() -> tuple[ApproxPrefixCacheProducer, ApproxPrefixCacheProducer, CycleState]:
    """Producers ``gpu`` and ``cpu``; in the cycle, ``gpu`` says endpoint a holds 1 of 4 blocks, ``cpu`` 4 of 4."""
    gpu, cpu = make(ApproxPrefixCacheProducer, name="gpu"), make(ApproxPrefixCacheProducer, name="cpu")
    return gpu, cpu, CycleState({gpu.state_key: PrefixMatch([1, 2, 3, 4], {"a": 1}, 4),
                                 cpu.state_key: PrefixMatch([1, 2, 3, 4], {"a": 4}, 4)})


def test_prefix_cache_scorer_reads_the_named_producer() -> None:
    """prefixMatchInfoProducerName (llm-d PR #1183): two producers, each scorer reads the one it names."""
    gpu, cpu, cyc = _two_producers()
    default = make(PrefixCacheScorer, name="default")
    named = make(PrefixCacheScorer, {"prefixMatchInfoProducerName": "cpu"}, name="named")
    bind_all(gpu, cpu, default, named)
    assert default.score(cyc, req(), [ep("a")]) == [0.25]
    assert named.score(cyc, req(), [ep("a")]) == [1.0] and named.producer is cpu


def test_no_hit_lru_and_affinity_filter_read_the_named_producer() -> None:
    gpu, cpu, cyc = _two_producers()
    lru = make(NoHitLruScorer, {"prefixMatchInfoProducerName": "cpu", "prefixPluginName": "gpu"})
    flt = make(PrefixCacheAffinityFilter, {"prefixMatchInfoProducerName": "cpu", "explorationProbability": 0})
    bind_all(gpu, cpu, lru, flt)
    assert lru.score(cyc, req(), [ep("a"), ep("b")]) == [0.5, 0.5]        # cpu: a hit, so the request is warm
    assert names(flt.filter(cyc, req(), [ep("a"), ep("b")])) == ["a"]     # cpu: a holds every block


@pytest.mark.parametrize("cls", [PrefixCacheScorer, NoHitLruScorer, PrefixCacheAffinityFilter])
def test_named_producer_must_be_a_configured_producer(cls: type) -> None:
    with pytest.raises(ConfigError, match="prefixMatchInfoProducerName names plugin 'cpu', which is not "
                                          "configured") as info:
        bind_all(approx_producer(), make(cls, {"prefixMatchInfoProducerName": "cpu"}, name="consumer"))
    assert info.value.plugin == "consumer" and info.value.field == "prefixMatchInfoProducerName"


def test_named_producer_through_the_loader_points_at_the_plugin() -> None:
    with pytest.raises(ConfigError, match="'gpu', which is not configured") as info:
        _load("""\
            plugins:
            - type: approx-prefix-cache-producer
              name: cpu
            - type: prefix-cache-scorer
              parameters: {prefixMatchInfoProducerName: gpu}
            schedulingProfiles:
            - name: default
              plugins: [{pluginRef: prefix-cache-scorer}]
            """)
    assert info.value.plugin == "prefix-cache-scorer" and info.value.line == 4


def test_precise_mode_fails_config_naming_plugin() -> None:
    raw = {"mode": "cache_tracking", "kvEventsConfig": {"zmqEndpoint": "tcp://0.0.0.0:5557"},
           "indexerConfig": {"tokenProcessorConfig": {"blockSize": 16}}}
    with pytest.raises(ConfigError, match="cache_tracking.*not implemented.*precise-prefix-cache-producer") as info:
        registry().create("prefix-cache-scorer", "my-prefix", raw, Handle())
    assert info.value.plugin == "my-prefix" and "my-prefix" in str(info.value)


@pytest.mark.parametrize("raw,expected", [
    ({}, {}),
    ({"blockSizeTokens": 16, "autoTune": False, "maxPrefixBlocksToMatch": 256},
     {"blockSizeTokens": 16, "autoTune": False, "maxPrefixBlocksToMatch": 256}),
    ({"hashBlockSize": 5, "lruCapacityPerServer": 31250, "mode": "estimate"},
     {"hashBlockSize": 5, "lruCapacityPerServer": 31250}),
], ids=["none", "explicit-only", "mode-not-passed"])
def test_scorer_producer_params(raw: dict, expected: dict) -> None:
    scorer = make(PrefixCacheScorer, raw)
    assert PrefixCacheScorer.producer_params(scorer.params) == expected
    assert ApproxPrefixCacheProducer.Params.model_validate(expected) is not None


def test_scorer_rejects_producer_with_different_params() -> None:
    producer = make(ApproxPrefixCacheProducer, {"blockSizeTokens": 8})
    scorer = make(PrefixCacheScorer, {"blockSizeTokens": 16}, name="scorer")
    with pytest.raises(ConfigError, match="blockSizeTokens") as info:
        bind_all(producer, scorer)
    assert info.value.plugin == "scorer"


def test_consumer_without_producer_fails_bind() -> None:
    with pytest.raises(ConfigError, match="needs an approx-prefix-cache-producer"):
        bind_all(make(PrefixCacheScorer))


def test_find_prefix_producer_follows_named_consumer() -> None:
    p1 = make(ApproxPrefixCacheProducer, name="p1")
    p2 = make(ApproxPrefixCacheProducer, name="p2")
    scorer = make(PrefixCacheScorer, name="s")
    handle = Handle()
    for plugin in (p1, p2, scorer):
        handle.add(plugin)
    scorer.producer = p2
    assert find_prefix_producer(scorer, handle, via="s") is p2
    assert find_prefix_producer(scorer, handle, via="p2") is p2
    assert find_prefix_producer(scorer, handle, via="missing") is p1


def _no_hit(raw: dict | None = None) -> tuple[NoHitLruScorer, ApproxPrefixCacheProducer]:
    producer = approx_producer()
    scorer = make(NoHitLruScorer, raw)
    bind_all(producer, scorer)
    return scorer, producer


def _cold_pick(scorer: NoHitLruScorer, producer: ApproxPrefixCacheProducer, target: Endpoint,
               prefill: Endpoint | None = None) -> None:
    cyc = CycleState({producer.state_key: PrefixMatch([1, 2], {}, 4)})
    scorer.score(cyc, req(), [target])
    results = {"decode": ProfileRunResult([target])}
    if prefill is not None:
        results["prefill"] = ProfileRunResult([prefill])
    scorer.pre_request(req(), SchedulingResult(results, "decode", prefill_profile="prefill" if prefill else None,
                                               cycle=cyc))


def test_no_hit_lru_ranks_cold_requests() -> None:
    scorer, producer = _no_hit()
    a, b, c, d = ep("a"), ep("b"), ep("c"), ep("d")
    _cold_pick(scorer, producer, c)
    _cold_pick(scorer, producer, a)
    assert scorer.lru_order() == ["c", "a"]
    cyc = CycleState({producer.state_key: PrefixMatch([1, 2], {}, 4)})
    # n = 4; never used b, d -> 1 - 0/3, 1 - 1/3; used: c (pos 0) -> 1 - (2+0)/3, a (pos 1) -> 1 - (2+1)/3
    assert scorer.score(cyc, req(), [a, b, c, d]) == pytest.approx([0.0, 1.0, 1 / 3, 2 / 3])


def test_no_hit_lru_warm_request_is_neutral_and_not_recorded() -> None:
    scorer, producer = _no_hit()
    a, b = ep("a"), ep("b")
    cyc = CycleState({producer.state_key: PrefixMatch([1, 2], {"b": 1}, 4)})
    assert scorer.score(cyc, req(), [a, b]) == [0.5, 0.5]
    scorer.pre_request(req(), SchedulingResult({"d": ProfileRunResult([a])}, "d", cycle=cyc))
    assert scorer.lru_order() == []


@pytest.mark.parametrize("state,endpoints,expected", [
    (None, ["a"], [1.0]),
    (None, ["a", "b", "c"], [1.0, 0.5, 0.0]),
    (PrefixMatch([], {}, 4), ["a", "b"], [1.0, 0.0]),
], ids=["single-candidate", "no-match-info-is-cold", "no-blocks-is-cold"])
def test_no_hit_lru_cold_cases(state: PrefixMatch | None, endpoints: list[str], expected: list[float]) -> None:
    scorer, producer = _no_hit()
    cyc = CycleState() if state is None else CycleState({producer.state_key: state})
    assert scorer.score(cyc, req(), [ep(n) for n in endpoints]) == pytest.approx(expected)


def test_no_hit_lru_tracks_prefill_and_evicts_beyond_size() -> None:
    scorer, producer = _no_hit({"lruSize": 2})
    a, b, c = ep("a"), ep("b"), ep("c")
    _cold_pick(scorer, producer, a, prefill=b)
    assert scorer.lru_order() == ["a", "b"]
    _cold_pick(scorer, producer, c)
    assert scorer.lru_order() == ["b", "c"]
    _cold_pick(scorer, producer, b)
    assert scorer.lru_order() == ["c", "b"]


@pytest.mark.parametrize("size", [0, -1])
def test_no_hit_lru_size_below_one_means_1024_with_a_warning(size: int, caplog: pytest.LogCaptureFixture) -> None:
    """llm-d ``NewNoHitLRU`` keeps the default 1024 unless ``lruSize`` > 0."""
    with caplog.at_level(logging.WARNING, logger="epp.plugins"):
        scorer, producer = _no_hit({"lruSize": size})
    for i in range(3):
        _cold_pick(scorer, producer, ep(f"e{i}"))
    assert scorer.lru_order() == ["e0", "e1", "e2"]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "no-hit-lru-scorer" in warnings[0] and "lruSize" in warnings[0]


def _load(text: str):  # type: ignore[no-untyped-def]
    return build_pipeline(*load_raw(textwrap.dedent(text), "t.yaml"), registry())


def test_loader_auto_creates_producer_from_scorer_params() -> None:
    pipeline = _load("""\
        plugins:
        - type: prefix-cache-scorer
          parameters: {hashBlockSize: 5, maxPrefixBlocksToMatch: 8}
        - type: no-hit-lru-scorer
        schedulingProfiles:
        - name: default
          plugins: [{pluginRef: prefix-cache-scorer}, {pluginRef: no-hit-lru-scorer}]
        """)
    [producer] = pipeline.scheduler.producers
    assert isinstance(producer, ApproxPrefixCacheProducer)
    assert producer.fixed_block_chars == 5 and producer.params.max_prefix_blocks_to_match == 8
    assert producer in pipeline.pre_request


def test_the_reference_readme_example_with_ttft_source_loads() -> None:
    """The filter README's example (ttftSource: prefillThroughput, the default peak) loads; its gate reads the
    in-flight tokens the inflight-load-producer books."""
    path = Path(__file__).parent.parent / "fixtures/configs/llmd/HEAD_prefix-cache-affinity-readme-example.yaml"
    pipeline = build_pipeline(*load_raw(path.read_text(), str(path)), registry())
    [flt] = pipeline.scheduler.profiles["default"].filters
    assert isinstance(flt, PrefixCacheAffinityFilter) and flt.name == "prefix-affinity"
    assert (flt.params.ttft_source, flt.params.peak_prefill_throughput, flt.params.max_ttft_penalty_ms) == \
        ("prefillThroughput", 15928, 5000)
