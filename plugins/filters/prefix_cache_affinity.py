"""``prefix-cache-affinity-filter``: narrows the candidates to "sticky" endpoints that hold most of the prompt.

Reads the prefix match of ``approx-prefix-cache-producer`` (``score = matchBlocks / totalBlocks``)::

    keep all   if len(endpoints) <= 1 or affinityThreshold <= 0
    keep all   with probability explorationProbability            # exploration
    sticky   = endpoints with score >= affinityThreshold
    keep all   if sticky is empty
    keep all   if maxTokensInFlightPenalty > 0 and
                  min(inflight_tokens of sticky) - min(inflight_tokens of the others) > maxTokensInFlightPenalty
    keep sticky otherwise

``maxTTFTPenaltyMs`` gates on predicted TTFT in the reference; EPP has no latency predictor, so every endpoint's
prediction is unknown and, as in the reference when predictions are missing, this gate never opens. It is
accepted for config compatibility. ``prefixMatchInfoProducerName`` names the producer to read (default: the
configured ``approx-prefix-cache-producer``); ``inFlightLoadProducerName`` names the in-flight load to read (a
configured ``inflight-load-producer``).

YAML::

    - type: prefix-cache-affinity-filter
      parameters:
        affinityThreshold: 0.80
        explorationProbability: 0.01
        maxTTFTPenaltyMs: 5000
        maxTokensInFlightPenalty: 0
"""

from __future__ import annotations

import random
from typing import Any, ClassVar

from pydantic import Field

from epp.endpoint import Endpoint
from epp.framework import CycleState, Filter, Handle, Params
from epp.request import InferenceRequest
from plugins.producers.approx_prefix_cache import PRODUCER_TYPE, PrefixMatch, find_prefix_producer
from plugins.producers.inflight_load import check_load_producer_name

__all__ = ["PrefixCacheAffinityFilter"]


class PrefixCacheAffinityFilter:
    """Keeps endpoints whose prefix score reaches ``affinityThreshold`` unless exploring or they are overloaded."""

    type_name: ClassVar[str] = "prefix-cache-affinity-filter"
    consumes: ClassVar[tuple[str, ...]] = (PRODUCER_TYPE,)

    class Params(Params):
        affinity_threshold: float = Field(0.80, alias="affinityThreshold", le=1.0)
        exploration_probability: float = Field(0.01, alias="explorationProbability", ge=0.0, le=1.0)
        max_ttft_penalty_ms: float = Field(5000, alias="maxTTFTPenaltyMs", ge=0)
        max_tokens_in_flight_penalty: int = Field(0, alias="maxTokensInFlightPenalty", ge=0)
        prefix_match_info_producer_name: str | None = Field(None, alias="prefixMatchInfoProducerName")
        in_flight_load_producer_name: str | None = Field(None, alias="inFlightLoadProducerName")

    def __init__(self, name: str, params: Params, handle: Handle, *, rng: random.Random | None = None) -> None:
        self.name = name
        self.params = params
        self.rng = rng or random.Random()
        self._threshold = params.affinity_threshold
        self._explore = params.exploration_probability
        self._token_penalty = params.max_tokens_in_flight_penalty
        self._key = ""

    @classmethod
    def producer_params(cls, params: Any) -> dict[str, Any]:
        """No producer parameters of its own: an auto-created producer uses the defaults."""
        return {}

    def bind(self, handle: Handle) -> None:
        name = self.params.prefix_match_info_producer_name
        self._key = find_prefix_producer(self, handle, producer_name=name).state_key
        check_load_producer_name(self, handle, self.params.in_flight_load_producer_name)

    def filter(self, cycle: CycleState, request: InferenceRequest, endpoints: list[Endpoint]) -> list[Endpoint]:
        threshold = self._threshold
        if len(endpoints) <= 1 or threshold <= 0:
            return endpoints
        if self._explore > 0 and self.rng.random() < self._explore:
            return endpoints
        state = cycle.get(self._key)
        if not isinstance(state, PrefixMatch) or not state.hashes:
            return endpoints
        sticky: list[Endpoint] = []
        others: list[Endpoint] = []
        for ep in endpoints:
            (sticky if state.score(ep.name) >= threshold else others).append(ep)
        if not sticky:
            return endpoints
        if self._token_penalty > 0 and others:
            best_sticky = min(ep.inflight_tokens for ep in sticky)
            best_other = min(ep.inflight_tokens for ep in others)
            if best_sticky - best_other > self._token_penalty:
                return endpoints
        return sticky


_check: type[Filter] = PrefixCacheAffinityFilter
