"""Flow-control metrics: the reference's flow-control families under both its names, plus per-tenant series.

Each family is exported as ``inference_extension_flow_control_X`` (HELP marked deprecated) and as
``llm_d_epp_flow_control_X``, one recording counting under both (:func:`epp.metrics.instruments.renamed`): the
queue duration (once per request, whatever its outcome), enqueue and dispatch-cycle durations, queue size and
bytes, and pool saturation. This project adds per-tenant in-flight gauges and a rejections counter, under the
legacy prefix only. With ``registry=None`` the metrics are live but registered nowhere (tests, benchmarks). Label
values fed by clients are bounded by the :class:`~epp.metrics.labels.RequestLabels` the request metrics share. The
family catalogue is in docs/reference-parity.md.
"""

from __future__ import annotations

from typing import Any, Callable, TypeVar

from prometheus_client import CollectorRegistry

from epp.framework.request import InferenceRequest
from epp.metrics.instruments import Family, LabelCap, counter, gauge, histogram, renamed
from epp.metrics.labels import RequestLabels

__all__ = ["FlowControlMetrics", "PREFIX", "LLMD_PREFIX", "QUEUE_BUCKETS", "FAST_BUCKETS"]

PREFIX = "inference_extension_flow_control_"
LLMD_PREFIX = "llm_d_epp_flow_control_"
_ITEM = ("fairness_id", "priority", "inference_pool", "model_name", "target_model_name")
_OUTCOME = ("fairness_id", "priority", "outcome", "inference_pool", "model_name", "target_model_name")
_ENQUEUE = ("fairness_id", "priority", "outcome")
QUEUE_BUCKETS = (0.0001, 0.0005, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
FAST_BUCKETS = (0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1)

_Item = tuple[str, str, str, str, str]  # fairness_id, priority, inference_pool, model_name, target_model_name
FamilyT = TypeVar("FamilyT", bound=Family[Any])


def _dual(factory: Callable[..., FamilyT], suffix: str, text: str, labels: tuple[str, ...] = (), *,
          registry: CollectorRegistry, **kwargs: Any) -> FamilyT:
    """``inference_extension_flow_control_<suffix>`` and its successor ``llm_d_epp_flow_control_<suffix>``."""
    return renamed(factory, PREFIX + suffix, LLMD_PREFIX + suffix, text, labels, registry=registry, **kwargs)


class FlowControlMetrics:
    """Owns the flow-control families; the controller calls the small recording methods."""

    def __init__(self, registry: CollectorRegistry | None, pool: str = "", fairness_ids: LabelCap | None = None,
                 labels: RequestLabels | None = None) -> None:
        self.pool = pool
        self.labels = labels or RequestLabels(fairness_ids=fairness_ids)
        self.fairness_ids = self.labels.fairness_ids
        self._folded: dict[str, tuple[int, int]] = {}  # in-flight (requests, tokens) of ids folded into "other"
        # Queued requests' labels when a value was folded, by the values they sent (with how many are queued): a
        # model that becomes served meanwhile must leave the queue gauges where it entered them.
        self._pinned: dict[tuple[str, int, str, str], tuple[_Item, int]] = {}
        r = registry if registry is not None else CollectorRegistry()
        self.queue_duration = _dual(histogram, "request_queue_duration_seconds", "Distribution of total time "
                                    "requests spend in the Flow Control layer (from enqueue to final outcome).",
                                    _OUTCOME, buckets=QUEUE_BUCKETS, registry=r)
        self.enqueue_duration = _dual(histogram, "request_enqueue_duration_seconds", "Distribution of time taken "
                                      "to enqueue requests into the Flow Control layer.", _ENQUEUE,
                                      buckets=FAST_BUCKETS, registry=r)
        self.dispatch_cycle = _dual(histogram, "dispatch_cycle_duration_seconds", "Distribution of time taken for "
                                    "each internal dispatch cycle in the Flow Control layer.", buckets=FAST_BUCKETS,
                                    registry=r)
        self.queue_size = _dual(gauge, "queue_size", "Current number of requests actively held in the Flow Control "
                                "queue.", _ITEM, registry=r)
        self.queue_bytes = _dual(gauge, "queue_bytes", "Current total size in bytes of requests actively held in "
                                 "the Flow Control queue.", _ITEM, registry=r)
        self.pool_saturation = _dual(gauge, "pool_saturation", "Current saturation level of the inference pool "
                                     "(0.0 = empty, 1.0 = fully saturated).", ("inference_pool",), registry=r)
        self.tenant_inflight = gauge(PREFIX + "tenant_inflight_requests", "Admitted requests not yet released.",
                                     ("fairness_id", "inference_pool"), registry=r)
        self.tenant_tokens = gauge(PREFIX + "tenant_inflight_tokens", "Estimated tokens (prompt + max output) of "
                                   "admitted requests not yet released.", ("fairness_id", "inference_pool"),
                                   registry=r)
        self.rejections = counter(PREFIX + "rejections", "Requests rejected by admission, by reason.",
                                  ("fairness_id", "priority", "reason", "inference_pool"), registry=r)
        self._cycle = self.dispatch_cycle.labels()

    def _item(self, request: InferenceRequest) -> _Item:
        model, target, fairness_id = self.labels(request.model, request.target_model, request.fairness_id)
        return fairness_id, str(request.priority), self.pool, model, target

    def queued(self, request: InferenceRequest, size: int, delta: int) -> None:
        """A request entered (``delta=1``) or left (``-1``) a queue."""
        labels = self._item(request)
        # Identity, not equality: an unfolded value is the request's own object (RequestLabels returns it).
        if self._pinned or labels[3] is not request.model or labels[4] is not request.target_model or \
                labels[0] is not request.fairness_id:
            labels = self._pin(request, labels, delta)
        self.queue_size.labels(*labels).inc(delta)
        self.queue_bytes.labels(*labels).inc(delta * size)

    def _pin(self, request: InferenceRequest, labels: _Item, delta: int) -> _Item:
        """The labels a request entering or leaving a queue counts under: those it entered with while any request
        with its values is queued under folded labels (see ``_pinned``), else ``labels``."""
        key = (request.fairness_id, request.priority, request.model, request.target_model)
        pinned, queued = self._pinned.get(key) or (labels, 0)
        if not queued and (delta <= 0 or _as_sent(request, labels)):
            return labels
        queued += delta
        if queued > 0:
            self._pinned[key] = (pinned, queued)
        else:
            del self._pinned[key]
        return pinned

    def enqueued(self, request: InferenceRequest, outcome: str, seconds: float) -> None:
        """The enqueue step took ``seconds`` and ended with ``outcome`` (``NotYetFinalized`` when queued)."""
        self.enqueue_duration.labels(self.fairness_ids(request.fairness_id), str(request.priority),
                                     outcome).observe(seconds)

    def finalized(self, request: InferenceRequest, outcome: str, seconds: float) -> None:
        """The request's final ``outcome``, ``seconds`` after it reached flow control (once per request)."""
        fairness_id, priority, pool, model, target = self._item(request)
        self.queue_duration.labels(fairness_id, priority, outcome, pool, model, target).observe(seconds)

    def rejected(self, request: InferenceRequest, reason: str) -> None:
        self.rejections.labels(self.fairness_ids(request.fairness_id), str(request.priority), reason,
                               self.pool).inc()

    def inflight(self, fairness_id: str, requests: int, tokens: int) -> None:
        """``fairness_id`` now has ``requests`` admitted requests of ``tokens`` estimated tokens in flight. A folded
        id adds its change to the shared ``other`` series (so ``other`` is the sum over the ids it holds)."""
        label = self.fairness_ids(fairness_id)
        if label == fairness_id:
            self.tenant_inflight.labels(label, self.pool).set(requests)
            self.tenant_tokens.labels(label, self.pool).set(tokens)
            return
        old_requests, old_tokens = self._folded.pop(fairness_id, (0, 0))
        if requests or tokens:
            self._folded[fairness_id] = (requests, tokens)
        self.tenant_inflight.labels(label, self.pool).inc(requests - old_requests)
        self.tenant_tokens.labels(label, self.pool).inc(tokens - old_tokens)

    def saturation(self, value: float) -> None:
        """Record the saturation admission just saw (ignored once :meth:`watch_saturation` is set)."""
        self.pool_saturation.labels(self.pool).set(value)

    def watch_saturation(self, read: Callable[[], float]) -> None:
        """Report ``read()`` as the pool saturation at every collection, queues empty or not."""
        self.pool_saturation.labels(self.pool).set_function(read)

    def cycle(self, seconds: float) -> None:
        self._cycle.observe(seconds)


def _as_sent(request: InferenceRequest, labels: _Item) -> bool:
    """Whether the :meth:`FlowControlMetrics._item` labels carry the request's values unfolded."""
    return labels[0] == request.fairness_id and labels[3] == request.model and labels[4] == request.target_model
