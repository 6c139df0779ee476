"""The ``kvcache_index_*`` families, scraped through a real prometheus_client registry."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from epp.framework.plugins import Handle
from epp.kvcache import PodEntry
from epp.kvcache.metrics import IndexCollector
from epp.plugins.producers.precise_prefix_cache import PrecisePrefixCacheProducer

A, B = "10.0.0.1:8000", "10.0.0.2:8000"


def producer(name: str) -> PrecisePrefixCacheProducer:
    params = PrecisePrefixCacheProducer.Params.model_validate(
        {"indexerConfig": {"kvBlockIndexConfig": {"enableMetrics": True}}})
    return PrecisePrefixCacheProducer(name, params, Handle())


def scrape(*plugins: PrecisePrefixCacheProducer) -> tuple[bytes, dict[tuple[str, tuple[tuple[str, str], ...]], float]]:
    registry = CollectorRegistry()
    registry.register(IndexCollector(plugins))
    text = generate_latest(registry)
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for fam in text_string_to_metric_families(text.decode()) for s in fam.samples}
    return text, samples


BACKEND = (("backend", "in_memory"),)


def test_an_unused_index_exports_zeroes() -> None:
    text, samples = scrape(producer("p"))
    assert samples == {
        ("kvcache_index_admissions_total", BACKEND): 0.0,
        ("kvcache_index_evictions_total", BACKEND): 0.0,
        ("kvcache_index_lookup_requests_total", ()): 0.0,
        ("kvcache_index_lookup_hits_total", ()): 0.0,
        ("kvcache_index_max_pod_hit_count_total", ()): 0.0,
        ("kvcache_index_entries", BACKEND): 0.0,
        ("kvcache_index_hit_rate", BACKEND): 0.0,
    }
    assert b"# TYPE kvcache_index_admissions_total counter" in text
    assert b"# TYPE kvcache_index_entries gauge" in text


def test_values_follow_the_index_and_sum_across_plugins() -> None:
    first, second = producer("first"), producer("second")
    keys = first.processor.keys(list(range(64)), "m")  # 4 blocks of 16
    first.index.add(keys, [PodEntry(A)])
    first.index.add(keys[:2], [PodEntry(B)])
    first.index.evict(keys[3], [PodEntry(A)], engine=False)
    first.index.lookup(keys)  # A holds 3 from the first
    first.index.lookup(keys, {B})  # B holds 2
    second.index.add(keys[:1], [PodEntry(B)])
    second.index.lookup(keys)  # 1
    _, samples = scrape(first, second)
    assert samples[("kvcache_index_admissions_total", BACKEND)] == 4 + 2 + 1
    assert samples[("kvcache_index_evictions_total", BACKEND)] == 1
    assert samples[("kvcache_index_entries", BACKEND)] == 3 + 1
    assert samples[("kvcache_index_lookup_requests_total", ())] == 3
    assert samples[("kvcache_index_lookup_hits_total", ())] == 3 + 2 + 1
    assert samples[("kvcache_index_max_pod_hit_count_total", ())] == 6
    assert samples[("kvcache_index_hit_rate", BACKEND)] == 6 / 12


def test_values_are_read_at_scrape_time() -> None:
    plugin = producer("p")
    registry = CollectorRegistry()
    registry.register(IndexCollector([plugin]))
    assert registry.get_sample_value("kvcache_index_entries", {"backend": "in_memory"}) == 0.0
    plugin.index.add(plugin.processor.keys(list(range(32)), "m"), [PodEntry(A)])
    assert registry.get_sample_value("kvcache_index_entries", {"backend": "in_memory"}) == 2.0
    assert registry.get_sample_value("kvcache_index_admissions_total", {"backend": "in_memory"}) == 2.0
