"""Latency prediction for SLO-aware routing: the contract between ``predicted-latency-producer`` and its readers.

The producer (``plugins/producers/predicted_latency.py``) predicts, for one request, the time to first token
(TTFT) and the time per output token (TPOT) it would see on each candidate endpoint, compares them with the
request's SLO headers and puts one :class:`LatencyPredictionInfo` per endpoint name in the cycle state under
:data:`LATENCY_PREDICTIONS_KEY`. It runs before the admitters (:meth:`epp.scheduling.scheduler.Scheduler.prepare`),
so ``latency-slo-admitter``, ``slo-headroom-tier-filter`` and ``latency-scorer`` all read the same predictions. A
reader that finds no entry treats the endpoint as unknown.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

__all__ = ["LatencyPredictionInfo", "LATENCY_PREDICTIONS_KEY", "LatencyPredictions", "predictions_of", "PRODUCER_TYPE"]

PRODUCER_TYPE = "predicted-latency-producer"
"""The producer's registered type (readers list it in ``consumes``)."""

LATENCY_PREDICTIONS_KEY = "LatencyPredictionInfoDataKey"
"""Cycle-state key of the producer's :data:`LatencyPredictions` (the reference's attribute key name)."""


@dataclass(frozen=True, slots=True)
class LatencyPredictionInfo:
    """One endpoint's predicted latencies for one request (times in milliseconds).

    ``ttft_headroom`` = TTFT SLO − predicted TTFT and ``tpot_headroom`` = (buffered) TPOT SLO − predicted TPOT:
    positive within the SLO, negative when it would be violated. ``ttft_valid`` / ``tpot_valid`` say whether the
    prediction is within each SLO (a TPOT the producer does not judge, as in non-streaming mode or on a prefill
    endpoint, is valid with headroom 0). ``dispatched_request_count`` is the number of requests EPP has dispatched
    to the endpoint and not yet seen finish (EPP's own count, fresher than the scraped running count).
    """

    ttft_valid: bool
    tpot_valid: bool
    ttft_headroom: float
    tpot_headroom: float
    ttft: float
    tpot: float
    dispatched_request_count: int = 0

    @property
    def valid(self) -> bool:
        """Within both SLOs (the reference's ``IsValid``)."""
        return self.ttft_valid and self.tpot_valid


LatencyPredictions = Mapping[str, LatencyPredictionInfo]
"""What the producer stores under :data:`LATENCY_PREDICTIONS_KEY`: endpoint name -> its prediction."""


def predictions_of(cycle: Mapping[str, object]) -> LatencyPredictions:
    """The predictions in ``cycle`` (empty when no producer made any)."""
    found = cycle.get(LATENCY_PREDICTIONS_KEY)
    return found if isinstance(found, Mapping) else {}
