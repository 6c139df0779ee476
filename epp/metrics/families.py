"""EPP's own Prometheus metrics, under the reference's names and labels.

Everything is registered on a ``prometheus_client.CollectorRegistry`` passed in (no module-level state), so tests
and several EPP instances in one process never collide. The request path makes a handful of calls per request
(:meth:`EppMetrics.record_request`, :meth:`~EppMetrics.scheduled`, :meth:`~EppMetrics.running_inc`,
:meth:`~EppMetrics.record_sizes`, :meth:`~EppMetrics.completed`), each finding its series once per label set; the
class satisfies :class:`epp.scheduling.director.RequestMetrics` and :meth:`EppMetrics.plugin_duration` matches
:data:`epp.scheduling.scheduler.PluginTimer`. Every family is exported under the Inference Extension's deprecated
name and its ``llm_d_epp_*`` replacement, recorded together. Labels fed by what clients send (model names, fairness
id) take bounded values (:class:`~epp.metrics.labels.RequestLabels`). Passive health's ejections are counted per
endpoint and reason (:meth:`EppMetrics.attach_health`). :func:`make_metrics_app` /
:func:`metrics_handler` serve a registry at ``/metrics``. The family catalogue is in docs/reference-parity.md.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from aiohttp import web
from prometheus_client import CollectorRegistry, Gauge
from prometheus_client.exposition import choose_encoder

from epp.metrics.instruments import CounterChild, Family, HistogramChild, LabelCap, counter, gauge, histogram, renamed
from epp.metrics.labels import RequestLabels
from epp.metrics.pool import PoolCollector
from epp.metrics.series import RequestFamilies, RequestSeries

if TYPE_CHECKING:
    from epp.datalayer.datastore import Datastore
    from epp.framework.endpoint import Endpoint
    from epp.framework.plugins import PassiveHealth, ResponseInfo

__all__ = ["EppMetrics", "LLMD", "PoolCollector", "make_metrics_app", "metrics_handler", "rank_pod_name"]

LLMD = "llm_d_epp_"
"""The current reference's metric prefix (its subsystem ``llm_d_epp``)."""

_M = ("model_name", "target_model_name")
_F = (*_M, "fairness_id", "priority")
_DURATION = (0.005, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.25, 1.5, 2, 3, 4, 5, 6, 8, 10, 15, 20, 30, 45, 60,
             120, 180, 240, 300, 360, 480, 600, 900, 1200, 1800, 2700, 3600)
_SIZES = (64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144, 524288, 1048576,
          2097152, 4194304, 8388608, 16777216, 33554432, 67108864, 134217728, 268435456, 536870912, 1073741824)
_RESPONSE_SIZES = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)
_TOKENS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144, 524288,
           1048576)
_OUTPUT_TOKENS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
_NTPOT = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0)
_TTFT = (0.005, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.25, 1.5, 2, 3, 4, 5, 6, 8, 10, 15, 20, 30, 45, 60, 120)
_TPOT = (0.0005, 0.00205, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.125, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 1, 2)
_ITL = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1, 2)
_SCHED = (0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1)
_RATIO = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
_HIT_BYTES = (0, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)
_RANK_SUFFIX = re.compile(r"-rank-\d+$")

FamilyT = TypeVar("FamilyT", bound=Family[Any])


def _dual(factory: Callable[..., FamilyT], legacy: str, suffix: str, text: str, labels: Sequence[str] = (), *,
          registry: CollectorRegistry, llmd_labels: Sequence[str] | None = None, deprecated: bool = True,
          **kwargs: Any) -> FamilyT:
    """``legacy + suffix`` and its successor ``llm_d_epp_<suffix>`` (:func:`epp.metrics.instruments.renamed`)."""
    return renamed(factory, legacy + suffix, LLMD + suffix, text, labels, registry=registry,
                   new_labelnames=llmd_labels, mark=deprecated, **kwargs)


def _split(factory: Callable[..., FamilyT], legacy: str, new: str, text: str, new_text: str,
           labels: Sequence[str], new_labels: Sequence[str], *, registry: CollectorRegistry,
           **kwargs: Any) -> tuple[FamilyT, FamilyT]:
    """A deprecated family ``legacy`` (HELP ``[Deprecated: Use llm_d_epp_<new>] <text>``) and its replacement
    ``llm_d_epp_<new>`` with other labels: two families, recorded through tees."""
    return (factory(legacy, f"[Deprecated: Use {LLMD}{new}] {text}", labels, registry=registry, **kwargs),
            factory(LLMD + new, new_text, new_labels, registry=registry, **kwargs))


def rank_pod_name(endpoint: Endpoint) -> str:
    """The Pod of an endpoint Kubernetes discovery named ``<pod>-rank-<i>`` (one per target port), as the
    reference's ``EndpointMetadata.PodName``; any other name is returned as it is."""
    return _RANK_SUFFIX.sub("", endpoint.name)


class EppMetrics:
    """EPP's metric families on ``registry`` plus the recording methods the request path calls.

    ``pod_name`` (an endpoint's Pod; default: the endpoint's name) and the endpoint's own namespace (else
    ``namespace``) fill those labels of scheduler attempts; ``commit``/``build_ref`` the info gauge. ``labels``
    bounds the values of the model and ``fairness_id`` labels (:mod:`epp.metrics.labels`; default: bounds of its own,
    with ``fairness_ids`` if given, knowing no served model).
    """

    def __init__(self, registry: CollectorRegistry, *, namespace: str = "", commit: str = "", build_ref: str = "",
                 pod_name: Callable[[Endpoint], str] | None = None, fairness_ids: LabelCap | None = None,
                 labels: RequestLabels | None = None) -> None:
        from epp import __version__

        self.registry = registry
        self.labels = labels or RequestLabels(fairness_ids=fairness_ids)
        self.fairness_ids, self.models = self.labels.fairness_ids, self.labels.models
        self.namespace = namespace
        self.pod_name: Callable[[Endpoint], str] = pod_name or _endpoint_name
        self._objective_families(registry)
        self._extension_families(registry)
        self._datalayer_families(registry)
        self._health_families(registry)
        for info in self.info:
            info.labels(commit or "unknown", build_ref or f"v{__version__}").set(1)
        # Label-less families have their one series from the start, as prometheus-client's would.
        self._sched_e2e = self.sched_e2e.labels()
        self._prefix_ratio = self.prefix_ratio.labels()
        self._prefix_bytes = self.prefix_bytes.labels()
        # The request path's series, resolved once per label set instead of once per observation.
        self._series: dict[tuple[str, str, str, int], RequestSeries] = {}
        self._request_families = self._request_pairs()
        # Label sets (as requests sent them) folded into another's series, with requests running: their running
        # gauge is decremented where it was incremented even if a model they name became served meanwhile.
        self._pinned: dict[tuple[str, str, str, int], _Pinned] = {}
        self._attempts: dict[tuple[str, str, int], CounterChild] = {}
        self._plugins: dict[tuple[str, str, str], HistogramChild] = {}
        self._pool: PoolCollector | None = None

    def _objective_families(self, r: CollectorRegistry) -> None:
        obj = "inference_objective_"
        self.requests, self.llmd_requests = _split(
            counter, obj + "request_total", "request_total", "Counter of inference objective requests broken out "
            "for each model and target model.", "Total number of processed requests.", (*_M, "priority"), _F,
            registry=r)
        self.errors, self.llmd_errors = _split(
            counter, obj + "request_error_total", "request_error_total", "Counter of inference objective requests "
            "errors broken out for each model and target model.", "Total number of request errors.",
            (*_M, "error_code"), (*_F, "error_code"), registry=r)
        self.duration, self.llmd_duration = _split(
            histogram, obj + "request_duration_seconds", "request_duration_seconds", "Inference objective response "
            "latency distribution in seconds for each model and target model.", "End-to-end request latency "
            "distribution in seconds.", _M, _F, buckets=_DURATION, registry=r)
        self.request_sizes, self.llmd_request_sizes = _split(
            histogram, obj + "request_sizes", "request_size_bytes", "Inference objective requests size distribution "
            "in bytes for each model and target model.", "Incoming request body size distribution in bytes.", _M, _F,
            buckets=_SIZES, registry=r)
        self.response_sizes, self.llmd_response_sizes = _split(
            histogram, obj + "response_sizes", "response_size_bytes", "Inference objective responses size "
            "distribution in bytes for each model and target model.", "Outgoing response body size distribution in "
            "bytes.", _M, _F, buckets=_RESPONSE_SIZES, registry=r)
        self.input_tokens, self.llmd_input_tokens = _split(
            histogram, obj + "input_tokens", "request_input_tokens", "Inference objective input token count "
            "distribution for requests in each model.", "Input token count distribution per request.", _M, _F,
            buckets=_TOKENS, registry=r)
        self.output_tokens, self.llmd_output_tokens = _split(
            histogram, obj + "output_tokens", "request_output_tokens", "Inference objective output token count "
            "distribution for requests in each model.", "Output token count distribution per request.", _M, _F,
            buckets=_OUTPUT_TOKENS, registry=r)
        self.cached_tokens, self.llmd_cached_tokens = _split(
            histogram, obj + "prompt_cached_tokens", "request_cached_tokens", "Inference objective prompt cached "
            "token count distribution for requests in each model.", "Distribution of prompt tokens read from cache "
            "per request, as reported by the model server in the response.", _M, _F, buckets=_TOKENS, registry=r)
        self.running, self.llmd_running = _split(
            gauge, obj + "running_requests", "request_running", "Inference objective number of running requests in "
            "each model.", "Current number of active running requests.", ("model_name",), _F, registry=r)
        self.ntpot, self.llmd_ntpot = _split(
            histogram, obj + "normalized_time_per_output_token_seconds", "request_ntpot_seconds", "Inference "
            "objective latency divided by number of output tokens in seconds for each model and target model.",
            "Normalized time per output token in seconds (end-to-end latency divided by output token count).", _M,
            _F, buckets=_NTPOT, registry=r)
        self.ttft = histogram(LLMD + "request_ttft_seconds", "Time to first token in seconds, measured from request "
                              "received to first response byte. For non-streaming requests, this equals total "
                              "request duration.", (*_F, "streaming"), buckets=_TTFT, registry=r)
        self.tpot = histogram(LLMD + "request_streaming_tpot_seconds", "Average time per output token in seconds "
                              "for streaming requests, computed as (e2e - TTFT) / (output_tokens - 1).", _F,
                              buckets=_TPOT, registry=r)
        self.itl = histogram(LLMD + "request_streaming_itl_seconds", "Inter-token latency in seconds for streaming "
                             "requests, measured as the time between consecutive response body chunks.", _F,
                             buckets=_ITL, registry=r)

    def _request_pairs(self) -> RequestFamilies:
        """The request families as :class:`~epp.metrics.series.RequestSeries` binds them."""
        return RequestFamilies(
            counts={"requests": (self.requests, self.llmd_requests), "running": (self.running, self.llmd_running)},
            histograms={"duration": (self.duration, self.llmd_duration),
                        "request_sizes": (self.request_sizes, self.llmd_request_sizes),
                        "response_sizes": (self.response_sizes, self.llmd_response_sizes),
                        "input_tokens": (self.input_tokens, self.llmd_input_tokens),
                        "output_tokens": (self.output_tokens, self.llmd_output_tokens),
                        "cached_tokens": (self.cached_tokens, self.llmd_cached_tokens),
                        "ntpot": (self.ntpot, self.llmd_ntpot)},
            new_only={"tpot": self.tpot, "itl": self.itl}, ttft=self.ttft, errors=(self.errors, self.llmd_errors))

    def _extension_families(self, r: CollectorRegistry) -> None:
        ext = "inference_extension_"
        self.sched_e2e = _dual(histogram, ext, "scheduler_e2e_duration_seconds", "End-to-end scheduling latency "
                               "distribution in seconds.", buckets=_SCHED, registry=r)
        self.sched_attempts = _dual(counter, ext, "scheduler_attempts_total", "Total number of scheduling "
                                    "attempts.", ("status", "target_model_name", "pod_name", "namespace", "port"),
                                    llmd_labels=("status", "target_model_name", "endpoint_name", "namespace",
                                                 "port"), registry=r)
        self.plugin_latency = _dual(histogram, ext, "plugin_duration_seconds", "Plugin processing latency "
                                    "distribution in seconds for each extension point, plugin type and plugin name.",
                                    ("extension_point", "plugin_type", "plugin_name"), buckets=_SCHED, registry=r)
        self.prefix_size = Gauge(ext + "prefix_indexer_size", "Size of the prefix indexer.", registry=r)
        self.prefix_ratio = histogram(ext + "prefix_indexer_hit_ratio", "Ratio of prefix length matched to total "
                                      "prefix length in the cache lookup.", buckets=_RATIO, registry=r)
        self.prefix_bytes = histogram(ext + "prefix_indexer_hit_bytes", "Length of the prefix match in number of "
                                      "bytes in the cache lookup.", buckets=_HIT_BYTES, registry=r)
        self.rewrites = _dual(counter, ext, "model_rewrite_decisions_total", "Total number of inference model "
                              "rewrite decisions.", ("model_rewrite_name", "model_name", "target_model"),
                              deprecated=False, registry=r)
        # prometheus-client gauges, not instruments: ``--workers`` peers must not add their info series up.
        info = "General information of the current build of Inference Extension."
        self.info = (Gauge(ext + "info", info, ("commit", "build_ref"), registry=r),
                     Gauge(LLMD + "info", info, ("commit", "build_ref"), registry=r))

    def _datalayer_families(self, r: CollectorRegistry) -> None:
        legacy = "llm_d_inference_scheduler_"
        self.poll_errors = _dual(counter, legacy, "datalayer_poll_errors_total", "Data-source poll errors per "
                                 "source type.", ("source_type",), registry=r)
        self.extract_errors = _dual(counter, legacy, "datalayer_extract_errors_total", "Extract errors per "
                                    "source/extractor type.", ("source_type", "extractor_type"), registry=r)

    def _health_families(self, r: CollectorRegistry) -> None:
        # New families (no reference name to keep): the endpoint label is the scheduler-attempts one, bounded by the
        # pool; the reasons are the plugin's few (consecutive_failures, failure_rate, probe_failed).
        self.ejections = counter(LLMD + "endpoint_ejections_total", "Endpoints ejected by passive health (outlier "
                                 "detection), by endpoint and reason.", ("endpoint_name", "reason"), registry=r)
        self.ejected = gauge(LLMD + "ejected_endpoints", "Endpoints passive health has ejected now (with "
                             "--workers: summed over the worker processes, each ejecting on what it sees).",
                             ("name",), registry=r)
        self._ejected_names: set[str] = set()

    def attach_health(self, health: PassiveHealth, pool_name: str) -> None:
        """Count ``health``'s ejections and keep the ejected-endpoints gauge of pool ``pool_name``."""
        gauge_child = self.ejected.labels(pool_name)
        gauge_child.set(0)

        def changed(endpoint: Endpoint, reason: str | None) -> None:
            if reason is None:
                self._ejected_names.discard(endpoint.name)
            else:
                self._ejected_names.add(endpoint.name)  # a failed probe ejects again: a set, not a count
                self.ejections.labels(endpoint.name, reason).inc()
            gauge_child.set(len(self._ejected_names))

        health.on_ejection(changed)

    # -- request path ------------------------------------------------------------------------------------------

    def families(self) -> list[Family[Any]]:
        """The request path's metric families (what ``--workers`` peers report to worker 0); the ``llm_d_epp_*``
        twins are not listed, as they show their legacy family's series, peers' included."""
        return [value for value in vars(self).values() if isinstance(value, Family) and value.twin_of is None]

    def series(self, model: str, target: str, fairness_id: str, priority: int) -> RequestSeries:
        """The request-path series of this label set (the values as the request sent them, bounded here by
        :attr:`labels`), kept for the next request with it; a set folded into ``other`` values shares that set's
        series. The one place every request family's labels are chosen, for both front ends."""
        s = self._series.get((model, target, fairness_id, priority))
        if s is None:
            key = (*self.labels(model, target, fairness_id), priority)
            s = self._series.get(key)
            if s is None:
                s = self._series[key] = RequestSeries(self._request_families, *key)
        return s

    def record_request(self, model: str, target: str, priority: int, fairness_id: str = "") -> None:
        """One request received (after parsing)."""
        s = self._series.get((model, target, fairness_id, priority)) or self.series(model, target, fairness_id,
                                                                                     priority)
        (s.requests or s.bind_count("requests")).inc()

    def completed(self, model: str, target: str, seconds: float, info: ResponseInfo, fairness_id: str = "",
                  priority: int = 0, ttft: float | None = None) -> None:
        """A request ended, in any way: the request path's one call for what :meth:`running_dec`,
        :meth:`record_duration` and, unless ``info.error``, :meth:`record_tokens`, :meth:`record_ntpot` and
        :meth:`observe_ttft` record (an error's code is recorded by :meth:`record_error`). ``ttft``: seconds from
        the request to its first response byte, if one came; a streamed answer's TTFT and TPOT are recorded from
        it, any other's TTFT is ``seconds`` (as the reference)."""
        key = (model, target, fairness_id, priority)
        s = self._series.get(key) or self.series(model, target, fairness_id, priority)
        if model:
            run = self._unpin(key, s) if self._pinned else s
            (run.running or run.bind_count("running")).dec()
        if seconds > 0:
            (s.duration or s.bind_histogram("duration")).observe(seconds)
        if info.error:
            return
        completion = info.completion_tokens
        if info.streamed:
            if ttft is not None and ttft > 0:
                (s.ttft.get(True) or s.bind_ttft(True)).observe(ttft)
                if completion and completion > 1 and seconds > ttft:
                    (s.tpot or s.bind_new("tpot")).observe((seconds - ttft) / (completion - 1))
        elif seconds > 0:
            (s.ttft.get(False) or s.bind_ttft(False)).observe(seconds)
        prompt, cached = info.prompt_tokens, info.cached_tokens
        if prompt:
            (s.input_tokens or s.bind_histogram("input_tokens")).observe(prompt)
            if cached is not None and cached >= 0:
                (s.cached_tokens or s.bind_histogram("cached_tokens")).observe(cached)
        if completion:
            (s.output_tokens or s.bind_histogram("output_tokens")).observe(completion)
            if completion > 0 and seconds > 0:
                (s.ntpot or s.bind_histogram("ntpot")).observe(seconds / completion)

    def record_model_rewrite(self, rewrite_name: str, model: str, target: str) -> None:
        """An InferenceModelRewrite sent a request for ``model`` to ``target``."""
        self.rewrites.labels(rewrite_name, self.models(model), self.models(target)).inc()

    def record_error(self, model: str, target: str, code: str, fairness_id: str = "", priority: int = 0) -> None:
        """One request failed with ``code`` (an :class:`~epp.errors.ErrorCode` value); empty codes are ignored."""
        if code:
            s = self.series(model, target, fairness_id, priority)
            (s.errors.get(code) or s.bind_error(code)).inc()

    def record_duration(self, model: str, target: str, seconds: float, fairness_id: str = "",
                        priority: int = 0) -> None:
        """Request received to response complete; non-positive durations are dropped (as the reference)."""
        if seconds > 0:
            s = self.series(model, target, fairness_id, priority)
            (s.duration or s.bind_histogram("duration")).observe(seconds)

    def record_sizes(self, model: str, target: str, request_bytes: int | None, response_bytes: int | None,
                     fairness_id: str = "", priority: int = 0) -> None:
        """Request and response body sizes in bytes (None = unknown, not observed)."""
        s = self._series.get((model, target, fairness_id, priority)) or self.series(model, target, fairness_id,
                                                                                     priority)
        if request_bytes is not None:
            (s.request_sizes or s.bind_histogram("request_sizes")).observe(request_bytes)
        if response_bytes is not None:
            (s.response_sizes or s.bind_histogram("response_sizes")).observe(response_bytes)

    def record_tokens(self, model: str, target: str, prompt: int | None, completion: int | None,
                      cached: int | None, fairness_id: str = "", priority: int = 0) -> None:
        """Token usage of a completed response; counts that are None or not positive are not observed."""
        s = self.series(model, target, fairness_id, priority)
        if prompt:
            (s.input_tokens or s.bind_histogram("input_tokens")).observe(prompt)
        if completion:
            (s.output_tokens or s.bind_histogram("output_tokens")).observe(completion)
        if cached is not None and cached >= 0 and prompt:
            (s.cached_tokens or s.bind_histogram("cached_tokens")).observe(cached)

    def record_ntpot(self, model: str, target: str, seconds: float, completion: int | None, fairness_id: str = "",
                     priority: int = 0) -> None:
        """Normalized time per output token: request duration / output tokens (skipped without tokens)."""
        if completion and completion > 0 and seconds > 0:
            s = self.series(model, target, fairness_id, priority)
            (s.ntpot or s.bind_histogram("ntpot")).observe(seconds / completion)

    def running_inc(self, model: str, target: str = "", fairness_id: str = "", priority: int = 0) -> None:
        """A request for ``model`` started (dispatched upstream)."""
        if model:
            key = (model, target, fairness_id, priority)
            s = self._series.get(key) if not self._pinned else self._pin(key)
            if s is None:
                s = self.series(model, target, fairness_id, priority)
                if key not in self._series:  # folded: keep the series until the last such request ends
                    self._pinned[key] = _Pinned(s)
            (s.running or s.bind_count("running")).inc()

    def running_dec(self, model: str, target: str = "", fairness_id: str = "", priority: int = 0) -> None:
        """A request for ``model`` finished, in any way."""
        if model:
            key = (model, target, fairness_id, priority)
            s = self._unpin(key, self.series(model, target, fairness_id, priority))
            (s.running or s.bind_count("running")).dec()

    def _pin(self, key: tuple[str, str, str, int]) -> RequestSeries | None:
        """The series a running request of ``key`` was counted in, if it was folded (one more is now running),
        else the series of ``key`` if it has one."""
        entry = self._pinned.get(key)
        if entry is None:
            return self._series.get(key)
        entry.running += 1
        return entry.series

    def _unpin(self, key: tuple[str, str, str, int], s: RequestSeries) -> RequestSeries:
        """The series a request of ``key`` ending now was counted running in: its pinned one, else ``s``."""
        entry = self._pinned.get(key)
        if entry is None:
            return s
        entry.running -= 1
        if not entry.running:
            del self._pinned[key]
        return entry.series

    def observe_ttft(self, model: str, target: str, seconds: float, streaming: bool = True, fairness_id: str = "",
                     priority: int = 0) -> None:
        """Time to first token, as EPP saw it (:meth:`completed` records it on the request path)."""
        if seconds >= 0:
            s = self.series(model, target, fairness_id, priority)
            (s.ttft.get(streaming) or s.bind_ttft(streaming)).observe(seconds)

    def observe_itl(self, model: str, target: str, seconds: float, fairness_id: str = "", priority: int = 0) -> None:
        """Gap between two streamed response chunks, as EPP saw it."""
        if seconds >= 0:
            self.itl_series(model, target, fairness_id, priority).observe(seconds)

    def itl_series(self, model: str, target: str, fairness_id: str = "", priority: int = 0) -> HistogramChild:
        """The inter-chunk latency series of this label set, for a request to keep and observe into per chunk (the
        request path's per-token call: no label lookup)."""
        s = self.series(model, target, fairness_id, priority)
        return s.itl or s.bind_new("itl")

    # -- scheduler ---------------------------------------------------------------------------------------------

    def scheduler_e2e(self, seconds: float) -> None:
        """Duration of one scheduling cycle."""
        self._sched_e2e.observe(seconds)

    def scheduled(self, target_model: str, endpoint: Endpoint, seconds: float) -> None:
        """A successful scheduling cycle of ``seconds`` that chose ``endpoint``: the request path's one call for
        :meth:`scheduler_e2e` and a ``success`` :meth:`scheduler_attempt`."""
        self._sched_e2e.observe(seconds)
        key = (target_model, endpoint.name, endpoint.port)
        child = self._attempts.get(key)
        if child is None:
            label = self.models(target_model)
            key = (label, endpoint.name, endpoint.port)  # a folded name is not kept: clients choose those
            child = self._attempts.get(key)
            if child is None:
                child = self._attempts[key] = self.sched_attempts.labels("success", label, self.pod_name(endpoint),
                                                                         endpoint.spec.namespace or self.namespace,
                                                                         str(endpoint.port))
        child.inc()

    def scheduler_attempt(self, status: str, target_model: str, endpoint: Endpoint | None) -> None:
        """A scheduling attempt (``success``/``failure``) and the endpoint chosen, if any."""
        target_model = self.models(target_model)
        if endpoint is None:
            self.sched_attempts.labels(status, target_model, "", "", "").inc()
        else:
            self.sched_attempts.labels(status, target_model, self.pod_name(endpoint),
                                       endpoint.spec.namespace or self.namespace, str(endpoint.port)).inc()

    def plugin_duration(self, point: str, plugin_type: str, name: str, seconds: float) -> None:
        """A plugin call's duration (the :data:`epp.scheduling.scheduler.PluginTimer` signature)."""
        child = self._plugins.get((point, plugin_type, name))
        if child is None:
            child = self._plugins[(point, plugin_type, name)] = self.plugin_latency.labels(point, plugin_type, name)
        child.observe(seconds)

    # -- prefix indexer ----------------------------------------------------------------------------------------

    def set_prefix_indexer_size(self, size: Callable[[], float]) -> None:
        """Read ``inference_extension_prefix_indexer_size`` from ``size()`` at every collection."""
        self.prefix_size.set_function(size)

    def observe_prefix_match(self, matched: int, total: int) -> None:
        """One prefix-indexer lookup: ``matched`` of ``total`` prefix bytes (hit ratio only when total > 0)."""
        self._prefix_bytes.observe(matched)
        if total > 0:
            self._prefix_ratio.observe(matched / total)

    # -- data layer --------------------------------------------------------------------------------------------

    def datalayer_poll_error(self, source_type: str) -> None:
        """A data source of type ``source_type`` failed to poll an endpoint (``...datalayer_poll_errors_total``)."""
        self.poll_errors.labels(source_type).inc()

    def datalayer_extract_error(self, source_type: str, extractor_type: str) -> None:
        """An extractor of type ``extractor_type`` failed on a ``source_type`` response
        (``...datalayer_extract_errors_total``)."""
        self.extract_errors.labels(source_type, extractor_type).inc()

    # -- pool --------------------------------------------------------------------------------------------------

    def attach_pool(self, datastore: Datastore, *, staleness: float = 2.0) -> PoolCollector:
        """Register the pool gauges (``inference_pool_*`` and their ``llm_d_epp_*`` twins), computed from
        ``datastore`` at each collection."""
        if self._pool is not None:
            self.registry.unregister(self._pool)
        self._pool = PoolCollector(datastore, staleness=staleness)
        self.registry.register(self._pool)
        return self._pool


class _Pinned:
    """A folded label set's series and how many of its requests are running (counted in it)."""

    __slots__ = ("series", "running")

    def __init__(self, series: RequestSeries) -> None:
        self.series, self.running = series, 1


def _endpoint_name(endpoint: Endpoint) -> str:
    return endpoint.name


def metrics_handler(registry: CollectorRegistry) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """An aiohttp handler serving ``registry`` (mount it at ``/metrics`` on any app)."""

    async def handle(request: web.Request) -> web.Response:
        encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
        body = encoder(registry)
        resp = web.Response(body=body, headers={"Content-Type": content_type})
        if "gzip" in request.headers.get("Accept-Encoding", ""):
            resp.enable_compression(web.ContentCoding.gzip)
        return resp

    return handle


def make_metrics_app(registry: CollectorRegistry, middlewares: Sequence[Any] = ()) -> web.Application:
    """An aiohttp application serving ``registry`` at ``GET /metrics`` (for the ``--metrics-port`` server), behind
    ``middlewares`` (the metrics port's authentication, when on)."""
    app = web.Application(middlewares=list(middlewares))
    app.router.add_get("/metrics", metrics_handler(registry))
    return app
