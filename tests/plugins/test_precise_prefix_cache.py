"""Precise prefix-cache plugins (``precise-prefix-cache-producer``, ``precise-prefix-cache-scorer``) as configs see
them: llm-d's sample configs load, the parts EPP does not implement are refused naming the plugin and the field,
the match consumers read the producer they name, and scores follow the index (filled by hand here; the KV-event
path end to end is ``tests/gateway/test_precise_routing.py``)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from epp.config.loader import build_pipeline, load_config, load_raw
from epp.datalayer import scrape_settings
from epp.datalayer.datastore import Datastore
from epp.errors import ConfigError
from epp.framework.endpoint import EndpointSpec
from epp.framework.plugins import CycleState, Handle, ProfileRunResult, SchedulingResult
from epp.kvcache import KVBlockIndex, PodEntry, TokenProcessor
from epp.plugins.producers.approx_prefix_cache import PRODUCER_TYPE
from epp.plugins.producers.precise_prefix_cache import PrecisePrefixCacheProducer
from epp.plugins.producers.token_producer import TokenProducer
from epp.plugins.scorers.precise_prefix_cache import PrecisePrefixCacheScorer
from epp.plugins.scorers.prefix_cache import PrefixCacheScorer

from .helpers import ep, registry, req

LLMD = Path(__file__).parent.parent / "fixtures" / "configs" / "llmd"
TOKEN_PRODUCER = "- type: token-producer\n  parameters: {modelName: m, vllm: {http: 'http://127.0.0.1:1'}}\n"


def _load(text: str):  # type: ignore[no-untyped-def]
    return build_pipeline(*load_raw(text, "t.yaml"), registry())


def _plugins(pipeline: Any, type_name: str) -> list[Any]:
    return [p for p in pipeline.handle.plugins() if p.type_name == type_name]


# ------------------------------------------------------------------ llm-d's configs


def test_head_precise_config_loads_with_its_data_layer() -> None:
    """HEAD's sample: the legacy scorer beside a token-producer, both dataLayer sources wired."""
    pipeline = load_config(LLMD / "HEAD_epp-precise-prefix-cache-config.yaml", registry())
    [scorer] = _plugins(pipeline, "precise-prefix-cache-scorer")
    assert scorer.processor.block_size == 64 and scorer.enable_metrics is True
    assert scorer.events.discover_pods and scorer.socket_port == 5557 and scorer.events.topic_filter == "kv@"
    [tp] = _plugins(pipeline, "token-producer")
    assert tp.base_url == "http://localhost:8000" and tp.params.model_name == "hf-repo/model-name"
    assert scrape_settings(pipeline.config, pipeline.handle, registry()) is not None  # metrics source still wired
    [profile] = pipeline.scheduler.profiles.values()
    weights = {ws.scorer.name: ws.weight for ws in profile.scorers}
    assert weights["precise-prefix-cache-scorer"] == 2.0


def test_sim_no_hit_lru_config_reads_block_size_under_indexer_config() -> None:
    """llm-d's simulator sample puts tokenProcessorConfig under indexerConfig (the v0.3 place) and has no
    token-producer: the legacy scorer loads (it scores 0 until ids come) with block size 5."""
    pipeline = load_config(LLMD / "HEAD_sim-epp-no-hit-lru.yaml", registry())
    [scorer] = _plugins(pipeline, "precise-prefix-cache-scorer")
    assert scorer.processor.block_size == 5 and not _plugins(pipeline, "token-producer")


def test_v030_config_hash_seed_and_metrics() -> None:
    pipeline = load_config(LLMD / "v0.3.0_epp-precise-prefix-cache-config.yaml", registry())
    [scorer] = _plugins(pipeline, "precise-prefix-cache-scorer")
    assert scorer.processor.block_size == 64 and scorer.enable_metrics is True
    assert scorer.processor.keys(list(range(64)), "m") != TokenProcessor(64).keys(list(range(64)), "m")


# ------------------------------------------------------------------ refusals


@pytest.mark.parametrize("params,field", [
    ({"indexerConfig": {"kvBlockIndexConfig": {"redisConfig": {"address": "redis:6379"}}}},
     "indexerConfig.kvBlockIndexConfig.redisConfig"),
    ({"indexerConfig": {"kvBlockIndexConfig": {"redisConfig": {}}}}, "indexerConfig.kvBlockIndexConfig.redisConfig"),
    ({"indexerConfig": {"kvBlockIndexConfig": {"valkeyConfig": {}}}}, "indexerConfig.kvBlockIndexConfig.valkeyConfig"),
    ({"indexerConfig": {"tokenizersPoolConfig": {"modelName": "m"}}}, "indexerConfig.tokenizersPoolConfig"),
    ({"indexerConfig": {"tokenizersPoolConfig": {}}}, "indexerConfig.tokenizersPoolConfig"),
    ({"kvEventsConfig": {"engineType": "sglang"}}, "kvEventsConfig.engineType"),
    ({"sessionManager": "sessions"}, "sessionManager"),
], ids=["redis", "redis-empty", "valkey-empty", "tokenizers-pool", "tokenizers-pool-empty", "sglang", "session"])
@pytest.mark.parametrize("kind", ["precise-prefix-cache-producer", "precise-prefix-cache-scorer"])
def test_unimplemented_parts_are_refused_naming_plugin_and_field(kind: str, params: dict, field: str) -> None:
    """An empty ``redisConfig: {}`` still selects Redis in llm-d, so presence alone is refused."""
    text = f"plugins:\n{TOKEN_PRODUCER}- type: {kind}\n  name: cache\n  parameters: {params!r}\n"
    with pytest.raises(ConfigError, match="not implemented") as info:
        _load(text)
    assert info.value.plugin == "cache" and info.value.field == field
    assert "cache" in str(info.value) and field.rsplit(".", 1)[-1] in str(info.value)


def test_engine_type_vllm_and_empty_are_accepted() -> None:
    for value in ("vllm", "", "VLLM"):
        _load(f"plugins:\n{TOKEN_PRODUCER}- type: precise-prefix-cache-producer\n"
              f"  parameters: {{kvEventsConfig: {{engineType: '{value}'}}}}\n")


@pytest.mark.parametrize("token_producer", ["", "- type: token-producer\n"], ids=["none", "estimate-backend"])
def test_producer_without_a_vllm_token_producer_loads_with_a_warning(token_producer: str,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    """llm-d-router auto-creates an ``estimate`` token-producer and loads; its pseudo ids match nothing."""
    pipeline = _load(f"plugins:\n{token_producer}- type: precise-prefix-cache-producer\n  name: cache\n")
    assert _plugins(pipeline, "precise-prefix-cache-producer")
    assert "no prefix will match" in caplog.text


@pytest.mark.parametrize("alias", ["token-producer", "tokenizer"])
def test_producer_accepts_either_token_producer_type(alias: str) -> None:
    pipeline = _load(f"plugins:\n- type: {alias}\n  parameters: {{modelName: m}}\n"
                     "- type: precise-prefix-cache-producer\n")
    assert _plugins(pipeline, "precise-prefix-cache-producer")


def test_legacy_scorer_loads_without_token_producer_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    _load("plugins:\n- type: precise-prefix-cache-scorer\n  name: legacy\n")
    assert any("no token-producer" in r.getMessage() and "legacy" in r.getMessage() for r in caplog.records)


# ------------------------------------------------------------------ wiring


def test_prefix_cache_scorer_naming_the_precise_producer_gets_no_approx_producer() -> None:
    pipeline = _load(f"""\
plugins:
{TOKEN_PRODUCER}- type: precise-prefix-cache-producer
  name: precise
- type: prefix-cache-scorer
  parameters: {{prefixMatchInfoProducerName: precise}}
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins: [{{pluginRef: prefix-cache-scorer}}, {{pluginRef: max-score-picker}}]
""")
    assert not _plugins(pipeline, PRODUCER_TYPE)
    [scorer] = _plugins(pipeline, "prefix-cache-scorer")
    [precise] = _plugins(pipeline, "precise-prefix-cache-producer")
    assert scorer.producer is precise and precise in pipeline.scheduler.producers


def test_prefix_cache_scorer_without_a_name_still_gets_the_approx_producer() -> None:
    pipeline = _load(f"plugins:\n{TOKEN_PRODUCER}- type: precise-prefix-cache-producer\n"
                     "- type: prefix-cache-scorer\n")
    [approx] = _plugins(pipeline, PRODUCER_TYPE)
    assert _plugins(pipeline, "prefix-cache-scorer")[0].producer is approx


@pytest.mark.parametrize("extractor,error", [
    ("precise-prefix-cache-producer", None),
    ("core-metrics-extractor", "source 'endpoint-notification-source' .* cannot use extractor 'core-metrics-extractor'"),
    ("queue-scorer", "cannot use plugin 'queue-scorer' .*not an extractor"),
], ids=["consumer", "metrics-extractor", "not-an-extractor"])
def test_endpoint_notification_source_takes_only_endpoint_event_consumers(extractor: str, error: str | None) -> None:
    """The loader refuses a plugin that is no extractor at all; the source/extractor pairing is checked where the
    data layer is wired (``epp check-config`` and start-up), as for metrics sources."""
    text = f"""\
plugins:
{TOKEN_PRODUCER}- type: precise-prefix-cache-producer
- type: endpoint-notification-source
- type: metrics-data-source
- type: core-metrics-extractor
- type: queue-scorer
dataLayer:
  sources:
  - pluginRef: metrics-data-source
    extractors: [{{pluginRef: core-metrics-extractor}}]
  - pluginRef: endpoint-notification-source
    extractors: [{{pluginRef: {extractor}}}]
"""
    if error is None:
        pipeline = _load(text)
        assert scrape_settings(pipeline.config, pipeline.handle, registry()) is not None
        return
    with pytest.raises(ConfigError, match=error) as info:
        pipeline = _load(text)
        scrape_settings(pipeline.config, pipeline.handle, registry())
    assert info.value.plugin == extractor and info.value.field == "dataLayer.sources.1.extractors.0.pluginRef"


# ------------------------------------------------------------------ scores from a hand-filled index


def _precise(cls: type = PrecisePrefixCacheProducer, raw: dict | None = None) -> Any:
    handle = Handle()
    handle.add(TokenProducer("tp", TokenProducer.Params.model_validate({"modelName": "m"}), handle))
    plugin = cls("cache", cls.Params.model_validate({"tokenProcessorConfig": {"blockSize": 4}, **(raw or {})}),
                 handle)
    handle.add(plugin)
    plugin.bind(handle)
    return plugin


def _request(tokens: list[int] | None) -> Any:
    r = req("x" * 40)
    r.token_ids = tokens
    return r


TOKENS = list(range(100, 116))  # 4 blocks of 4


def _fill(index: KVBlockIndex, keys: list[int], pod: str, blocks: int, tier: str = "gpu") -> None:
    index.add(keys[:blocks], [PodEntry(pod, tier)])


def test_producer_match_counts_consecutive_blocks_per_endpoint() -> None:
    producer = _precise()
    a, b, c = ep("a", address="10.0.0.1"), ep("b", address="10.0.0.2"), ep("c", address="10.0.0.3")
    keys = producer.processor.keys(TOKENS, "m")
    _fill(producer.index, keys, a.hostport, 4)
    _fill(producer.index, keys, b.hostport, 2)
    producer.index.add(keys[3:], [PodEntry(c.hostport)])  # c holds only the last block: no prefix
    cycle = CycleState()
    producer.produce(cycle, _request(TOKENS), [a, b, c])
    match = cycle[producer.state_key]
    assert match.total_blocks == 4 and match.block_size_tokens == 4
    assert [match.match_blocks(e.name) for e in (a, b, c)] == [4, 2, 0]
    scorer = PrefixCacheScorer("pcs", PrefixCacheScorer.Params.model_validate(
        {"prefixMatchInfoProducerName": "cache"}), Handle())
    handle = Handle()
    handle.add(producer)
    scorer.bind(handle)
    assert scorer.score(cycle, _request(TOKENS), [a, b, c]) == [1.0, 0.5, 0.0]


def test_producer_ignores_other_models_and_endpoints_not_candidates() -> None:
    producer = _precise()
    a, b = ep("a", address="10.0.0.1"), ep("b", address="10.0.0.2")
    _fill(producer.index, producer.processor.keys(TOKENS, "other-model"), a.hostport, 4)
    _fill(producer.index, producer.processor.keys(TOKENS, "m"), b.hostport, 4)
    cycle = CycleState()
    producer.produce(cycle, _request(TOKENS), [a])
    assert cycle[producer.state_key].match_blocks("a") == 0


def test_producer_stores_nothing_without_token_ids() -> None:
    producer = _precise()
    cycle = CycleState()
    producer.produce(cycle, _request(None), [ep("a")])
    assert producer.state_key not in cycle


@pytest.mark.parametrize("tier,backends,expected", [
    ("gpu", None, 1.0), ("cpu", None, 0.8),
    ("cpu", [{"name": "gpu", "weight": 1.0}, {"name": "cpu", "weight": 0.5}], 0.5),
], ids=["gpu", "cpu-default-weight", "cpu-configured-weight"])
def test_legacy_scorer_weights_tiers(tier: str, backends: list | None, expected: float) -> None:
    raw = {"indexerConfig": {"kvCacheBackendConfigs": backends}} if backends else {}
    scorer = _precise(PrecisePrefixCacheScorer, raw)
    a, b = ep("a", address="10.0.0.1"), ep("b", address="10.0.0.2")
    _fill(scorer.index, scorer.processor.keys(TOKENS, "m"), a.hostport, 4, tier)
    cycle = CycleState()
    scorer.produce(cycle, _request(TOKENS), [a, b])
    assert scorer.score(cycle, _request(TOKENS), [a, b]) == pytest.approx([expected, 0.0])


def test_a_block_on_two_tiers_counts_its_best_tier() -> None:
    scorer = _precise(PrecisePrefixCacheScorer)
    a = ep("a", address="10.0.0.1")
    keys = scorer.processor.keys(TOKENS, "m")
    _fill(scorer.index, keys, a.hostport, 4, "cpu")
    _fill(scorer.index, keys, a.hostport, 2, "gpu")
    cycle = CycleState()
    scorer.produce(cycle, _request(TOKENS), [a])
    assert scorer.score(cycle, _request(TOKENS), [a]) == pytest.approx([(2 * 1.0 + 2 * 0.8) / 4])


async def test_removed_endpoint_is_forgotten_with_its_bare_address_entries() -> None:
    """Global-socket mode files events under the topic's id, which may be a bare address: when the endpoint
    leaves the pool, those entries go too (unless another endpoint still has the address)."""
    producer = _precise(raw={"kvEventsConfig": {"discoverPods": False}})
    store = Datastore()
    store.replace_all([EndpointSpec(name="a", address="10.0.0.1", port=8000),
                       EndpointSpec(name="b", address="10.0.0.2", port=8000),
                       EndpointSpec(name="b2", address="10.0.0.2", port=8001)])
    await producer.start(store)
    try:
        keys = producer.processor.keys(TOKENS, "m")
        for pod in ("10.0.0.1", "10.0.0.1:8000", "10.0.0.2"):
            producer.index.add(keys, [PodEntry(pod)])
        store.remove("a")
        store.remove("b")
        assert sorted(producer.index.pods()) == ["10.0.0.2"]  # b2 still has that address
    finally:
        await producer.stop()


async def test_discover_pods_subscribes_each_endpoint_at_socket_port_plus_rank() -> None:
    producer = _precise(raw={"kvEventsConfig": {"podDiscoveryConfig": {"socketPort": 6000}}})
    store = Datastore()
    store.replace_all([EndpointSpec(name="pod-rank-0", address="10.0.0.1", port=8000),
                       EndpointSpec(name="pod-rank-1", address="10.0.0.1", port=8001)])
    await producer.start(store)
    try:
        store.upsert(EndpointSpec(name="v6", address="fd00::1", port=8000))
        assert producer.subscriber_addresses() == {"pod-rank-0": "tcp://10.0.0.1:6000",
                                                   "pod-rank-1": "tcp://10.0.0.1:6001",
                                                   "v6": "tcp://[fd00::1]:6000"}
        store.remove("pod-rank-1")
        assert set(producer.subscriber_addresses()) == {"pod-rank-0", "v6"}
    finally:
        await producer.stop()


def test_speculative_entries_expire_after_the_ttl() -> None:
    producer = _precise(raw={"speculativeIndexing": True, "speculativeTTL": "50ms"})
    a, b = ep("a", address="10.0.0.1"), ep("b", address="10.0.0.2")
    cycle = CycleState()
    producer.produce(cycle, _request(TOKENS), [a, b])
    result = SchedulingResult({"default": ProfileRunResult([b])}, "default", cycle=cycle)
    producer.pre_request(_request(TOKENS), result)
    again = CycleState()
    producer.produce(again, _request(TOKENS), [a, b])
    assert again[producer.state_key].match_blocks("b") == 4
    time.sleep(0.06)  # past the TTL (monotonic clock)
    later = CycleState()
    producer.produce(later, _request(TOKENS), [a, b])
    assert later[producer.state_key].match_blocks("b") == 0 and len(producer.index) == 0
