"""``prefix-cache-scorer``: prefers endpoints likely to hold the request's prompt prefix in their KV cache.

Reads the :class:`~plugins.producers.approx_prefix_cache.PrefixMatch` that ``approx-prefix-cache-producer``
writes into the cycle state (the loader creates that producer when none is configured, with the producer
parameters set here)::

    score = matchBlocks / totalBlocks       # 0 when the request has no blocks or no match info

The producer's parameters (``autoTune``, ``blockSizeTokens``, ``blockSize``, ``hashBlockSize``,
``maxPrefixBlocksToMatch``, ``maxPrefixTokensToMatch``, ``lruCapacityPerServer``) are accepted here, as in llm-d.
``mode: cache_tracking`` (llm-d v0.3's precise, KV-event based scoring) is rejected: EPP does not implement it.

YAML::

    - type: prefix-cache-scorer
      parameters:
        blockSizeTokens: 16
        maxPrefixBlocksToMatch: 256
        lruCapacityPerServer: 31250
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import model_validator

from epp.endpoint import Endpoint
from epp.errors import ConfigError
from epp.framework import CycleState, Handle, Scorer
from epp.request import InferenceRequest
from plugins.producers.approx_prefix_cache import (PRODUCER_TYPE, ApproxPrefixCacheProducer, BlockConfigError,
                                                   PrefixCacheParams, PrefixMatch, block_config, find_prefix_producer,
                                                   producer_fields)

__all__ = ["PrefixCacheScorer"]

PRECISE_MODE = "cache_tracking"


class PrefixCacheScorer:
    """``matchBlocks / totalBlocks`` from the approximate prefix index."""

    type_name: ClassVar[str] = "prefix-cache-scorer"
    consumes: ClassVar[tuple[str, ...]] = (PRODUCER_TYPE,)

    class Params(PrefixCacheParams):
        mode: Literal["estimate", "cache_tracking"] = "estimate"

        @model_validator(mode="before")
        @classmethod
        def _precise_mode(cls, data: Any) -> Any:
            # The precise mode carries llm-d's indexer/kvEvents settings; it is refused in __init__ with a clear
            # message, so those keys must not fail first as "unknown parameter".
            if isinstance(data, dict) and data.get("mode") == PRECISE_MODE:
                return {"mode": PRECISE_MODE}
            return data

    def __init__(self, name: str, params: Params, handle: Handle) -> None:
        self.name = name
        self.params = params
        if params.mode == PRECISE_MODE:
            raise ConfigError(f"plugin '{name}' (type: {self.type_name}): mode 'cache_tracking' is precise prefix-"
                              f"cache scoring from vLLM KV events, which EPP does not implement; remove 'mode' to "
                              f"use the approximate prefix cache", plugin=name, field="mode")
        try:
            block_config(params)
        except BlockConfigError as exc:
            raise ConfigError(f"plugin '{name}' (type: {self.type_name}): {exc}", plugin=name,
                              field=exc.field) from exc
        self.producer: ApproxPrefixCacheProducer | None = None
        self._key = ""

    @classmethod
    def producer_params(cls, params: Any) -> dict[str, Any]:
        """The producer parameters set on this scorer, as raw YAML keys (for the auto-created producer)."""
        return producer_fields(params)

    def bind(self, handle: Handle) -> None:
        """Find the producer; its parameters must agree with any producer parameters set on this scorer."""
        producer = find_prefix_producer(self, handle)
        mine = producer_fields(self.params)
        theirs = producer.params.model_dump(by_alias=True)
        clash = sorted(k for k, v in mine.items() if theirs.get(k) != v)
        if clash:
            uses = ", ".join(f"{k}={theirs.get(k)}" for k in clash)
            raise ConfigError(f"plugin '{self.name}' (type: {self.type_name}) sets {', '.join(clash)} but the "
                              f"{PRODUCER_TYPE} '{producer.name}' it reads uses {uses}; set the prefix-cache "
                              f"parameters in one place", plugin=self.name, field=clash[0])
        self.producer = producer
        self._key = producer.state_key

    def score(self, cycle: CycleState, request: InferenceRequest, endpoints: list[Endpoint]) -> list[float]:
        state = cycle.get(self._key)
        if not isinstance(state, PrefixMatch) or not state.hashes:
            return [0.0] * len(endpoints)
        total = len(state.hashes)
        get = state.matches.get
        return [get(ep.name, 0) / total for ep in endpoints]


_check: type[Scorer] = PrefixCacheScorer
