"""``predicted-latency-producer``: predicts each candidate endpoint's TTFT and TPOT for a request, judges them
against the request's SLO headers, and learns from what requests then meet.

Produce (before the admitters and the scheduling cycle) stores ``{endpoint name:``
:class:`~epp.latency.LatencyPredictionInfo` ``}`` under :data:`~epp.latency.LATENCY_PREDICTIONS_KEY`:
``ttft_valid = ttft < SLO`` and, with ``streamingMode``, ``tpot_valid = tpot < TPOT SLO × sloBufferFactor``, each
with its headroom (no SLO header: SLO 0, never valid). Nothing is stored while the model is not ready or with
``predictInProduce: false``: readers then treat every endpoint as unknown (fail-open). PreRequest records the
dispatch; the first byte (``streamingMode``) or the whole request gives a TTFT sample and a streamed answer's end a
TPOT sample for the in-process model (:class:`~epp.latency.inprocess.InProcessPredictor`); an error or a fallback
trains nothing. Per-request state is keyed by request id, released when the request ends and expires
``contextTTL`` after dispatch. Details: docs/latency.md.

YAML::

    - type: predicted-latency-producer
      parameters:
        samplingMean: 1000
        maxDecodeTokenSamplesForPrediction: 0
        sloBufferFactor: 1
        contextTTL: 5m
        streamingMode: false
        endpointRoleLabel: ""          # e.g. llm-d.ai/role: TPOT is not judged on "prefill" endpoints
        predictInProduce: true         # false: learn only, store no predictions
        predictor:                     # EPP only: the in-process model
          minSamples: 10               # samples before a model predicts
          refitEvery: 10               # new samples between refits
          window: 1000                 # about how many recent samples the model remembers
          objective: quantile          # or mean
          quantile: 0.9
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Annotated, Any, Callable, ClassVar, Literal

from pydantic import BeforeValidator, Field

from epp.config.units import parse_duration
from epp.errors import ConfigError
from epp.framework.endpoint import Endpoint
from epp.framework.plugins import (
    CycleState,
    DataProducer,
    Handle,
    PreRequest,
    ResponseComplete,
    ResponseInfo,
    ResponseStarted,
    SchedulingResult,
)
from epp.framework.plugins import Params as PluginParams
from epp.framework.request import InferenceRequest
from epp.headers import SLO_TPOT_HEADER, SLO_TTFT_HEADER
from epp.latency import LATENCY_PREDICTIONS_KEY, PRODUCER_TYPE, LatencyPredictionInfo
from epp.latency.inprocess import InProcessPredictor
from epp.latency.metrics import LatencyMetrics
from epp.latency.predictor import LatencyFeatures, LatencyPrediction, LatencyPredictor, TrainingSample
from epp.latency.running import RunningRequests
from epp.latency.slo import slo_header_ms

from .approx_prefix_cache import DEFAULT_PREFILL_PROFILE, PrefixMatch, find_prefix_producer
from .approx_prefix_cache import PRODUCER_TYPE as PREFIX_PRODUCER_TYPE

__all__ = ["PredictedLatencyProducer", "PredictorParams"]


def _ttl(value: Any) -> Any:
    """Seconds from integer nanoseconds (Go's JSON form of a ``time.Duration``) or a Go duration string."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValueError("must be a duration string like '5m' or integer nanoseconds")
    return value / 1e9 if isinstance(value, int) else parse_duration(value)


class PredictorParams(PluginParams):
    """The in-process predictor's settings (EPP's own; the reference configures its sidecars instead)."""

    min_samples: int = Field(10, alias="minSamples", ge=2)
    refit_every: int = Field(10, alias="refitEvery", ge=1)
    window: int = Field(1000, ge=1)
    objective: Literal["mean", "quantile"] = "quantile"
    quantile: float = Field(0.9, gt=0, lt=1)


@dataclass(slots=True)
class _Produced:
    """What Produce leaves in the cycle state for PreRequest: the SLOs and the predictions by endpoint name."""

    slo_ttft: float
    slo_tpot: float
    predictions: dict[str, LatencyPrediction] | None


@dataclass(slots=True)
class _Dispatched:
    """One dispatched request, from PreRequest to its end."""

    target: str
    ttft_features: LatencyFeatures
    tpot_features: LatencyFeatures
    slo_ttft: float
    slo_tpot: float
    predicted_ttft: float | None
    predicted_tpot: float | None
    start: float
    expires: float
    first_byte: float | None = None
    ttft: float | None = None


class PredictedLatencyProducer:
    """Stores per-endpoint :class:`~epp.latency.LatencyPredictionInfo` for each request (module doc) and trains its
    predictor from the request's observed TTFT and TPOT. Never raises on the request path."""

    type_name: ClassVar[str] = PRODUCER_TYPE
    consumes: ClassVar[tuple[str, ...]] = (PREFIX_PRODUCER_TYPE,)

    class Params(PluginParams):
        sampling_mean: float = Field(1000.0, alias="samplingMean", gt=0)
        max_decode_token_samples_for_prediction: int = Field(0, alias="maxDecodeTokenSamplesForPrediction", ge=0)
        slo_buffer_factor: float = Field(1.0, alias="sloBufferFactor", gt=0)
        context_ttl: Annotated[float, BeforeValidator(_ttl)] = Field(300.0, alias="contextTTL", ge=0)
        streaming_mode: bool = Field(False, alias="streamingMode")
        endpoint_role_label: str = Field("", alias="endpointRoleLabel")
        predict_in_produce: bool = Field(True, alias="predictInProduce")
        predictor: PredictorParams = Field(default_factory=PredictorParams)

    def __init__(self, name: str, params: Params, handle: Handle, *, predictor: LatencyPredictor | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.name = name
        self.params = params
        p = params.predictor
        self.predictor: LatencyPredictor = predictor or InProcessPredictor(
            min_samples=p.min_samples, refit_every=p.refit_every, window=p.window, objective=p.objective,
            quantile=p.quantile)
        self.clock = clock
        self.running = RunningRequests()
        self.state_key = f"{PRODUCER_TYPE}/{name}"
        self.metrics: LatencyMetrics | None = None
        self._requests: dict[str, _Dispatched] = {}
        self._prefix_key: str | None = None
        self._streaming = params.streaming_mode
        self._buffer = params.slo_buffer_factor
        self._role_label = params.endpoint_role_label
        self._ttl = params.context_ttl
        self._predict = params.predict_in_produce

    @classmethod
    def producer_params(cls, params: Any) -> dict[str, Any]:
        """No prefix-producer parameters of its own: an auto-created prefix producer uses the defaults."""
        return {}

    def bind(self, handle: Handle) -> None:
        """Find the prefix producer whose match gives the prefix scores (none: every score is 0)."""
        try:
            self._prefix_key = find_prefix_producer(self, handle).state_key
        except ConfigError:
            self._prefix_key = None

    def use_latency_metrics(self, metrics: LatencyMetrics) -> None:
        """Record into ``metrics`` from now on (``epp serve`` wires this at start-up)."""
        self.metrics = metrics

    # -- Produce -------------------------------------------------------------------------------------------------

    def produce(self, cycle: CycleState, request: InferenceRequest, endpoints: list[Endpoint]) -> None:
        """Store the predictions (when the predictor is ready) and what PreRequest needs (module doc)."""
        self._expire(self.clock())
        headers = request.headers
        slo_ttft, slo_tpot = slo_header_ms(headers, SLO_TTFT_HEADER), slo_header_ms(headers, SLO_TPOT_HEADER)
        predictions = None
        if self._predict and endpoints and self.ready:
            match = self._match(cycle)
            feats = [self.features(ep, request, match) for ep in endpoints]
            bulk = self.predictor.predict_bulk(feats)
            if len(bulk) == len(endpoints):
                predictions = {ep.name: pred for ep, pred in zip(endpoints, bulk)}
                cycle[LATENCY_PREDICTIONS_KEY] = {ep.name: self.judge(ep, pred, slo_ttft, slo_tpot)
                                                  for ep, pred in zip(endpoints, bulk)}
        cycle[self.state_key] = _Produced(slo_ttft, slo_tpot, predictions)

    @property
    def ready(self) -> bool:
        """Whether the predictor can predict what this producer judges (TTFT; TPOT too in streaming mode)."""
        return self.predictor.ttft_ready and (self.predictor.tpot_ready or not self._streaming)

    def features(self, endpoint: Endpoint, request: InferenceRequest, match: PrefixMatch | None) -> LatencyFeatures:
        """What ``request`` would meet on ``endpoint`` now."""
        m = endpoint.metrics
        ids = request.token_ids
        # Positional, in LatencyFeatures' field order: this runs once per candidate in the cycle.
        return LatencyFeatures(m.kv_usage, len(ids) if ids else request.input_tokens, m.waiting,
                               endpoint.inflight_requests, match.score(endpoint.name) if match is not None else 0.0,
                               1, endpoint.inflight_tokens, 0,
                               endpoint.labels.get(self._role_label, "") if self._role_label else "")

    def judge(self, endpoint: Endpoint, pred: LatencyPrediction, slo_ttft: float,
              slo_tpot: float) -> LatencyPredictionInfo:
        """``pred`` against the SLOs on ``endpoint`` (the reference's ``validatePrediction`` and TPOT
        neutralisation)."""
        name = endpoint.name
        tpot_ok, tpot_headroom = True, 0.0
        if self._streaming and not self._is_prefill(endpoint):
            buffered = slo_tpot * self._buffer
            running_min = self.running.min_slo(name)
            if running_min > 0:
                buffered = min(buffered, running_min * self._buffer)
            tpot_ok, tpot_headroom = pred.tpot < buffered, buffered - pred.tpot
        return LatencyPredictionInfo(pred.ttft < slo_ttft, tpot_ok, slo_ttft - pred.ttft, tpot_headroom, pred.ttft,
                                     pred.tpot, self.running.count(name))

    def _is_prefill(self, endpoint: Endpoint) -> bool:
        return bool(self._role_label) and endpoint.labels.get(self._role_label) == "prefill"

    def _match(self, cycle: CycleState) -> PrefixMatch | None:
        found = cycle.get(self._prefix_key) if self._prefix_key else None
        return found if isinstance(found, PrefixMatch) else None

    # -- request control ----------------------------------------------------------------------------------------

    def pre_request(self, request: InferenceRequest, result: SchedulingResult) -> None:
        """Start tracking the dispatched request (module doc)."""
        endpoints = result.endpoints
        if not endpoints:
            return
        now = self.clock()
        self._expire(now)
        target, prefill = endpoints[0], _prefill_of(result)
        produced = result.cycle.get(self.state_key)
        if not isinstance(produced, _Produced):
            produced = _Produced(slo_header_ms(request.headers, SLO_TTFT_HEADER),
                                 slo_header_ms(request.headers, SLO_TPOT_HEADER), None)
        match = self._match(result.cycle)
        first = prefill or target  # where the time to first token is spent
        tpot_features = self.features(target, request, match)
        ttft_features = self.features(first, request, match) if prefill is not None else tpot_features
        preds = produced.predictions or {}
        first_pred, target_pred = preds.get(first.name), preds.get(target.name)
        rid = request.request_id
        self._release(rid)
        self.running.add(target.name, rid, produced.slo_tpot)
        self._requests[rid] = _Dispatched(
            target.name, ttft_features, tpot_features, produced.slo_ttft, produced.slo_tpot,
            first_pred.ttft if first_pred is not None else None,
            target_pred.tpot if target_pred is not None else None, now, now + self._ttl)

    def response_started(self, request: InferenceRequest, endpoint: Endpoint) -> None:
        """First byte: in streaming mode, a TTFT sample. Renews the request's TTL."""
        rid = request.request_id
        state = self._requests.get(rid)
        if state is None or state.first_byte is not None:
            return
        now = state.first_byte = self.clock()
        state.expires = now + self._ttl
        del self._requests[rid]
        self._requests[rid] = state  # expiry order = insertion order
        if self._streaming:
            state.ttft = (now - state.start) * 1000.0
            if endpoint.name == state.target:
                self.predictor.add_training_data([TrainingSample(state.ttft_features, actual_ttft=state.ttft)])

    def response_complete(self, request: InferenceRequest, endpoint: Endpoint | None, info: ResponseInfo) -> None:
        """The request ended: release its state; on success, train and record (module doc)."""
        state = self._release(request.request_id)
        if state is None or info.error:
            return
        now = self.clock()
        served = endpoint is not None and endpoint.name == state.target
        samples: list[TrainingSample] = []
        if not self._streaming:
            state.ttft = (now - state.start) * 1000.0
            samples.append(TrainingSample(state.ttft_features, actual_ttft=state.ttft))
        tpot = None
        tokens = info.completion_tokens or info.stream_chunks or 0  # chunks when the answer had no usage
        if self._streaming and info.streamed and state.first_byte is not None and tokens >= 2:
            tpot = (now - state.first_byte) * 1000.0 / (tokens - 1)
            samples.append(TrainingSample(state.tpot_features, actual_tpot=tpot))
        if served and samples:
            self.predictor.add_training_data(samples)
        if self.metrics is not None:
            self._record(request, state, tpot)

    def _record(self, request: InferenceRequest, state: _Dispatched, tpot: float | None) -> None:
        metrics = self.metrics
        assert metrics is not None
        plugin, model = (self.name, self.type_name), (request.model, request.target_model)
        if state.ttft is not None:
            predicted = state.predicted_ttft
            metrics.record_ttft(plugin, model, (request.fairness_id, request.objective or ""), state.ttft / 1000.0,
                                predicted / 1000.0 if predicted is not None else -1.0, state.slo_ttft / 1000.0)
        if tpot is not None:
            predicted = state.predicted_tpot
            metrics.record_tpot(plugin, model, tpot / 1000.0, predicted / 1000.0 if predicted is not None else -1.0,
                                state.slo_tpot / 1000.0)

    def _release(self, request_id: str) -> _Dispatched | None:
        """Forget ``request_id``: its state (returned) and its place in the running queue."""
        state = self._requests.pop(request_id, None)
        if state is not None:
            self.running.remove(state.target, request_id)
        return state

    def _expire(self, now: float) -> None:
        """Drop the states whose TTL passed (the oldest come first: expiry order is insertion order)."""
        if self._ttl <= 0:
            return
        requests = self._requests
        while requests:
            rid, state = next(iter(requests.items()))
            if state.expires > now:
                return
            self._release(rid)

    def tracked(self) -> list[str]:
        """Ids of the requests whose state is held (dispatched, not ended, not expired)."""
        return list(self._requests)


def _prefill_of(result: SchedulingResult) -> Endpoint | None:
    """The prefill endpoint of a disaggregated result (the handler's prefill profile, else one named
    ``prefill``, the reference's default), or None."""
    found = result.prefill
    if found is None:
        res = result.profile_results.get(DEFAULT_PREFILL_PROFILE)
        found = res.endpoints[0] if res is not None and res.endpoints else None
    return found if found is not None and found is not result.endpoints[0] else None


_check_producer: type[DataProducer] = PredictedLatencyProducer
_check_pre: type[PreRequest] = PredictedLatencyProducer
_check_started: type[ResponseStarted] = PredictedLatencyProducer
_check_complete: type[ResponseComplete] = PredictedLatencyProducer
