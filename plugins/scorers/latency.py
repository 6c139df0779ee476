"""``latency-scorer``: scores endpoints by the latency headroom ``predicted-latency-producer`` predicts for them.
Meant to run after ``slo-headroom-tier-filter`` (and ``prefix-cache-affinity-filter``) narrowed the candidates.

Headroom is SLO − predicted (ms; :class:`epp.latency.LatencyPredictionInfo`). The scorer picks one bucket of the
candidates and scores only it (every other candidate scores 0): the candidates meeting both SLOs (or without a
prediction), else the idle ones, else the smallest deficit. Within the bucket it normalises TTFT and TPOT headroom,
combines them with ``ttftWeight`` / ``tpotWeight`` and ranks by ``headroomSelectionStrategy`` (``least``:
closest to the SLO first, bin-packing; ``most``: most headroom first), scores clamped to [0, 1]. Without any
prediction it falls back to a composite of free KV, queue and prefix match. Formulas: docs/latency.md.

YAML::

    - type: latency-scorer
      parameters:
        ttftWeight: 0.8
        tpotWeight: 0.2
        headroomSelectionStrategy: least
        compositeKVWeight: 1
        compositeQueueWeight: 1
        compositePrefixWeight: 1
"""

from __future__ import annotations

import logging
import math
from typing import Any, ClassVar, Sequence

from pydantic import Field

from epp.framework.endpoint import Endpoint
from epp.framework.plugins import CycleState, Handle, Scorer
from epp.framework.plugins import Params as PluginParams
from epp.framework.request import InferenceRequest
from epp.latency import PRODUCER_TYPE, LatencyPredictionInfo, predictions_of

from ..latency_reader import check_latency_producer_name
from ..producers.approx_prefix_cache import PRODUCER_TYPE as PREFIX_PRODUCER_TYPE
from ..producers.approx_prefix_cache import PrefixMatch, find_prefix_producer

__all__ = ["LatencyScorer", "select_bucket", "bucket_scores", "composite_scores"]

log = logging.getLogger("epp.plugins")

W_MAX = 100
"""Scores are whole hundredths: ``w / W_MAX``."""
EPS = 1e-9
"""A headroom range at most this wide counts as zero."""

Info = LatencyPredictionInfo | None


def select_bucket(infos: Sequence[Info]) -> tuple[list[int], bool]:
    """Indices of the bucket to score among candidates with these predictions (at least one not None), and whether
    its strategy is forced to ``least`` (a negative bucket)."""
    positive = [i for i, info in enumerate(infos)
                if info is None or not (info.ttft_headroom < 0 or info.tpot_headroom < 0)]
    if positive:
        return positive, False
    negative = [(i, info) for i, info in enumerate(infos) if info is not None]
    idle = [i for i, info in negative if info.dispatched_request_count == 0]
    if idle:
        return idle, True
    tpot_only: list[int] = []
    ttft_only: list[int] = []
    both: list[int] = []
    for i, info in negative:  # the least severe violation first: TTFT is what users feel
        ttft_neg, tpot_neg = info.ttft_headroom < 0, info.tpot_headroom < 0
        (tpot_only if not ttft_neg else ttft_only if not tpot_neg else both).append(i)
    return next(b for b in (tpot_only, ttft_only, both) if b), True


def _headroom(info: Info) -> tuple[float, float]:
    """(TTFT, TPOT) headroom; (0, 0) for an endpoint without prediction, as the reference's zero values."""
    return (0.0, 0.0) if info is None else (info.ttft_headroom, info.tpot_headroom)


def _normalised(values: list[float]) -> tuple[list[float], bool]:
    """Each value's place in [0, 1] between the smallest and the largest, and whether the range is wide enough
    (all 0.5 when it is not)."""
    lo, hi = min(values), max(values)
    if hi - lo <= EPS:
        return [0.5] * len(values), False
    return [(v - lo) / (hi - lo) for v in values], True


def _weights(ttft_weight: float, tpot_weight: float) -> tuple[float, float]:
    """The two weights normalised to sum 1; (1, 0) when they sum to 0."""
    total = ttft_weight + tpot_weight
    return (ttft_weight / total, tpot_weight / total) if total > 0 else (1.0, 0.0)


def bucket_scores(headrooms: Sequence[tuple[float, float]], ttft_weight: float, tpot_weight: float,
                  most: bool) -> list[float]:
    """Scores in (0, 1] for one bucket's (TTFT, TPOT) headrooms: the reference's ``scoreBucket``, clamped."""
    n_ttft, ttft_spread = _normalised([abs(t) for t, _ in headrooms])
    n_tpot, tpot_spread = _normalised([abs(p) for _, p in headrooms])
    alpha, beta = _weights(ttft_weight, tpot_weight)
    if ttft_spread != tpot_spread:  # one dimension cannot tell the endpoints apart: use only the other
        alpha, beta = (1.0, 0.0) if ttft_spread else (0.0, 1.0)
    scores = []
    for t, p in zip(n_ttft, n_tpot):
        combined = alpha * t + beta * p
        w = int((combined if most else 1.0 - combined) * W_MAX) + 1
        scores.append(min(max(w / W_MAX, 0.0), 1.0))
    return scores


def _go_round(x: float) -> float:
    """Go's ``math.Round``: halves away from zero (Python's ``round`` sends them to even)."""
    whole = math.trunc(x)
    return whole + math.copysign(1.0, x) if abs(x - whole) >= 0.5 else float(whole)


def composite_scores(endpoints: Sequence[Endpoint], prefix: Sequence[float],
                     weights: tuple[float, float, float]) -> list[float]:
    """The fallback without predictions: free KV, relative queue and prefix match blended by ``weights`` (KV,
    queue, prefix; normalised, KV only when they sum to 0), in whole hundredths within [0, 1]."""
    total = sum(weights)
    wkv, wq, wpref = (w / total for w in weights) if total > 0 else (1.0, 0.0, 0.0)
    max_q = max([0, *(ep.metrics.waiting for ep in endpoints)])
    scores = []
    for ep, pref in zip(endpoints, prefix):
        queue = (max_q - ep.metrics.waiting) / max_q if max_q > 0 else 1.0
        composite = wkv * (1.0 - ep.metrics.kv_usage) + wq * queue + wpref * pref
        scores.append(min(max(_go_round(W_MAX * composite) / W_MAX, 0.0), 1.0))
    return scores


class LatencyScorer:
    """A Scorer: scores in [0, 1] from the predicted TTFT/TPOT headroom of one bucket of the candidates (the rest
    score 0), or from KV, queue and prefix match when no candidate has a prediction. Reads the cycle state only."""

    type_name: ClassVar[str] = "latency-scorer"
    consumes: ClassVar[tuple[str, ...]] = (PRODUCER_TYPE, PREFIX_PRODUCER_TYPE)

    class Params(PluginParams):
        ttft_weight: float = Field(0.8, alias="ttftWeight")
        tpot_weight: float = Field(0.2, alias="tpotWeight")
        headroom_selection_strategy: str = Field("least", alias="headroomSelectionStrategy")
        composite_kv_weight: float = Field(1.0, alias="compositeKVWeight")
        composite_queue_weight: float = Field(1.0, alias="compositeQueueWeight")
        composite_prefix_weight: float = Field(1.0, alias="compositePrefixWeight")
        latency_prediction_info_producer_name: str | None = Field(None, alias="latencyPredictionInfoProducerName")
        prefix_match_info_producer_name: str | None = Field(None, alias="prefixMatchInfoProducerName")

    def __init__(self, name: str, params: Params, handle: Handle) -> None:
        self.name = name
        self.params = params
        strategy = params.headroom_selection_strategy
        if strategy not in ("least", "most"):
            log.warning("plugin '%s' (type: %s): headroomSelectionStrategy %r is neither 'least' nor 'most'; "
                        "scoring as 'least', as the reference does", name, self.type_name, strategy)
        self._most = strategy == "most"
        self._composite = (params.composite_kv_weight, params.composite_queue_weight, params.composite_prefix_weight)
        self._prefix_key = ""  # set by bind; unbound, the composite's prefix term is 0

    @classmethod
    def producer_params(cls, params: Any) -> dict[str, Any]:
        """No producer parameters of its own: auto-created producers use their defaults."""
        return {}

    def bind(self, handle: Handle) -> None:
        """Check ``latencyPredictionInfoProducerName`` and find the prefix producer to read."""
        check_latency_producer_name(self, handle, self.params.latency_prediction_info_producer_name)
        name = self.params.prefix_match_info_producer_name
        self._prefix_key = find_prefix_producer(self, handle, producer_name=name).state_key

    def score(self, cycle: CycleState, request: InferenceRequest, endpoints: list[Endpoint]) -> list[float]:
        predictions = predictions_of(cycle)
        infos = [predictions.get(ep.name) for ep in endpoints] if predictions else [None] * len(endpoints)
        if all(info is None for info in infos):
            return composite_scores(endpoints, self._prefix_scores(cycle, endpoints), self._composite)
        bucket, force_least = select_bucket(infos)
        headrooms = [_headroom(infos[i]) for i in bucket]
        p = self.params
        scored = bucket_scores(headrooms, p.ttft_weight, p.tpot_weight, self._most and not force_least)
        scores = [0.0] * len(endpoints)
        for i, s in zip(bucket, scored):
            scores[i] = s
        return scores

    def _prefix_scores(self, cycle: CycleState, endpoints: list[Endpoint]) -> list[float]:
        """Each endpoint's prompt match ratio from the prefix producer (0 without its match info)."""
        match = cycle.get(self._prefix_key) if self._prefix_key else None
        if not isinstance(match, PrefixMatch):
            return [0.0] * len(endpoints)
        return [match.score(ep.name) for ep in endpoints]


_check: type[Scorer] = LatencyScorer
