"""``latency-slo-admitter``: denies a sheddable request with SLOs that no candidate is predicted to meet.

An Admitter: it runs after the data producers, so it reads the predictions ``predicted-latency-producer`` made for
this request (:func:`epp.latency.predictions_of`). It fails open; a request is denied only when all of these hold::

    the request is sheddable (priority < 0)
    it carries an SLO: x-llm-d-router-slo-ttft-ms > 0 or x-llm-d-router-slo-tpot-ms > 0 (or the deprecated
        x-slo-*-ms aliases; a value Go's strconv.ParseFloat rejects counts 0)
    at least one candidate has a prediction, and no candidate's prediction is valid (within both SLOs)
    no candidate is idle (scraped running requests == 0): an idle endpoint can likely serve it anyway
    no candidate is cold (scraped KV-cache usage < 2 %): its predictions may be unreliable

A denial ends the request as every Admitter's does (500).

YAML::

    - type: latency-slo-admitter
"""

from __future__ import annotations

from typing import Any, ClassVar, Mapping, Sequence

from pydantic import Field

from epp.framework.endpoint import Endpoint
from epp.framework.plugins import Admitter, CycleState, Handle
from epp.framework.plugins import Params as PluginParams
from epp.framework.request import InferenceRequest
from epp.headers import SLO_TPOT_HEADER, SLO_TTFT_HEADER
from epp.latency import PRODUCER_TYPE, predictions_of
from epp.latency.slo import slo_header_ms

from ..latency_reader import check_latency_producer_name

__all__ = ["LatencySloAdmitter", "COLD_KV_USAGE", "REJECTION_REASON"]

COLD_KV_USAGE = 0.02
"""Below this scraped KV-cache usage an endpoint is cold: its predictions may be unreliable."""
REJECTION_REASON = "no valid endpoint available to serve the request"
"""The reference's error text (the Director prefixes ``request cannot be admitted: ``)."""

class LatencySloAdmitter:
    """An Admitter: denies a sheddable request carrying a TTFT or TPOT SLO when predictions exist for the candidates,
    none is valid, and no candidate is idle or cold; admits everything else (fail-open)."""

    type_name: ClassVar[str] = "latency-slo-admitter"
    consumes: ClassVar[tuple[str, ...]] = (PRODUCER_TYPE,)

    class Params(PluginParams):
        latency_prediction_info_producer_name: str | None = Field(None, alias="latencyPredictionInfoProducerName")

    def __init__(self, name: str, params: Params, handle: Handle | None = None) -> None:
        self.name = name
        self.params = params

    @classmethod
    def producer_params(cls, params: Any) -> dict[str, Any]:
        """No producer parameters of its own: an auto-created producer uses its defaults."""
        return {}

    def bind(self, handle: Handle) -> None:
        """Check ``latencyPredictionInfoProducerName``."""
        check_latency_producer_name(self, handle, self.params.latency_prediction_info_producer_name)

    def admit_request(self, request: InferenceRequest, endpoints: Sequence[Endpoint],
                      cycle: CycleState) -> str | None:
        """None to admit; :data:`REJECTION_REASON` when the request is denied."""
        if not request.sheddable or not self._has_slo(request.headers):
            return None
        predictions = predictions_of(cycle)
        predicted = False
        for ep in endpoints:
            if ep.metrics.kv_usage < COLD_KV_USAGE or ep.metrics.running == 0:
                return None  # a cold or idle endpoint: admit
            info = predictions.get(ep.name)
            if info is not None:
                if info.valid:
                    return None
                predicted = True
        return REJECTION_REASON if predicted else None

    @staticmethod
    def _has_slo(headers: Mapping[str, str]) -> bool:
        """A positive TTFT or TPOT SLO header."""
        return slo_header_ms(headers, SLO_TTFT_HEADER) > 0 or slo_header_ms(headers, SLO_TPOT_HEADER) > 0


_check: type[Admitter] = LatencySloAdmitter
