"""Flow-control metrics: the reference's ``inference_extension_flow_control_*`` family plus per-tenant series.

Reference names and labels (``epp-reference.md`` §6):

- ``..._request_queue_duration_seconds`` histogram {fairness_id, priority, outcome, inference_pool, model_name,
  target_model_name}: time from enqueue to leaving the queue (dispatched, expired, cancelled). Per fairness id,
  this is the per-tenant queue wait.
- ``..._request_enqueue_duration_seconds`` histogram {same labels}: time to accept or reject at enqueue.
- ``..._dispatch_cycle_duration_seconds`` histogram {inference_pool}.
- ``..._queue_size`` / ``..._queue_bytes`` gauges {fairness_id, priority, inference_pool, model_name,
  target_model_name}.
- ``..._pool_saturation`` gauge {inference_pool}: the last saturation the dispatcher (or legacy admission) saw.

This project's additions: ``..._tenant_inflight_requests`` / ``..._tenant_inflight_tokens`` gauges
{fairness_id, inference_pool} and ``..._rejections_total`` counter {fairness_id, priority, reason, inference_pool}.

With ``registry=None`` the metrics are live but registered nowhere (tests, benchmarks).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from ..request import InferenceRequest

__all__ = ["FlowControlMetrics", "PREFIX"]

PREFIX = "inference_extension_flow_control_"
_ITEM = ["fairness_id", "priority", "inference_pool", "model_name", "target_model_name"]
_OUTCOME = ["fairness_id", "priority", "outcome", "inference_pool", "model_name", "target_model_name"]
_QUEUE_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
_FAST_BUCKETS = (1e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1)


class FlowControlMetrics:
    """Owns the flow-control collectors; the controller calls the small ``record_*`` methods."""

    def __init__(self, registry: CollectorRegistry | None, pool: str = "") -> None:
        self.pool = pool
        self.queue_duration = Histogram(PREFIX + "request_queue_duration_seconds",
                                        "Time requests spent in the flow-control queue, by outcome.", _OUTCOME,
                                        buckets=_QUEUE_BUCKETS, registry=registry)
        self.enqueue_duration = Histogram(PREFIX + "request_enqueue_duration_seconds",
                                          "Time to accept or reject a request at enqueue.", _OUTCOME,
                                          buckets=_FAST_BUCKETS, registry=registry)
        self.dispatch_cycle = Histogram(PREFIX + "dispatch_cycle_duration_seconds",
                                        "Duration of one dispatch cycle.", ["inference_pool"],
                                        buckets=_FAST_BUCKETS, registry=registry)
        self.queue_size = Gauge(PREFIX + "queue_size", "Requests waiting in flow-control queues.", _ITEM,
                                registry=registry)
        self.queue_bytes = Gauge(PREFIX + "queue_bytes", "Bytes of requests waiting in flow-control queues.", _ITEM,
                                 registry=registry)
        self.pool_saturation = Gauge(PREFIX + "pool_saturation", "Pool saturation seen by admission.",
                                     ["inference_pool"], registry=registry)
        self.tenant_inflight = Gauge(PREFIX + "tenant_inflight_requests", "Admitted requests not yet released.",
                                     ["fairness_id", "inference_pool"], registry=registry)
        self.tenant_tokens = Gauge(PREFIX + "tenant_inflight_tokens",
                                   "Estimated tokens (prompt + max output) of admitted requests not yet released.",
                                   ["fairness_id", "inference_pool"], registry=registry)
        self.rejections = Counter(PREFIX + "rejections", "Requests rejected by admission, by reason.",
                                  ["fairness_id", "priority", "reason", "inference_pool"], registry=registry)

    def _item(self, request: InferenceRequest) -> tuple[str, str, str, str, str]:
        return request.fairness_id, str(request.priority), self.pool, request.model, request.target_model

    def _outcome(self, request: InferenceRequest, outcome: str) -> tuple[str, ...]:
        return (request.fairness_id, str(request.priority), outcome, self.pool, request.model,
                request.target_model)

    def queued(self, request: InferenceRequest, size: int, delta: int) -> None:
        """A request entered (``delta=1``) or left (``-1``) a queue."""
        labels = self._item(request)
        self.queue_size.labels(*labels).inc(delta)
        self.queue_bytes.labels(*labels).inc(delta * size)

    def enqueued(self, request: InferenceRequest, outcome: str, seconds: float) -> None:
        self.enqueue_duration.labels(*self._outcome(request, outcome)).observe(seconds)

    def left_queue(self, request: InferenceRequest, outcome: str, seconds: float) -> None:
        self.queue_duration.labels(*self._outcome(request, outcome)).observe(seconds)

    def rejected(self, request: InferenceRequest, reason: str) -> None:
        self.rejections.labels(request.fairness_id, str(request.priority), reason, self.pool).inc()

    def inflight(self, fairness_id: str, requests: int, tokens: int) -> None:
        self.tenant_inflight.labels(fairness_id, self.pool).set(requests)
        self.tenant_tokens.labels(fairness_id, self.pool).set(tokens)

    def saturation(self, value: float) -> None:
        self.pool_saturation.labels(self.pool).set(value)

    def cycle(self, seconds: float) -> None:
        self.dispatch_cycle.labels(self.pool).observe(seconds)
