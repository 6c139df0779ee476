"""EPP's own latency predictor: two :class:`~epp.latency.ridge.OnlineBayesianRidge` models in the EPP process.

It stands in for the reference's training and prediction sidecars, with the features those servers engineer (load,
KV use, prompt length, prefix score, pod role; TPOT without the prefix terms). Training
(:meth:`InProcessPredictor.add_training_data`) folds each sample into its model's statistics and refits once
``refit_every`` new samples have arrived; a model is ready after its first fit, at ``min_samples`` samples.
Predicting is one dot product per model and endpoint, clamped to >= 0; ``objective`` is ``"quantile"`` (mean plus
``z(quantile)`` noise standard deviations) or ``"mean"``.
"""

from __future__ import annotations

from statistics import NormalDist
from typing import Iterable, Literal, Sequence

from epp.latency.predictor import LatencyFeatures, LatencyPrediction, LatencyPredictor, TrainingSample
from epp.latency.ridge import OnlineBayesianRidge

__all__ = ["InProcessPredictor", "ttft_vector", "tpot_vector", "TTFT_FEATURES", "TPOT_FEATURES"]

TTFT_FEATURES = ("is_queued", "kv_cache_percentage", "input_token_length", "num_request_waiting",
                 "num_request_running", "prefill_tokens_in_flight", "prefix_cache_score", "effective_input_tokens",
                 "pod_type_prefill", "pod_type_decode")
TPOT_FEATURES = ("is_queued", "kv_cache_percentage", "input_token_length", "num_request_waiting",
                 "num_request_running", "prefill_tokens_in_flight", "pod_type_prefill", "pod_type_decode")


def ttft_vector(f: LatencyFeatures) -> tuple[float, ...]:
    """The TTFT model's inputs, in :data:`TTFT_FEATURES` order."""
    pod = f.pod_type
    return (1.0 if f.num_request_waiting > 0 else 0.0, f.kv_cache_percentage, f.input_token_length,
            f.num_request_waiting, f.num_request_running, f.prefill_tokens_in_flight, f.prefix_cache_score,
            (1.0 - f.prefix_cache_score) * f.input_token_length, 1.0 if pod == "prefill" else 0.0,
            1.0 if pod == "decode" else 0.0)


def tpot_vector(f: LatencyFeatures) -> tuple[float, ...]:
    """The TPOT model's inputs, in :data:`TPOT_FEATURES` order."""
    pod = f.pod_type
    return (1.0 if f.num_request_waiting > 0 else 0.0, f.kv_cache_percentage, f.input_token_length,
            f.num_request_waiting, f.num_request_running, f.prefill_tokens_in_flight,
            1.0 if pod == "prefill" else 0.0, 1.0 if pod == "decode" else 0.0)


class _Model:
    """One quantity's regression, with its refit schedule."""

    __slots__ = ("ridge", "min_samples", "refit_every", "pending")

    def __init__(self, dim: int, window: float, min_samples: int, refit_every: int) -> None:
        self.ridge = OnlineBayesianRidge(dim, window)
        self.min_samples, self.refit_every = min_samples, refit_every
        self.pending = 0

    def add(self, x: Sequence[float], y: float) -> None:
        self.ridge.add(x, y)
        self.pending += 1
        ridge = self.ridge
        if ridge.count >= self.min_samples and (not ridge.fitted or self.pending >= self.refit_every):
            ridge.fit()
            self.pending = 0


class InProcessPredictor:
    """A :class:`~epp.latency.predictor.LatencyPredictor` learning online in the EPP process (module doc).

    ``min_samples`` (>= 2) samples before a model is ready, a refit every ``refit_every`` samples after that,
    ``window``: about how many recent samples the models remember.
    """

    def __init__(self, *, min_samples: int = 10, refit_every: int = 10, window: int = 1000,
                 objective: Literal["mean", "quantile"] = "quantile", quantile: float = 0.9) -> None:
        if min_samples < 2 or refit_every < 1 or window < 1:
            raise ValueError("min_samples must be >= 2, refit_every and window >= 1")
        if objective not in ("mean", "quantile") or not 0.0 < quantile < 1.0:
            raise ValueError("objective must be 'mean' or 'quantile', with 0 < quantile < 1")
        self._ttft = _Model(len(TTFT_FEATURES), window, min_samples, refit_every)
        self._tpot = _Model(len(TPOT_FEATURES), window, min_samples, refit_every)
        self._z = NormalDist().inv_cdf(quantile) if objective == "quantile" else 0.0

    @property
    def ttft_ready(self) -> bool:
        return self._ttft.ridge.fitted

    @property
    def tpot_ready(self) -> bool:
        return self._tpot.ridge.fitted

    @property
    def samples(self) -> tuple[int, int]:
        """(TTFT samples, TPOT samples) learnt so far."""
        return self._ttft.ridge.count, self._tpot.ridge.count

    def predict_bulk(self, features: Sequence[LatencyFeatures]) -> list[LatencyPrediction]:
        """One clamped prediction per element (0 for a quantity whose model is not ready)."""
        ttft = self._ttft.ridge if self._ttft.ridge.fitted else None
        tpot = self._tpot.ridge if self._tpot.ridge.fitted else None
        z = self._z
        out: list[LatencyPrediction] = []
        for f in features:
            t = ttft.predict(ttft_vector(f), z) if ttft is not None else 0.0
            p = tpot.predict(tpot_vector(f), z) if tpot is not None else 0.0
            out.append(LatencyPrediction(t if t > 0.0 else 0.0, p if p > 0.0 else 0.0))
        return out

    def add_training_data(self, samples: Iterable[TrainingSample]) -> None:
        """Learn each positive ``actual_ttft`` / ``actual_tpot``; refits are batched (class doc)."""
        for s in samples:
            if s.actual_ttft > 0.0:
                self._ttft.add(ttft_vector(s.features), s.actual_ttft)
            if s.actual_tpot > 0.0:
                self._tpot.add(tpot_vector(s.features), s.actual_tpot)

    def coefficients(self) -> dict[str, dict[str, float]]:
        """The fitted models in raw feature units (``intercept`` and one entry per feature), as the training
        server's ``/metrics`` shows its Bayesian ridge coefficients."""
        out: dict[str, dict[str, float]] = {}
        for key, model, names in (("ttft", self._ttft, TTFT_FEATURES), ("tpot", self._tpot, TPOT_FEATURES)):
            ridge = model.ridge
            out[key] = {"intercept": ridge.intercept, **dict(zip(names, ridge.coef))}
        return out


_check: type[LatencyPredictor] = InProcessPredictor
