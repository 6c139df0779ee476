"""``token-load-scorer``: prefers endpoints with fewer estimated tokens in flight from this EPP.

Formula (``t`` = :attr:`Endpoint.inflight_tokens`, the tokens the ``inflight-load-producer`` booked for the
requests in flight on the endpoint; ``T`` = ``queueThresholdTokens``)::

    score = 1 - min(t, T) / T

``inFlightLoadProducerName`` names the producer to read; it must be a configured ``inflight-load-producer``.

YAML::

    - type: token-load-scorer
      parameters:
        queueThresholdTokens: 4194304
        inFlightLoadProducerName: inflight-load-producer   # optional
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from epp.framework.endpoint import Endpoint
from epp.framework.plugins import CycleState, Handle, Scorer
from epp.framework.plugins import Params as PluginParams
from epp.framework.request import InferenceRequest

from ..fallback import fall_back
from ..producers.inflight_load import check_load_producer_name

__all__ = ["TokenLoadScorer"]

_DEFAULT = 4_194_304


class TokenLoadScorer:
    """Linear in in-flight tokens: 1 when idle, 0 at or above ``queueThresholdTokens``."""

    type_name: ClassVar[str] = "token-load-scorer"

    class Params(PluginParams):
        queue_threshold_tokens: int = Field(_DEFAULT, alias="queueThresholdTokens")
        in_flight_load_producer_name: str | None = Field(None, alias="inFlightLoadProducerName")

    def __init__(self, name: str, params: Params, handle: Handle) -> None:
        self.name = name
        self.params = params
        t = params.queue_threshold_tokens
        self._threshold = fall_back(self, "queueThresholdTokens", t, _DEFAULT, t > 0)

    def bind(self, handle: Handle) -> None:
        check_load_producer_name(self, handle, self.params.in_flight_load_producer_name)

    def score(self, cycle: CycleState, request: InferenceRequest, endpoints: list[Endpoint]) -> list[float]:
        t = self._threshold
        return [1.0 - min(ep.inflight_tokens, t) / t for ep in endpoints]


_check: type[Scorer] = TokenLoadScorer
