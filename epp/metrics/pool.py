"""The pool gauges, computed from the Datastore at each collection (the reference's ``inference_pool_*`` families and
their ``llm_d_epp_*`` replacements).

Each gauge is exported under both names with the same value: ready endpoints, average KV-cache utilization, queue
size and running requests (label ``name``, the pool) and the per-endpoint queue size; the standard deviations
across the pool have the new names only. Averages and standard deviations are rounded to two decimals. The family
list is in docs/reference-parity.md.
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Callable, Iterator

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from epp.datalayer.datastore import Datastore

__all__ = ["PoolCollector"]

_LEGACY = "inference_pool_"
_LLMD = "llm_d_epp_"
# (legacy suffix, new suffix, HELP): the pool-wide gauges, labelled by the pool's name.
_POOL_GAUGES = (
    ("ready_pods", "ready_endpoints", "The number of ready endpoints in the inference server pool.",
     "The number of ready pods in the inference server pool."),
    ("average_kv_cache_utilization", "average_kv_cache_utilization",
     "The average kv cache utilization for an inference server pool.", None),
    ("average_queue_size", "average_queue_size", "The average number of requests pending in the model server "
     "queue.", None),
    ("average_running_requests", "average_running_requests", "The average number of running requests across "
     "model servers in the pool.", None),
)

# (suffix, HELP) of the spread gauges, new names only.
_STD_DEV_GAUGES = (
    ("std_dev_kv_cache_utilization", "The standard deviation kv cache utilization for an inference server pool."),
    ("std_dev_queue_size", "The standard deviation number of requests pending in the model server queue."),
    ("std_dev_running_requests", "The standard deviation number of running requests across model servers in the "
     "pool."),
)


def _summary(values: list[float]) -> tuple[float, float]:
    """(mean, sample standard deviation) of ``values``, each rounded to two decimals as the reference's
    ``calculateSummary``: the deviation divides by ``n - 1``, at least 1; (0, 0) for no value."""
    n = len(values)
    if not n:
        return 0.0, 0.0
    mean = math.fsum(values) / n
    spread = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / max(1, n - 1))
    return round(mean, 2), round(spread, 2)


class PoolCollector(Collector):
    """The pool gauges (see the module docstring) from the Datastore's endpoints at collection time.

    Only endpoints whose metrics are at most ``staleness`` seconds old (the reference's
    ``--metrics-staleness-threshold``) count: ``ready_pods``/``ready_endpoints`` is how many there are (as the
    reference's ``podsWithFreshMetrics``; an endpoint never scraped is not ready), the averages (KV utilisation,
    queue, running) are over them and 0 when there is none, and the per-endpoint queue sizes have one series per
    such endpoint.
    """

    def __init__(self, datastore: Datastore, *, staleness: float = 2.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.datastore = datastore
        self.staleness = staleness
        self.clock = clock

    def describe(self) -> list[Metric]:
        families: list[Metric] = [family for pair in self._families() for family in pair]
        return families + [GaugeMetricFamily(_LLMD + suffix, text, labels=["name"]) for suffix, text in _STD_DEV_GAUGES]

    def collect(self) -> Iterator[Metric]:
        name = self.datastore.pool_name
        now = self.clock()
        fresh = [ep for ep in self.datastore.endpoints() if ep.metrics.age(now) <= self.staleness]
        kv, waiting, running = (_summary([ep.metrics.kv_usage for ep in fresh]),
                                _summary([float(ep.metrics.waiting) for ep in fresh]),
                                _summary([float(ep.metrics.running) for ep in fresh]))
        *pool, per_endpoint = self._families()
        for (legacy, llmd), value in zip(pool, (len(fresh), kv[0], waiting[0], running[0])):
            legacy.add_metric([name], value)
            llmd.add_metric([name], value)
            yield from (legacy, llmd)
        for (suffix, text), value in zip(_STD_DEV_GAUGES, (kv[1], waiting[1], running[1])):
            family = GaugeMetricFamily(_LLMD + suffix, text, labels=["name"])
            family.add_metric([name], value)
            yield family
        for family in per_endpoint:
            for ep in fresh:
                family.add_metric([name, ep.name], ep.metrics.waiting)
            yield family

    @staticmethod
    def _families() -> list[tuple[GaugeMetricFamily, GaugeMetricFamily]]:
        """(legacy, llm-d) families: the pool-wide gauges, then the per-endpoint queue sizes."""
        out = []
        for legacy, llmd, text, legacy_text in _POOL_GAUGES:
            out.append((GaugeMetricFamily(_LEGACY + legacy, f"[Deprecated: Use {_LLMD}{llmd}] {legacy_text or text}",
                                          labels=["name"]),
                        GaugeMetricFamily(_LLMD + llmd, text, labels=["name"])))
        out.append((GaugeMetricFamily(_LEGACY + "per_pod_queue_size", "The total number of requests pending in the "
                                      "model server queue for each underlying pod.",
                                      labels=["name", "model_server_pod"]),
                    GaugeMetricFamily(_LLMD + "per_endpoint_queue_size", "The total number of requests pending in "
                                      "the model server queue for each underlying endpoint.",
                                      labels=["name", "model_server_endpoint"])))
        return out
