"""The latency predictor contract: what ``predicted-latency-producer`` asks of a model, apart from any one model.

The reference's producer talks to sidecars (a training server fitting Bayesian ridge, XGBoost or LightGBM models,
and prediction servers) through ``latencypredictorclient``. EPP separates the same seam as a :class:`LatencyPredictor`
Protocol: :class:`~epp.latency.inprocess.InProcessPredictor` implements it in process (EPP's default, no sidecar);
a client of the reference's sidecars could implement it too. The contract is synchronous because the producer
runs inside the scheduling cycle, which must not block: a remote implementation keeps its model local (the
reference's client does the same with ``UseNativeXGBoost``) and ships training data in the background.

Times are milliseconds, as on the reference's wire (``actual_ttft_ms``, ``ttft_ms``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Protocol, Sequence, runtime_checkable

__all__ = ["LatencyFeatures", "LatencyPrediction", "TrainingSample", "LatencyPredictor"]


@dataclass(frozen=True, slots=True)
class LatencyFeatures:
    """What one request would meet on one endpoint (the reference's ``PredictionRequest`` fields).

    ``kv_cache_percentage`` is the scraped KV-cache usage in [0, 1]; ``num_request_waiting`` the scraped queue;
    ``num_request_running`` and ``prefill_tokens_in_flight`` EPP's own in-flight counts for the endpoint (the
    reference reads them from its in-flight load producer); ``prefix_cache_score`` the share of the prompt's
    blocks the endpoint holds; ``pod_type`` the endpoint's role label value ("" when no role label is configured).
    """

    kv_cache_percentage: float
    input_token_length: int
    num_request_waiting: int
    num_request_running: int
    prefix_cache_score: float = 0.0
    num_tokens_generated: int = 1
    prefill_tokens_in_flight: int = 0
    decode_tokens_in_flight: int = 0
    pod_type: str = ""


@dataclass(frozen=True, slots=True)
class LatencyPrediction:
    """Predicted time to first token and time per output token, in milliseconds (never negative)."""

    ttft: float
    tpot: float


@dataclass(frozen=True, slots=True)
class TrainingSample:
    """One observation: the features a request was dispatched with and the latency it met. A TTFT sample has
    ``actual_tpot`` 0, a TPOT sample ``actual_ttft`` 0 (the reference's training entries); a value <= 0 trains
    nothing."""

    features: LatencyFeatures
    actual_ttft: float = 0.0
    actual_tpot: float = 0.0


@runtime_checkable
class LatencyPredictor(Protocol):
    """Predicts TTFT and TPOT per endpoint and learns from observations."""

    @property
    def ttft_ready(self) -> bool:
        """Whether TTFT predictions mean anything yet (a model has been fitted)."""
        ...

    @property
    def tpot_ready(self) -> bool:
        """Whether TPOT predictions mean anything yet."""
        ...

    def predict_bulk(self, features: Sequence[LatencyFeatures]) -> list[LatencyPrediction]:
        """One prediction per element of ``features``, same order. Cheap: it runs once per candidate endpoint in
        the scheduling cycle. A model that is not ready predicts 0 for its quantity (check the ``*_ready``
        properties first)."""
        ...

    def add_training_data(self, samples: Iterable[TrainingSample]) -> None:
        """Learn from ``samples``. Must not block for long: it runs on the response path (batch heavy work)."""
        ...
