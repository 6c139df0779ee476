"""``precise-prefix-cache-scorer``: the older form of ``precise-prefix-cache-producer`` + ``prefix-cache-scorer``.

One plugin that both keeps the KV-event index (everything :mod:`epp.plugins.producers.precise_prefix_cache` does,
same parameters) and scores::

    score = tier-weighted consecutive blocks the endpoint holds from the first one / full blocks in the prompt

clipped to [0, 1]. Without a ``token-producer`` it loads with a warning and scores every endpoint 0 until token ids
are available. YAML::

    - type: token-producer
      parameters: {modelName: Qwen/Qwen3-0.6B, vllm: {http: "http://vllm-render:8000"}}
    - type: precise-prefix-cache-scorer
      parameters:
        tokenProcessorConfig: {blockSize: 16}
        kvEventsConfig: {discoverPods: true, podDiscoveryConfig: {socketPort: 5557}}
"""

from __future__ import annotations

import logging
from typing import ClassVar

from epp.framework.endpoint import Endpoint
from epp.framework.plugins import CycleState, Handle, Scorer
from epp.framework.request import InferenceRequest

from ..producers.precise_prefix_cache import TOKEN_PRODUCER_TYPES, PrecisePrefixCacheProducer, weighted_blocks

__all__ = ["PrecisePrefixCacheScorer"]

log = logging.getLogger(__name__)


class PrecisePrefixCacheScorer(PrecisePrefixCacheProducer):
    """The producer, plus a score: weighted matched blocks / prompt blocks."""

    type_name: ClassVar[str] = "precise-prefix-cache-scorer"
    needs_token_producer: ClassVar[bool] = False

    def bind(self, handle: Handle) -> None:
        super().bind(handle)
        if not any(p.type_name in TOKEN_PRODUCER_TYPES for p in handle.plugins()):
            log.warning("plugin '%s' (type: %s): no token-producer is configured, so requests carry no token ids and "
                        "this scorer gives every endpoint 0; declare a token-producer (a vLLM render endpoint)",
                        self.name, self.type_name)

    def score(self, cycle: CycleState, request: InferenceRequest, endpoints: list[Endpoint]) -> list[float]:
        found = weighted_blocks(cycle.get(self.state_key))
        if found is None:
            return [0.0] * len(endpoints)
        weighted, total = found
        return [min(1.0, weighted.get(ep.name, 0.0) / total) for ep in endpoints]


_check: type[Scorer] = PrecisePrefixCacheScorer
