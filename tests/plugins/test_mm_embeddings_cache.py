"""``mm-embeddings-cache-producer`` and ``mm-embeddings-cache-scorer``: item extraction and hashing, the per-endpoint
encoder-cache model (size bound, pinning, oldest-freed eviction), the request lifecycle, scores, and configs."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import orjson
import pytest

from epp.config.loader import build_pipeline, load_raw
from epp.errors import ConfigError
from epp.framework.endpoint import Endpoint
from epp.framework.plugins import CycleState, Handle, ProfileRunResult, ResponseInfo, SchedulingResult
from epp.framework.request import InferenceRequest, MultiModalFeature, parse_request
from epp.plugins.producers.mm_embeddings_cache import (
    PRODUCER_TYPE,
    EncoderCacheMatch,
    EncoderCacheModel,
    MatchItem,
    MmEmbeddingsCacheProducer,
    capacity_from_mb,
    content_hash,
    extract_items,
)
from epp.plugins.scorers.mm_embeddings_cache import MmEmbeddingsCacheScorer

from .helpers import bind_all, ep, make, registry

README_EXAMPLES = Path(__file__).parent.parent / "fixtures/configs/llmd/HEAD_mm-embeddings-cache-readme-examples.yaml"
CAT = "https://example.com/cat.png"


def chat(*parts: dict[str, Any], rid: str = "r") -> InferenceRequest:
    """A chat request whose one user message has ``parts``."""
    body = {"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "what?"}, *parts]}]}
    return parse_request("/v1/chat/completions", orjson.dumps(body), {}, request_id=rid)


def image(url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}}


def tokenized(rid: str, sizes: dict[str, int]) -> InferenceRequest:
    """A request carrying a token-producer's multimodal features: one image per hash, with its placeholder size."""
    request = chat(rid=rid)
    request.mm_features = tuple(MultiModalFeature("image", h, 10 * i, n) for i, (h, n) in enumerate(sizes.items()))
    return request


def result(*targets: Endpoint, cycle: CycleState | None = None, **profiles: list[Endpoint]) -> SchedulingResult:
    runs = {"default": ProfileRunResult(list(targets)), **{k: ProfileRunResult(v) for k, v in profiles.items()}}
    return SchedulingResult(runs, "default", cycle=cycle if cycle is not None else CycleState())


def route(producer: MmEmbeddingsCacheProducer, request: InferenceRequest, target: Endpoint, *,
          start: bool = True) -> CycleState:
    """Produce, pick ``target``, and (with ``start``) deliver the first response byte."""
    cyc = CycleState()
    producer.produce(cyc, request, [target])
    producer.pre_request(request, result(target, cycle=cyc))
    if start:
        producer.response_started(request, target)
    return cyc


def producer(**raw: int) -> MmEmbeddingsCacheProducer:
    return make(MmEmbeddingsCacheProducer, raw)


# -- parameters ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mb, entries", [(4, 2), (2048, 1024), (0, 2048), (-5, 2048), (1, 1)],
                         ids=["4MiB", "2GiB", "zero-default", "negative-default", "below-one-item"])
def test_capacity_from_mb(mb: int, entries: int) -> None:
    assert capacity_from_mb(mb) == entries


@pytest.mark.parametrize("raw, capacity, item_size", [
    ({}, 2048, False),
    ({"cacheSizeInMBPerServer": 4}, 2, False),
    ({"cacheSizeInEmbeddingsPerServer": 1024}, 1024, True),
], ids=["default", "mib", "embeddings"])
def test_capacity_modes(raw: dict[str, int], capacity: int, item_size: bool) -> None:
    built = registry().create(PRODUCER_TYPE, "mm", raw, Handle())
    assert (built.capacity, built.use_item_size) == (capacity, item_size)


@pytest.mark.parametrize("raw, needle", [
    ({"cacheSizeInMBPerServer": 4, "cacheSizeInEmbeddingsPerServer": 1024}, "cannot both be set"),
    ({"cacheSize": 10000}, "cacheSize"),
    ({"cacheSizeInMBPerServer": "bad"}, "cacheSizeInMBPerServer"),
], ids=["both-sizes", "unknown-key", "not-an-int"])
def test_bad_producer_params(raw: dict[str, Any], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        registry().create(PRODUCER_TYPE, "mm", raw, Handle())


# -- items --------------------------------------------------------------------------------------------------------


def test_content_hash_is_sha256_of_kind_nul_identifier() -> None:
    assert content_hash("image_url", CAT) == hashlib.sha256(b"image_url\x00" + CAT.encode()).hexdigest()


def test_chat_parts_give_one_unit_item_each_in_order_and_repeats_count_once() -> None:
    request = chat(image(CAT), {"type": "video_url", "video_url": {"url": "https://e/v.mp4"}},
                   {"type": "audio_url", "audio_url": {"url": "https://e/a.wav"}},
                   {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}, image(CAT))
    assert extract_items(request) == [
        MatchItem(content_hash("image_url", CAT), 1, "image"),
        MatchItem(content_hash("video_url", "https://e/v.mp4"), 1, "video"),
        MatchItem(content_hash("audio_url", "https://e/a.wav"), 1, "audio"),
        MatchItem(content_hash("input_audio", "wav:AAAA"), 1, "audio"),
    ]


def test_tokenized_features_win_and_weigh_their_placeholder_length() -> None:
    request = chat(image(CAT))
    request.mm_features = (MultiModalFeature("image", "a", 5, 576), MultiModalFeature("image", "b", 600, 0),
                           MultiModalFeature("image", "a", 700, 144))
    assert extract_items(request) == [MatchItem("a", 576, "image"), MatchItem("b", 1, "image")]


def test_text_only_request_has_no_items() -> None:
    assert extract_items(chat()) == []
    body = {"model": "m", "prompt": "hello"}
    assert extract_items(parse_request("/v1/completions", orjson.dumps(body), {})) == []


def test_responses_and_anthropic_images_hash_as_the_chat_part_vllm_makes_of_them() -> None:
    responses = {"model": "m", "input": [{"role": "user", "content": [{"type": "input_image", "image_url": CAT}]}]}
    anthropic = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBO"}},
        {"type": "image", "source": {"type": "url", "url": CAT}}]}]}
    got_responses = extract_items(parse_request("/v1/responses", orjson.dumps(responses), {}))
    got_anthropic = extract_items(parse_request("/v1/messages", orjson.dumps(anthropic), {}))
    assert got_responses == extract_items(chat(image(CAT)))
    assert got_anthropic == extract_items(chat(image("data:image/png;base64,iVBO"), image(CAT)))


# -- the encoder-cache model --------------------------------------------------------------------------------------


def test_model_evicts_oldest_freed_and_a_hit_refreshes() -> None:
    cache = EncoderCacheModel(2)
    for rid, h in [("1", "a"), ("2", "b"), ("3", "a")]:
        assert cache.acquire(rid, MatchItem(h, 1, "image"))
        cache.release(rid, h)
    assert cache.acquire("4", MatchItem("c", 1, "image"))
    assert ("a" in cache, "b" in cache, "c" in cache) == (True, False, True)


def test_model_never_evicts_pinned_entries_and_refuses_what_cannot_fit() -> None:
    cache = EncoderCacheModel(4)
    assert cache.acquire("1", MatchItem("big", 3, "image"))
    assert not cache.acquire("2", MatchItem("other", 2, "image"))
    assert not cache.acquire("2", MatchItem("huge", 5, "image"))
    cache.commit(MatchItem("huge", 5, "image"))
    assert ("big" in cache, "other" in cache, "huge" in cache) == (True, False, False)
    cache.release("1", "big")
    cache.commit(MatchItem("other", 2, "image"))
    assert ("big" in cache, "other" in cache, len(cache)) == (False, True, 1)


# -- the producer's lifecycle (llm-d's producer_test.go cases) ----------------------------------------------------


def test_produce_matches_what_each_endpoint_was_sent() -> None:
    mm = producer()
    a, b, c = ep("a"), ep("b"), ep("c")
    route(mm, tokenized("seed-a", {"h1": 80}), a)
    route(mm, tokenized("seed-b", {"h1": 80}), b)
    cyc = CycleState()
    mm.produce(cyc, tokenized("q", {"h1": 80, "h2": 20}), [a, b, c])
    match = cyc[mm.state_key]
    assert match.items == (MatchItem("h1", 80, "image"), MatchItem("h2", 20, "image"))
    assert [match.score(e.name) for e in (a, b, c)] == [0.8, 0.8, 0.0]
    empty = CycleState()
    mm.produce(empty, chat(), [a])
    assert empty == {}


def test_mib_mode_keeps_the_newest_entries_per_endpoint() -> None:
    mm, a = producer(cacheSizeInMBPerServer=4), ep("a")
    for h in ("h1", "h2", "h3"):
        route(mm, tokenized(h, {h: 500}), a)  # sizes do not count in this mode: one slot each
    assert [mm.holds("a", h) for h in ("h1", "h2", "h3")] == [False, True, True]


def test_embeddings_mode_evicts_by_size() -> None:
    mm, a = producer(cacheSizeInEmbeddingsPerServer=1024), ep("a")
    for h, n in [("a", 512), ("b", 64), ("c", 64), ("d", 512)]:
        route(mm, tokenized(f"r-{h}", {h: n}), a)
    assert [mm.holds("a", h) for h in "abcd"] == [False, True, True, True]


def test_items_of_one_request_are_placed_in_request_order() -> None:
    mm, a = producer(cacheSizeInEmbeddingsPerServer=512), ep("a")
    route(mm, tokenized("r", {"first": 512, "second": 512}), a)
    assert (mm.holds("a", "first"), mm.holds("a", "second")) == (False, True)


def test_pinned_entries_survive_until_the_response_starts() -> None:
    mm, a = producer(cacheSizeInEmbeddingsPerServer=576), ep("a")
    route(mm, tokenized("active", {"active": 512}), a, start=False)
    route(mm, tokenized("freeable", {"freeable": 64}), a)
    route(mm, tokenized("replacement", {"replacement": 64}), a, start=False)
    assert [mm.holds("a", h) for h in ("active", "freeable", "replacement")] == [True, False, True]


def test_pending_item_is_committed_at_the_first_byte_once_room_is_free() -> None:
    mm, a = producer(cacheSizeInEmbeddingsPerServer=512), ep("a")
    first, pending = tokenized("first", {"first": 512}), tokenized("pending", {"pending": 512})
    route(mm, first, a, start=False)
    route(mm, pending, a, start=False)
    assert not mm.holds("a", "pending")
    mm.response_started(first, a)
    mm.response_started(pending, a)
    mm.response_complete(pending, a, ResponseInfo())
    assert (mm.holds("a", "first"), mm.holds("a", "pending")) == (False, True)


def test_request_ending_without_a_byte_releases_and_drops_its_pending_items() -> None:
    mm, a = producer(cacheSizeInEmbeddingsPerServer=512), ep("a")
    active, aborted = tokenized("active", {"active": 512}), tokenized("aborted", {"pending": 512})
    route(mm, active, a, start=False)
    route(mm, aborted, a, start=False)
    mm.response_started(active, a)  # room could now be made for the aborted request's item
    mm.response_complete(aborted, None, ResponseInfo(status=499, error=True))
    assert (mm.holds("a", "active"), mm.holds("a", "pending")) == (True, False)


def test_an_entry_stays_pinned_until_every_request_using_it_started() -> None:
    mm, a = producer(cacheSizeInEmbeddingsPerServer=512), ep("a")
    route(mm, tokenized("seed", {"shared": 512}), a)
    first, second = tokenized("first", {"shared": 512}), tokenized("second", {"shared": 512})
    replacement = tokenized("replacement", {"replacement": 512})
    for request in (first, second, replacement):
        route(mm, request, a, start=False)
    assert not mm.holds("a", "replacement")
    mm.response_started(first, a)
    assert mm.holds("a", "shared")
    mm.response_started(second, a)
    mm.response_started(replacement, a)
    assert (mm.holds("a", "shared"), mm.holds("a", "replacement")) == (False, True)


def test_items_go_to_the_encode_profiles_endpoints_else_the_primary_target_only() -> None:
    mm = producer()
    decode, fallback, enc1, enc2 = ep("decode"), ep("fallback"), ep("enc1"), ep("enc2")
    disagg = tokenized("disagg", {"x": 1})
    mm.pre_request(disagg, result(decode, encode=[enc1, enc2]))
    mm.response_started(disagg, decode)
    aggregated = tokenized("aggregated", {"y": 1})
    mm.pre_request(aggregated, result(decode, fallback))
    mm.response_started(aggregated, decode)
    assert [mm.holds(n, "x") for n in ("decode", "enc1", "enc2")] == [False, True, True]
    assert [mm.holds(n, "y") for n in ("decode", "fallback")] == [True, False]


def test_removed_endpoint_is_forgotten_even_with_requests_in_flight() -> None:
    mm, a, b = producer(), ep("a"), ep("b")
    route(mm, tokenized("done", {"h": 1}), b)
    in_flight = tokenized("in-flight", {"h": 1})
    route(mm, in_flight, a, start=False)
    mm.remove_endpoint("a")
    mm.response_started(in_flight, a)
    assert mm.item_counts() == {"b": 1}


# -- the scorer ---------------------------------------------------------------------------------------------------


def _scorer(**raw: str) -> tuple[MmEmbeddingsCacheScorer, MmEmbeddingsCacheProducer]:
    mm = producer()
    scorer = make(MmEmbeddingsCacheScorer, raw)
    bind_all(mm, scorer)
    return scorer, mm


def test_score_is_matched_over_total_item_size() -> None:
    scorer, mm = _scorer()
    a, b, c = ep("a"), ep("b"), ep("c")
    items = (MatchItem("image", 80, "image"), MatchItem("icon", 20, "image"))
    cyc = CycleState({mm.state_key: EncoderCacheMatch(items, {"a": items[:1], "b": items[1:]})})
    assert scorer.score(cyc, chat(), [a, b, c]) == [0.8, 0.2, 0.0]


@pytest.mark.parametrize("state", [None, "not a match", EncoderCacheMatch((MatchItem("x", 0, "image"),),
                                                                          {"a": (MatchItem("x", 0, "image"),)})],
                         ids=["missing", "wrong-type", "zero-total"])
def test_score_is_zero_without_usable_match_info(state: Any) -> None:
    scorer, mm = _scorer()
    cyc = CycleState() if state is None else CycleState({mm.state_key: state})
    assert scorer.score(cyc, chat(), [ep("a"), ep("b")]) == [0.0, 0.0]


@pytest.mark.parametrize("others, producer_name, needle", [
    ([], None, "needs an mm-embeddings-cache-producer"),
    ([], "missing", "which is not configured"),
    (["queue"], "queue", "is a queue-scorer"),
], ids=["no-producer", "unknown-name", "wrong-type"])
def test_scorer_must_find_its_producer(others: list[str], producer_name: str | None, needle: str) -> None:
    handle = Handle()
    for name in others:
        handle.add(registry().create(f"{name}-scorer", name, None, handle))
    scorer = make(MmEmbeddingsCacheScorer, {"producerName": producer_name} if producer_name else {})
    with pytest.raises(ConfigError, match=needle) as err:
        scorer.bind(handle)
    assert err.value.field == ("producerName" if producer_name else None)


def test_scorer_reads_the_producer_it_names() -> None:
    first, second = make(MmEmbeddingsCacheProducer, name="first"), make(MmEmbeddingsCacheProducer, name="second")
    scorer = make(MmEmbeddingsCacheScorer, {"producerName": "second"})
    bind_all(first, second, scorer)
    items = (MatchItem("x", 1, "image"),)
    cyc = CycleState({first.state_key: EncoderCacheMatch(items),
                      second.state_key: EncoderCacheMatch(items, {"a": items})})
    assert scorer.score(cyc, chat(), [ep("a")]) == [1.0]


# -- configs ------------------------------------------------------------------------------------------------------


def test_scorer_alone_gets_a_default_producer_wired_into_every_hook() -> None:
    text = """\
plugins:
- type: mm-embeddings-cache-scorer
schedulingProfiles:
- name: default
  plugins: [{pluginRef: mm-embeddings-cache-scorer}]
"""
    pipeline = build_pipeline(*load_raw(text), registry())
    mm = pipeline.handle.plugin(PRODUCER_TYPE)
    assert isinstance(mm, MmEmbeddingsCacheProducer) and mm.capacity == 2048
    assert mm in pipeline.scheduler.producers
    assert mm in pipeline.pre_request and mm in pipeline.response_started and mm in pipeline.response_complete


def readme_examples() -> list[str]:
    """The YAML documents of the fixture (llm-d's README examples, verbatim)."""
    return README_EXAMPLES.read_text().split("\n---\n")


@pytest.mark.parametrize("index, capacity, by_size", [(1, 8192, True), (2, 1024, False), (3, 1024, False)],
                         ids=["producer-token", "scorer-unweighted", "scorer-token"])
def test_readme_examples_load(index: int, capacity: int, by_size: bool) -> None:
    pipeline = build_pipeline(*load_raw(readme_examples()[index], README_EXAMPLES.name), registry())
    mm = pipeline.handle.plugin(PRODUCER_TYPE)
    assert isinstance(mm, MmEmbeddingsCacheProducer) and (mm.capacity, mm.use_item_size) == (capacity, by_size)
    [profile] = pipeline.scheduler.profiles.values()
    assert [s.scorer.type_name for s in profile.scorers] == ["mm-embeddings-cache-scorer"]


def test_readme_example_with_undeclared_scorers_is_refused_naming_the_first() -> None:
    with pytest.raises(ConfigError, match="unknown plugin 'kv-cache-utilization-scorer'"):
        build_pipeline(*load_raw(readme_examples()[0], README_EXAMPLES.name), registry())
