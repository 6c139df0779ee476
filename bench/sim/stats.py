"""Counters and histograms the engine keeps; `metrics.py` renders them as vLLM does.

Plain data with no I/O, so the engine stays pure. Times are simulated seconds.
"""

from __future__ import annotations

from bisect import bisect_left

__all__ = ["EngineStats", "Histogram"]

# Bucket bounds from vllm/v1/metrics/loggers.py.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0,
               2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
                           40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
# A fixed list, whatever max_num_batched_tokens is.
ITERATION_TOKENS_BUCKETS = (1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0,
                            8192.0, 16384.0)


class Histogram:
    """A Prometheus histogram: per-bucket counts (last one is +Inf), sum and count."""

    __slots__ = ("bounds", "counts", "sum", "count")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float, n: int = 1) -> None:
        """Record `value` `n` times."""
        self.counts[bisect_left(self.bounds, value)] += n
        self.sum += value * n
        self.count += n


class EngineStats:
    """Cumulative engine statistics, the source of `/metrics` and of benchmark tables."""

    def __init__(self) -> None:
        self.num_preemptions = 0
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0
        self.finished = {"stop": 0, "length": 0, "abort": 0}
        # Decode requests whose KV could not be pulled from the prefiller named in kv_transfer_params
        # (they recomputed the prompt instead).
        self.kv_load_failures = 0
        self.steps = 0
        self.busy_time = 0.0
        self.seq_time = 0.0  # sum over steps of (sequences in the batch * step duration)
        self.ttft = Histogram(TTFT_BUCKETS)
        self.itl = Histogram(ITL_BUCKETS)
        self.e2e = Histogram(REQUEST_LATENCY_BUCKETS)
        self.queue = Histogram(REQUEST_LATENCY_BUCKETS)
        self.iteration_tokens = Histogram(ITERATION_TOKENS_BUCKETS)

    @property
    def mean_batch_occupancy(self) -> float:
        """Time-weighted mean number of sequences in a running batch."""
        return self.seq_time / self.busy_time if self.busy_time else 0.0
