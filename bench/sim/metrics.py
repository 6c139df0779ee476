"""`/metrics` in vLLM V1's Prometheus text exposition, built by hand because it is cheap.

Names, HELP text, label sets and bucket bounds follow `vllm/v1/metrics/loggers.py`, and
the layout follows prometheus_client's `generate_latest` (labels sorted, counters as
`_total` plus a `_created` gauge family, histograms with `_bucket`/`_count`/`_sum`).
A histogram's text is rebuilt only when its count changed, so a scrape costs a few
tens of microseconds however often the gateway polls.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import TYPE_CHECKING

from prometheus_client.utils import floatToGoString

from .stats import EngineStats, Histogram

if TYPE_CHECKING:
    from .config import SimConfig
    from .engine import Engine

__all__ = ["MetricsRenderer"]

_GAUGES = (
    ("vllm:num_requests_running", "Number of requests in model execution batches."),
    ("vllm:num_requests_waiting", "Number of requests waiting to be processed."),
    ("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."),
)
_V0_USAGE = ("vllm:gpu_cache_usage_perc", "GPU KV-cache usage. 1 means 100 percent usage.")
_COUNTERS = (
    ("vllm:num_preemptions", "Cumulative number of preemption from the engine.", "num_preemptions"),
    ("vllm:prompt_tokens", "Number of prefill tokens processed.", "prompt_tokens"),
    ("vllm:generation_tokens", "Number of generation tokens processed.", "generation_tokens"),
    (
        "vllm:prefix_cache_queries",
        "Prefix cache queries, in terms of number of queried tokens.",
        "prefix_cache_queries",
    ),
    (
        "vllm:prefix_cache_hits",
        "Prefix cache hits, in terms of number of cached tokens.",
        "prefix_cache_hits",
    ),
)
_SUCCESS = ("vllm:request_success", "Count of successfully processed requests.")
_HISTOGRAMS = (
    ("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", "ttft"),
    ("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", "itl"),
    ("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", "e2e"),
    (
        "vllm:request_queue_time_seconds",
        "Histogram of time spent in WAITING phase for request.",
        "queue",
    ),
    (
        "vllm:iteration_tokens_total",
        "Histogram of number of tokens per engine_step.",
        "iteration_tokens",
    ),
)
_MAX_LORA_SERIES = 16


def _esc(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _labels(pairs: dict[str, str]) -> str:
    return "{" + ",".join(f'{k}="{_esc(v)}"' for k, v in sorted(pairs.items())) + "}"


def _head(name: str, doc: str, kind: str) -> str:
    return f"# HELP {name} {doc}\n# TYPE {name} {kind}\n"


def _num(value: float) -> str:
    return floatToGoString(value)


class _HistogramText:
    """Cached exposition of one histogram."""

    def __init__(self, name: str, doc: str, bounds: tuple[float, ...], base: dict[str, str]):
        self.head = _head(name, doc, "histogram")
        self.buckets = [
            f"{name}_bucket{_labels({**base, 'le': _num(b)})} " for b in (*bounds, float("inf"))
        ]
        lab = _labels(base)
        self.count_prefix = f"{name}_count{lab} "
        self.sum_prefix = f"{name}_sum{lab} "
        self.created = f"{_head(name + '_created', doc, 'gauge')}{name}_created{lab} "
        self._seen = -1
        self._text = ""

    def render(self, hist: Histogram, created: str) -> str:
        if hist.count != self._seen:
            parts = [self.head]
            acc = 0
            for prefix, n in zip(self.buckets, hist.counts):
                acc += n
                parts.append(f"{prefix}{acc}.0\n")
            parts.append(f"{self.count_prefix}{hist.count}.0\n")
            parts.append(f"{self.sum_prefix}{_num(hist.sum)}\n")
            parts.append(f"{self.created}{created}\n")
            self._text = "".join(parts)
            self._seen = hist.count
        return self._text


class MetricsRenderer:
    """Renders one server's `/metrics` page from its engine."""

    def __init__(self, cfg: SimConfig, engine_index: int = 0) -> None:
        self.cfg = cfg
        base = {"engine": str(engine_index), "model_name": cfg.model}
        self._lab = lab = _labels(base)
        self._created = _num(time.time())
        gauges = list(_GAUGES) + ([_V0_USAGE] if cfg.v0_metrics else [])
        self._gauges = [(_head(n, d, "gauge") + f"{n}{lab} ", n) for n, d in gauges]
        self._counters = [
            (
                _head(f"{n}_total", d, "counter") + f"{n}_total{lab} ",
                _head(f"{n}_created", d, "gauge") + f"{n}_created{lab} {self._created}\n",
                attr,
            )
            for n, d, attr in _COUNTERS
        ]
        n, d = _SUCCESS
        self._success_head = _head(f"{n}_total", d, "counter")
        self._success = {
            reason: (
                f"{n}_total{_labels({**base, 'finished_reason': reason})} ",
                f"{n}_created{_labels({**base, 'finished_reason': reason})} {self._created}\n",
            )
            for reason in ("stop", "length", "abort")
        }
        self._success_created_head = _head(f"{n}_created", d, "gauge")
        proto = EngineStats()  # bucket bounds come from here
        self._hists = [
            (_HistogramText(n, d, getattr(proto, attr).bounds, base), attr)
            for n, d, attr in _HISTOGRAMS
        ]
        self._cache_info = _head(
            "vllm:cache_config_info", "Information of the LLMEngine CacheConfig", "gauge"
        ) + "vllm:cache_config_info" + _labels(self._cache_config(engine_index)) + " 1.0\n"
        self._lora_head = _head(
            "vllm:lora_requests_info", "Running stats on lora requests.", "gauge"
        )
        self._lora_series: OrderedDict[tuple[str, str], float] = OrderedDict()

    def _cache_config(self, engine_index: int) -> dict[str, str]:
        cfg = self.cfg
        return {
            "block_size": str(cfg.block_size),
            "cache_dtype": "auto",
            "calculate_kv_scales": "False",
            "cpu_offload_gb": "0",
            "enable_prefix_caching": str(cfg.enable_prefix_caching),
            "engine": str(engine_index),
            "gpu_memory_utilization": "0.9",
            "is_attention_free": "False",
            "kv_sharing_fast_prefill": "False",
            "num_cpu_blocks": "None",
            "num_gpu_blocks": str(cfg.num_gpu_blocks),
            "num_gpu_blocks_override": "None",
            "prefix_caching_hash_algo": "xxh3_64",
            "sliding_window": "None",
            "swap_space": "4",
            "swap_space_bytes": "4294967296",
        }

    def render(self, engine: Engine) -> bytes:
        """The whole exposition text."""
        stats = engine.stats
        running = len(engine.running)
        waiting = engine.num_waiting
        usage = engine.kv_usage
        values = [running, waiting, usage, usage]
        out = [self._cache_info]
        for (text, _), value in zip(self._gauges, values):
            out.append(f"{text}{_num(value)}\n")
        # V1 exports LoRA info only with --enable-lora; V0 always did, with max_lora "0" when LoRA was off.
        if self.cfg.enable_lora or self.cfg.v0_metrics:
            out.append(self._lora_text(engine))
        for head, created, attr in self._counters:
            out.append(f"{head}{getattr(stats, attr)}.0\n")
            out.append(created)
        out.append(self._success_head)
        for reason, (prefix, _) in self._success.items():
            out.append(f"{prefix}{stats.finished[reason]}.0\n")
        out.append(self._success_created_head)
        for _, created in self._success.values():
            out.append(created)
        for hist_text, attr in self._hists:
            out.append(hist_text.render(getattr(stats, attr), self._created))
        return "".join(out).encode()

    def _lora_text(self, engine: Engine) -> str:
        # vLLM sets a new label combination to the current time on every update and never
        # removes old ones; readers take the series with the largest value.
        running = sorted({s.lora for s in engine.running if s.lora is not None})
        waiting = sorted(
            {s.lora for s in engine.waiting if s.lora is not None}
            | {s.lora for s in engine.transferring if s.lora is not None}
        )
        key = (",".join(running), ",".join(waiting))
        series = self._lora_series
        series[key] = time.time()
        series.move_to_end(key)
        while len(series) > _MAX_LORA_SERIES:
            series.popitem(last=False)
        max_lora = str(self.cfg.max_loras) if self.cfg.enable_lora else "0"
        lines = [self._lora_head]
        for (run, wait), ts in series.items():
            labels = {
                "max_lora": max_lora,
                "running_lora_adapters": run,
                "waiting_lora_adapters": wait,
            }
            lines.append(f"vllm:lora_requests_info{_labels(labels)} {_num(ts)}\n")
        return "".join(lines)
