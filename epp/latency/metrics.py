"""The latency predictor's Prometheus metrics, with the reference's names, labels and buckets.

Recorded once per successful request, when it ends, in seconds: the observed TTFT, the predicted TTFT and TPOT, the
observed TPOT and SLO violations by ``type``, under the current ``llm_d_epp_*`` names (with ``plugin_name,
plugin_type`` labels) and the deprecated ``inference_objective_*`` twins. One :class:`LatencyMetrics` per registry
serves every producer instance; its model label values are bounded by the request metrics'
:class:`~epp.metrics.labels.RequestLabels`. The family list is in docs/reference-parity.md.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from epp.metrics.instruments import counter, histogram
from epp.metrics.labels import RequestLabels

__all__ = ["LatencyMetrics"]

_M = ("model_name", "target_model_name")
_PLUGIN = ("plugin_name", "plugin_type")
_LATENCY = (0.005, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.25, 1.5, 2, 3, 4, 5, 6, 8, 10, 15, 20, 30, 45, 60,
            120, 180, 240, 300, 360, 480, 600, 900, 1200, 1800, 2700, 3600)
_TPOT = (0.0005, 0.00205, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.125, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 1, 1.5,
         2, 3, 4.5, 6, 12, 18, 24, 30, 36, 48, 60, 90, 120, 180, 270, 360)
_LLMD = "llm_d_epp_"
_OBJ = "inference_objective_"


class LatencyMetrics:
    """The families on ``registry`` and the calls ``predicted-latency-producer`` records through; ``labels``
    bounds the model labels (default: bounds of its own)."""

    def __init__(self, registry: CollectorRegistry, labels: RequestLabels | None = None) -> None:
        r = registry
        self.labels = labels or RequestLabels()
        self.ttft = histogram(_OBJ + "request_ttft_seconds", "[Deprecated: Use llm_d_epp_request_ttft_seconds] "
                              "Inference model TTFT distribution in seconds for each model and target model.", _M,
                              buckets=_LATENCY, registry=r)
        self.predicted_ttft = histogram(_LLMD + "request_predicted_ttft_seconds", "Inference model Predicted TTFT "
                                        "distribution in seconds for each model and target model.", (*_PLUGIN, *_M),
                                        buckets=_LATENCY, registry=r)
        self.tpot = histogram(_LLMD + "request_tpot_seconds", "Inference model TPOT distribution in seconds for "
                              "each model and target model.", (*_PLUGIN, *_M), buckets=_TPOT, registry=r)
        self.predicted_tpot = histogram(_LLMD + "request_predicted_tpot_seconds", "Inference model Predicted TPOT "
                                        "distribution in seconds for each model and target model.", (*_PLUGIN, *_M),
                                        buckets=_TPOT, registry=r)
        self.violations = counter(_LLMD + "request_slo_violation_total", "Counter of SLO violations for each model, "
                                  "target model, and violation type.", (*_PLUGIN, *_M, "type"), registry=r)
        self.old_predicted_ttft = histogram(_OBJ + "request_predicted_ttft_seconds", "[Deprecated: Use "
                                            "llm_d_epp_request_predicted_ttft_seconds] Inference model "
                                            "Predicted TTFT distribution in seconds for each model and target model.",
                                            _M, buckets=_LATENCY, registry=r)
        self.old_tpot = histogram(_OBJ + "request_tpot_seconds", "[Deprecated: Use llm_d_epp_request_tpot_"
                                  "seconds] Inference model TPOT distribution in seconds for each model and target "
                                  "model.", _M, buckets=_TPOT, registry=r)
        self.old_predicted_tpot = histogram(_OBJ + "request_predicted_tpot_seconds", "[Deprecated: Use "
                                            "llm_d_epp_request_predicted_tpot_seconds] Inference model "
                                            "Predicted TPOT distribution in seconds for each model and target model.",
                                            _M, buckets=_TPOT, registry=r)
        self.old_violations = counter(_OBJ + "request_slo_violation_total", "[Deprecated: Use llm_d_epp_"
                                      "request_slo_violation_total] Counter of SLO violations for each model, target "
                                      "model, and violation type.", (*_M, "type"), registry=r)

    def record_ttft(self, plugin: tuple[str, str], model: tuple[str, str], fairness: tuple[str, str], actual: float,
                    predicted: float, slo: float) -> None:
        """A request's TTFT and its prediction (seconds); a violation when ``slo`` (seconds) > 0 and is exceeded.
        ``plugin`` = (name, type), ``model`` = (model, target model), ``fairness`` = (fairness id,
        objective) is not recorded: the plugin-labelled family that had it is not registered (module docstring)."""
        if actual < 0:
            return
        model = self.labels.pair(*model)
        self.ttft.labels(*model).observe(actual)
        if predicted >= 0:
            self.predicted_ttft.labels(*plugin, *model).observe(predicted)
            self.old_predicted_ttft.labels(*model).observe(predicted)
        if slo > 0 and actual > slo:
            self._violation(plugin, model, "ttft")

    def record_tpot(self, plugin: tuple[str, str], model: tuple[str, str], actual: float, predicted: float,
                    slo: float) -> None:
        """A request's average TPOT and its prediction (seconds), and a violation as :meth:`record_ttft`."""
        if actual < 0:
            return
        model = self.labels.pair(*model)
        self.tpot.labels(*plugin, *model).observe(actual)
        self.old_tpot.labels(*model).observe(actual)
        if predicted >= 0:
            self.predicted_tpot.labels(*plugin, *model).observe(predicted)
            self.old_predicted_tpot.labels(*model).observe(predicted)
        if slo > 0 and actual > slo:
            self._violation(plugin, model, "tpot")

    def _violation(self, plugin: tuple[str, str], model: tuple[str, str], kind: str) -> None:
        self.violations.labels(*plugin, *model, kind).inc()
        self.old_violations.labels(*model, kind).inc()
