"""EPP's own Prometheus metrics, with the reference's names and labels (llm-d-router ``pkg/epp/metrics``).

Everything is registered on a ``prometheus_client.CollectorRegistry`` passed in (no module-level state), so
tests and several EPP instances in one process never collide. The per-request families are
:mod:`epp.instruments` (lock-free, a few hundred ns per operation); the rest are prometheus-client's. The request
path makes a handful of calls per request (:meth:`EppMetrics.record_request`, :meth:`~EppMetrics.scheduled`,
:meth:`~EppMetrics.running_inc`, :meth:`~EppMetrics.observe_ttft`, :meth:`~EppMetrics.completed`: it satisfies
:class:`epp.director.RequestMetrics`), each finding its series once per label set; the per-family ``record_*``
methods record the same things one family at a time. :meth:`EppMetrics.plugin_duration` matches
:data:`epp.scheduler.PluginTimer`.

**Two names per family**, as the reference registers them (``metrics.go`` and ``llm_d_router_metrics.go``): the
Inference Extension's legacy name, whose HELP starts with ``[Deprecated: Use llm_d_router_epp_X]``, and its
replacement ``llm_d_router_epp_X``, recorded together. The replacement is a :meth:`~epp.instruments.Family.twin`:
it exports the legacy family's own series, so one recording counts under both names at no extra cost. Only NTPOT
differs: its replacement has two more labels (``fairness_id``, ``priority``), so :meth:`EppMetrics.completed`
observes both series through one :class:`~epp.instruments.HistogramTee` per (pair, fairness id, priority).
Measured on 2026-11-22 (``python -m bench.http_instructions --targets round-robin --requests 50``, instructions per
request, JSON / streamed): 454-455 k / 797-799 k before, 456-457 k / 800-801 k after (+0.4 %); the four calls of
one request into this class, counted alone under callgrind: 27.1 k instructions before, 28.3 k after. ``python -m
bench.request_path`` (metrics' share of the Director's lifecycle, round-robin profile) read +17.8 to +24.2 µs
before and +9.7 to +15.2 µs after: below this shared VM's noise.

Families (labels; M = ``model_name, target_model_name``; "legacy → new" where the suffix changes):

- ``inference_objective_request_total`` → ``llm_d_router_epp_request_total`` (M, priority),
  ``..._request_error_total`` (M, error_code), histograms ``..._request_duration_seconds``,
  ``..._request_sizes``, ``..._response_sizes``, ``..._input_tokens``, ``..._output_tokens``,
  ``..._prompt_cached_tokens`` (M), gauge ``..._running_requests`` (model_name);
  ``..._normalized_time_per_output_token_seconds`` (legacy M; new M, fairness_id, priority);
- EPP-observed latency, which the reference does not record by default, under the legacy names only:
  ``inference_objective_request_ttft_seconds`` (the name of the reference's latency-predictor family, whose
  ``llm_d_router_epp_`` twin has plugin labels: :mod:`epp.latency.metrics`) and ``..._request_itl_seconds`` (gap
  between streamed chunks), both M;
- ``inference_pool_ready_pods`` → ``llm_d_router_epp_ready_endpoints``, ``..._average_kv_cache_utilization``,
  ``..._average_queue_size``, ``..._average_running_requests`` (name), ``inference_pool_per_pod_queue_size``
  (name, model_server_pod) → ``llm_d_router_epp_per_endpoint_queue_size`` (name, model_server_endpoint):
  :class:`~epp.pool_metrics.PoolCollector`, computed at collection time from the Datastore
  (:meth:`EppMetrics.attach_pool`);
- ``inference_extension_scheduler_e2e_duration_seconds`` → ``llm_d_router_epp_...``,
  ``..._scheduler_attempts_total`` (status, target_model_name, pod_name → endpoint_name, namespace, port: the
  chosen endpoint's Pod, its namespace and its port), ``..._plugin_duration_seconds`` (extension_point,
  plugin_type, plugin_name), ``..._model_rewrite_decisions_total`` (model_rewrite_name, model_name,
  target_model) and ``..._info`` (commit, build_ref), the last two without the Deprecated mark (as the
  reference);
- ``llm_d_inference_scheduler_datalayer_poll_errors_total`` → ``llm_d_router_epp_...`` (source_type) and
  ``..._datalayer_extract_errors_total`` (source_type, extractor_type): :meth:`EppMetrics.datalayer_poll_error`
  and :meth:`EppMetrics.datalayer_extract_error`, the data layer's
  :class:`~epp.datalayer.scraper.DataLayerErrors`;
- legacy names only, as the reference's prefix-cache plugin registers them: ``inference_extension_prefix_indexer_size``
  (read from a callable), ``..._prefix_indexer_hit_ratio`` and ``..._prefix_indexer_hit_bytes`` (histograms).

:func:`make_metrics_app` / :func:`metrics_handler` serve a registry at ``/metrics`` (text 0.0.4 or OpenMetrics by
``Accept``; gzip when the client accepts it).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Callable, Sequence

from aiohttp import web
from prometheus_client import CollectorRegistry, Gauge
from prometheus_client.exposition import choose_encoder

from .instruments import (DEFAULT_FAIRNESS_ID_LIMIT, Child, Family, HistogramChild, HistogramTee, LabelCap, counter,
                          gauge, histogram, renamed)
from .pool_metrics import PoolCollector

if TYPE_CHECKING:
    from epp.datastore import Datastore
    from epp.endpoint import Endpoint
    from epp.framework import ResponseInfo

__all__ = ["EppMetrics", "LLMD", "PoolCollector", "make_metrics_app", "metrics_handler", "rank_pod_name"]

LLMD = "llm_d_router_epp_"
"""The current reference's metric prefix (its subsystem ``llm_d_router_epp``)."""

_M = ("model_name", "target_model_name")
_DURATION = (0.005, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.25, 1.5, 2, 3, 4, 5, 6, 8, 10, 15, 20, 30, 45, 60,
             120, 180, 240, 300, 360, 480, 600, 900, 1200, 1800, 2700, 3600)
_SIZES = (64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144, 524288, 1048576,
          2097152, 4194304, 8388608, 16777216, 33554432, 67108864, 134217728, 268435456, 536870912, 1073741824)
_RESPONSE_SIZES = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32778, 65536)
_INPUT_TOKENS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32778, 65536, 131072, 262144,
                 524288, 1048576)
_OUTPUT_TOKENS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
_NTPOT = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0)
_TTFT = _DURATION  # the reference's buckets for its (latency-predictor) metric of the same name
_ITL = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0)
_SCHED = (0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1)
_RATIO = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
_HIT_BYTES = (0, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)
_RANK_SUFFIX = re.compile(r"-rank-\d+$")


def _dual(factory: Callable[..., Family], legacy: str, suffix: str, text: str, labels: Sequence[str] = (), *,
          registry: CollectorRegistry, llmd_labels: Sequence[str] | None = None, deprecated: bool = True,
          **kwargs: Any) -> Family:
    """``legacy + suffix`` and its successor ``llm_d_router_epp_<suffix>`` (:func:`epp.instruments.renamed`)."""
    return renamed(factory, legacy + suffix, LLMD + suffix, text, labels, registry=registry,
                   new_labelnames=llmd_labels, mark=deprecated, **kwargs)


def rank_pod_name(endpoint: Endpoint) -> str:
    """The Pod of an endpoint Kubernetes discovery named ``<pod>-rank-<i>`` (one per target port), as the
    reference's ``EndpointMetadata.PodName``; any other name is returned as it is."""
    return _RANK_SUFFIX.sub("", endpoint.name)


class EppMetrics:
    """EPP's metric families on ``registry`` plus the recording methods the request path calls.

    ``pod_name`` (an endpoint's Pod; default: the endpoint's name) and the endpoint's own namespace (else
    ``namespace``) fill those labels of scheduler attempts; ``commit``/``build_ref`` the info gauge.
    """

    def __init__(self, registry: CollectorRegistry, *, namespace: str = "", commit: str = "", build_ref: str = "",
                 pod_name: Callable[[Endpoint], str] | None = None, fairness_ids: LabelCap | None = None) -> None:
        from epp import __version__

        self.registry = registry
        self.fairness_ids = fairness_ids or LabelCap(DEFAULT_FAIRNESS_ID_LIMIT)
        self.namespace = namespace
        self.pod_name: Callable[[Endpoint], str] = pod_name or _endpoint_name
        self._objective_families(registry)
        self._extension_families(registry)
        self._datalayer_families(registry)
        for info in self.info:
            info.labels(commit or "unknown", build_ref or f"v{__version__}").set(1)
        # Label-less families have their one series from the start, as prometheus-client's would.
        self._sched_e2e = self.sched_e2e.labels()
        self._prefix_ratio = self.prefix_ratio.labels()
        self._prefix_bytes = self.prefix_bytes.labels()
        # The request path's series, resolved once per label set instead of once per observation.
        self._pairs: dict[tuple[str, str], _PairSeries] = {}
        self._attempts: dict[tuple[str, str, int], Child] = {}
        self._plugins: dict[tuple[str, str, str], HistogramChild] = {}
        self._pool: PoolCollector | None = None

    def _objective_families(self, r: CollectorRegistry) -> None:
        obj = "inference_objective_"
        self.requests = _dual(counter, obj, "request_total", "Counter of inference objective requests broken out "
                              "for each model and target model.", (*_M, "priority"), registry=r)
        self.errors = _dual(counter, obj, "request_error_total", "Counter of inference objective requests errors "
                            "broken out for each model and target model.", (*_M, "error_code"), registry=r)
        self.duration = _dual(histogram, obj, "request_duration_seconds", "Inference objective response latency "
                              "distribution in seconds for each model and target model.", _M, buckets=_DURATION,
                              registry=r)
        self.request_sizes = _dual(histogram, obj, "request_sizes", "Inference objective requests size "
                                   "distribution in bytes for each model and target model.", _M, buckets=_SIZES,
                                   registry=r)
        self.response_sizes = _dual(histogram, obj, "response_sizes", "Inference objective responses size "
                                    "distribution in bytes for each model and target model.", _M,
                                    buckets=_RESPONSE_SIZES, registry=r)
        self.input_tokens = _dual(histogram, obj, "input_tokens", "Inference objective input token count "
                                  "distribution for requests in each model.", _M, buckets=_INPUT_TOKENS, registry=r)
        self.output_tokens = _dual(histogram, obj, "output_tokens", "Inference objective output token count "
                                   "distribution for requests in each model.", _M, buckets=_OUTPUT_TOKENS,
                                   registry=r)
        self.cached_tokens = _dual(histogram, obj, "prompt_cached_tokens", "Inference objective prompt cached "
                                   "token count distribution for requests in each model.", _M,
                                   buckets=_INPUT_TOKENS, registry=r)
        ntpot = ("normalized_time_per_output_token_seconds", "Inference objective latency divided by number of "
                 "output tokens in seconds for each model and target model.")
        self.ntpot = histogram(obj + ntpot[0], f"[Deprecated: Use {LLMD}{ntpot[0]}] {ntpot[1]}", _M,
                               buckets=_NTPOT, registry=r)
        self.llmd_ntpot = histogram(LLMD + ntpot[0], ntpot[1], (*_M, "fairness_id", "priority"), buckets=_NTPOT,
                                    registry=r)
        self.running = _dual(gauge, obj, "running_requests", "Inference objective number of running requests in "
                             "each model.", ("model_name",), registry=r)
        self.ttft = histogram(obj + "request_ttft_seconds", "Time to first token observed by EPP (request "
                              "received to first response byte), in seconds.", _M, buckets=_TTFT, registry=r)
        self.itl = histogram(obj + "request_itl_seconds", "Inter-token latency observed by EPP (gap between "
                             "streamed response chunks), in seconds.", _M, buckets=_ITL, registry=r)

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

    # -- request path ------------------------------------------------------------------------------------------

    def families(self) -> list[Family]:
        """The request path's metric families (what ``--workers`` peers report to worker 0); the
        ``llm_d_router_epp_*`` twins are not listed, as they show their legacy family's series, peers' included."""
        return [value for value in vars(self).values() if isinstance(value, Family) and value.twin_of is None]

    def record_request(self, model: str, target: str, priority: int) -> None:
        """One request received (after parsing)."""
        pair = self._pairs.get((model, target)) or self._pair(model, target)
        child = pair.requests.get(priority)
        if child is None:
            child = pair.requests[priority] = self.requests.labels(model, target, str(priority))
        child.inc()

    def completed(self, model: str, target: str, seconds: float, info: ResponseInfo, fairness_id: str = "",
                  priority: int = 0) -> None:
        """A request ended, in any way: the request path's one call for what :meth:`running_dec`,
        :meth:`record_duration` and, unless ``info.error``, :meth:`record_tokens` and :meth:`record_ntpot` record
        (an error's code is recorded by :meth:`record_error`); ``fairness_id`` and ``priority`` are the request's,
        labels of ``llm_d_router_epp_normalized_time_per_output_token_seconds``."""
        pair = self._pairs.get((model, target)) or self._pair(model, target)
        if model:
            (pair.running or pair.bind("running")).dec()
        if seconds > 0:
            (pair.duration or pair.bind("duration")).observe(seconds)
        if info.error:
            return
        prompt, completion, cached = info.prompt_tokens, info.completion_tokens, info.cached_tokens
        if prompt:
            (pair.input_tokens or pair.bind("input_tokens")).observe(prompt)
            if cached is not None and cached >= 0:
                (pair.cached_tokens or pair.bind("cached_tokens")).observe(cached)
        if completion:
            (pair.output_tokens or pair.bind("output_tokens")).observe(completion)
            if completion > 0 and seconds > 0:
                # the legacy series and the llm-d one of the request's fairness id and priority, in one call
                fid = self.fairness_ids(fairness_id)
                (pair.ntpot.get((fid, priority)) or pair.bind_ntpot(fid, priority)).observe(seconds / completion)

    def _pair(self, model: str, target: str) -> _PairSeries:
        pair = self._pairs[(model, target)] = _PairSeries(self, model, target)
        return pair

    def record_model_rewrite(self, rewrite_name: str, model: str, target: str) -> None:
        """An InferenceModelRewrite sent a request for ``model`` to ``target``."""
        self.rewrites.labels(rewrite_name, model, target).inc()

    def record_error(self, model: str, target: str, code: str) -> None:
        """One request failed with ``code`` (an :class:`~epp.errors.ErrorCode` value); empty codes are ignored."""
        if code:
            self.errors.labels(model, target, code).inc()

    def record_duration(self, model: str, target: str, seconds: float) -> None:
        """Request received to response complete; non-positive durations are dropped (as the reference)."""
        if seconds > 0:
            self.duration.labels(model, target).observe(seconds)

    def record_sizes(self, model: str, target: str, request_bytes: int | None, response_bytes: int | None) -> None:
        """Request and response body sizes in bytes (None = unknown, not observed)."""
        pair = self._pairs.get((model, target)) or self._pair(model, target)
        if request_bytes is not None:
            (pair.request_sizes or pair.bind("request_sizes")).observe(request_bytes)
        if response_bytes is not None:
            (pair.response_sizes or pair.bind("response_sizes")).observe(response_bytes)

    def record_tokens(self, model: str, target: str, prompt: int | None, completion: int | None,
                      cached: int | None) -> None:
        """Token usage of a completed response; counts that are None or not positive are not observed."""
        if prompt:
            self.input_tokens.labels(model, target).observe(prompt)
        if completion:
            self.output_tokens.labels(model, target).observe(completion)
        if cached is not None and cached >= 0 and prompt:
            self.cached_tokens.labels(model, target).observe(cached)

    def record_ntpot(self, model: str, target: str, seconds: float, completion: int | None, fairness_id: str = "",
                     priority: int = 0) -> None:
        """Normalized time per output token: request duration / output tokens (skipped without tokens); the
        ``llm_d_router_epp_`` family also by the request's ``fairness_id`` and ``priority``."""
        if completion and completion > 0 and seconds > 0:
            self.ntpot.labels(model, target).observe(seconds / completion)
            self.llmd_ntpot.labels(model, target, self.fairness_ids(fairness_id), str(priority)).observe(
                seconds / completion)

    def running_inc(self, model: str) -> None:
        """A request for ``model`` started (dispatched upstream)."""
        if model:
            self.running.labels(model).inc()

    def running_dec(self, model: str) -> None:
        """A request for ``model`` finished, in any way."""
        if model:
            self.running.labels(model).dec()

    def observe_ttft(self, model: str, target: str, seconds: float) -> None:
        """Time from request received to first response byte, as EPP saw it."""
        if seconds >= 0:
            pair = self._pairs.get((model, target)) or self._pair(model, target)
            (pair.ttft or pair.bind("ttft")).observe(seconds)

    def observe_itl(self, model: str, target: str, seconds: float) -> None:
        """Gap between two streamed response chunks, as EPP saw it."""
        if seconds >= 0:
            self.itl_series(model, target).observe(seconds)

    def itl_series(self, model: str, target: str) -> HistogramChild:
        """The pair's inter-chunk latency series, for a request to keep and observe into per chunk (the request
        path's per-token call: no label lookup)."""
        pair = self._pairs.get((model, target)) or self._pair(model, target)
        return pair.itl or pair.bind("itl")

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
            child = self._attempts[key] = self.sched_attempts.labels("success", target_model,
                                                                     self.pod_name(endpoint),
                                                                     endpoint.spec.namespace or self.namespace,
                                                                     str(endpoint.port))
        child.inc()

    def scheduler_attempt(self, status: str, target_model: str, endpoint: Endpoint | None) -> None:
        """A scheduling attempt (``success``/``failure``) and the endpoint chosen, if any."""
        if endpoint is None:
            self.sched_attempts.labels(status, target_model, "", "", "").inc()
        else:
            self.sched_attempts.labels(status, target_model, self.pod_name(endpoint),
                                       endpoint.spec.namespace or self.namespace, str(endpoint.port)).inc()

    def plugin_duration(self, point: str, plugin_type: str, name: str, seconds: float) -> None:
        """A plugin call's duration (the :data:`epp.scheduler.PluginTimer` signature)."""
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
        """Register the pool gauges (``inference_pool_*`` and their ``llm_d_router_epp_*`` twins), computed from
        ``datastore`` at each collection."""
        if self._pool is not None:
            self.registry.unregister(self._pool)
        self._pool = PoolCollector(datastore, staleness=staleness)
        self.registry.register(self._pool)
        return self._pool


def _endpoint_name(endpoint: Endpoint) -> str:
    return endpoint.name


class _PairSeries:
    """The request-path series of one (model, target model) pair, each bound on first use (as a labelled
    child appears in the exposition only once recorded into): ``running`` is the model's gauge."""

    __slots__ = ("_labels", "_metrics", "cached_tokens", "duration", "input_tokens", "itl", "ntpot", "output_tokens",
                 "request_sizes", "requests", "response_sizes", "running", "ttft")

    def __init__(self, metrics: EppMetrics, model: str, target: str) -> None:
        self._metrics = metrics
        self._labels = (model, target)
        self.requests: dict[int, Child] = {}
        self.running: Child | None = None
        self.duration: HistogramChild | None = None
        self.ttft: HistogramChild | None = None
        self.input_tokens: HistogramChild | None = None
        self.output_tokens: HistogramChild | None = None
        self.cached_tokens: HistogramChild | None = None
        self.ntpot: dict[tuple[str, int], HistogramTee] = {}
        self.itl: HistogramChild | None = None
        self.request_sizes: HistogramChild | None = None
        self.response_sizes: HistogramChild | None = None

    def bind(self, name: str) -> Any:
        """The pair's series of the :class:`EppMetrics` family ``name``, created and kept now."""
        family = getattr(self._metrics, name)
        child = family.labels(self._labels[0]) if name == "running" else family.labels(*self._labels)
        setattr(self, name, child)
        return child

    def bind_ntpot(self, fairness_id: str, priority: int) -> HistogramTee:
        """The pair's NTPOT series, the legacy one and the ``llm_d_router_epp_`` one of this fairness id and
        priority (which has these two labels more), as one tee created and kept (in :attr:`ntpot`) now."""
        m = self._metrics
        tee = self.ntpot[(fairness_id, priority)] = HistogramTee(
            m.ntpot.labels(*self._labels), m.llmd_ntpot.labels(*self._labels, fairness_id, str(priority)))
        return tee


def metrics_handler(registry: CollectorRegistry) -> Callable[[web.Request], web.StreamResponse]:
    """An aiohttp handler serving ``registry`` (mount it at ``/metrics`` on any app)."""

    async def handle(request: web.Request) -> web.Response:
        encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
        body = encoder(registry)
        resp = web.Response(body=body, headers={"Content-Type": content_type})
        if "gzip" in request.headers.get("Accept-Encoding", ""):
            resp.enable_compression(web.ContentCoding.gzip)
        return resp

    return handle  # type: ignore[return-value]


def make_metrics_app(registry: CollectorRegistry, middlewares: Sequence[Any] = ()) -> web.Application:
    """An aiohttp application serving ``registry`` at ``GET /metrics`` (for the ``--metrics-port`` server), behind
    ``middlewares`` (the metrics port's authentication, when on)."""
    app = web.Application(middlewares=list(middlewares))
    app.router.add_get("/metrics", metrics_handler(registry))
    return app
