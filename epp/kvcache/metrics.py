"""Prometheus export of the KV-block index's counters under llm-d-kv-cache's names (``enableMetrics``).

``kvcache_index_admissions_total``, ``_evictions_total``, ``_entries`` and ``_hit_rate`` carry the label
``backend="in_memory"``; ``kvcache_index_lookup_requests_total``, ``_lookup_hits_total`` and
``_max_pod_hit_count_total`` none, as llm-d's. A lookup's hits are the longest run of its keys one endpoint holds
from the first (llm-d adds the same number to both hit counters). ``_hit_rate`` is hits over keys looked up, a ratio
in [0, 1] (llm-d divides by lookup calls instead). Values are read from the indexes at scrape time (summed when
several plugins enable metrics).
"""

from __future__ import annotations

from typing import Iterator, Protocol, Sequence

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

__all__ = ["IndexCollector"]

_BACKEND = "in_memory"


class _HasIndexMetrics(Protocol):
    def index_metrics(self) -> dict[str, float]: ...


class IndexCollector(Collector):
    """Collects the ``kvcache_index_*`` families from the given plugins' :meth:`index_metrics`."""

    def __init__(self, plugins: Sequence[_HasIndexMetrics]) -> None:
        self._plugins = list(plugins)

    def collect(self) -> Iterator[Metric]:
        totals: dict[str, float] = {}
        for plugin in self._plugins:
            for key, value in plugin.index_metrics().items():
                totals[key] = totals.get(key, 0.0) + value
        lookups = totals.get("lookup_requests_total", 0.0)
        hits = totals.get("lookup_hits_total", 0.0)
        asked = totals.get("lookup_keys_total", 0.0)
        for name, help_text in (("admissions", "Total number of KV-block admissions"),
                                ("evictions", "Total number of KV-block evictions")):
            fam = CounterMetricFamily(f"kvcache_index_{name}", help_text, labels=["backend"])
            fam.add_metric([_BACKEND], totals.get(f"{name}_total", 0.0))
            yield fam
        yield CounterMetricFamily("kvcache_index_lookup_requests", "Total number of lookup calls", value=lookups)
        yield CounterMetricFamily("kvcache_index_lookup_hits", "Number of keys found in the cache on Lookup()",
                                  value=hits)
        yield CounterMetricFamily("kvcache_index_max_pod_hit_count", "Maximum cache hits on a single pod on "
                                  "Lookup()", value=hits)
        entries = GaugeMetricFamily("kvcache_index_entries", "Current number of keys held in the index",
                                    labels=["backend"])
        entries.add_metric([_BACKEND], totals.get("entries", 0.0))
        yield entries
        rate = GaugeMetricFamily("kvcache_index_hit_rate", "Cumulative block-level hit ratio (keys found / keys "
                                 "looked up) since process start", labels=["backend"])
        rate.add_metric([_BACKEND], hits / asked if asked else 0.0)
        yield rate
