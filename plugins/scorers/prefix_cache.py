"""``prefix-cache-scorer``: prefers endpoints likely to hold the request's prompt prefix in their KV cache.

Reads the :class:`~epp.plugins.producers.approx_prefix_cache.PrefixMatch` a prefix producer writes into the cycle
state (``prefixMatchInfoProducerName``; default the ``approx-prefix-cache-producer``, which the loader creates with
the producer parameters set here). With ``m`` matched blocks of ``total``, ``b`` tokens per block, ``w`` =
``matchLengthWeight`` in [0, 1] and ``S`` = ``matchLengthScaleTokens``::

    score = w * min(1, m * b / S) ** 2 + (1 - w) * m / total
    score = 0                       # when the request has no blocks or there is no match info

YAML::

    - type: prefix-cache-scorer
      parameters:
        matchLengthWeight: 0.5
        matchLengthScaleTokens: 16384
        blockSizeTokens: 16
        maxPrefixBlocksToMatch: 256
        lruCapacityPerServer: 31250
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from epp.errors import ConfigError
from epp.framework.endpoint import Endpoint
from epp.framework.plugins import CycleState, Handle, Scorer
from epp.framework.request import CHARS_PER_TOKEN, InferenceRequest

from ..producers.approx_prefix_cache import (
    PRODUCER_TYPE,
    ApproxPrefixCacheProducer,
    BlockConfigError,
    PrefixCacheParams,
    PrefixMatch,
    PrefixMatchProducer,
    block_config,
    find_prefix_producer,
    producer_fields,
)

__all__ = ["PrefixCacheScorer"]

PRECISE_MODE = "cache_tracking"
DEFAULT_MATCH_LENGTH_SCALE_TOKENS = 8192


class PrefixCacheScorer:
    """``w·min(1, matchedTokens/S)² + (1−w)·matchBlocks/totalBlocks`` from the approximate prefix index."""

    type_name: ClassVar[str] = "prefix-cache-scorer"
    consumes: ClassVar[tuple[str, ...]] = (PRODUCER_TYPE,)

    class Params(PrefixCacheParams):
        mode: Literal["estimate", "cache_tracking"] = "estimate"
        match_length_weight: float = Field(0.0, alias="matchLengthWeight", ge=0.0, le=1.0)
        match_length_scale_tokens: int = Field(DEFAULT_MATCH_LENGTH_SCALE_TOKENS, alias="matchLengthScaleTokens")
        prefix_match_info_producer_name: str | None = Field(None, alias="prefixMatchInfoProducerName")

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
            raise ConfigError(f"plugin '{name}' (type: {self.type_name}): mode 'cache_tracking' (llm-d "
                              f"v0.3) is not implemented; for precise prefix-cache scoring from vLLM KV events "
                              f"declare a precise-prefix-cache-producer and a token-producer and set this scorer's "
                              f"prefixMatchInfoProducerName, or remove 'mode' to use the approximate prefix cache",
                              plugin=name, field="mode")
        if params.match_length_weight > 0 and params.match_length_scale_tokens <= 0:
            raise ConfigError(f"plugin '{name}' (type: {self.type_name}): matchLengthScaleTokens must be greater "
                              f"than 0 when matchLengthWeight is greater than 0, got "
                              f"{params.match_length_scale_tokens}", plugin=name, field="matchLengthScaleTokens")
        try:
            block_config(params)
        except BlockConfigError as exc:
            raise ConfigError(f"plugin '{name}' (type: {self.type_name}): {exc}", plugin=name,
                              field=exc.field) from exc
        self.producer: PrefixMatchProducer | None = None
        self._key = ""
        self._weight = params.match_length_weight
        self._scale = params.match_length_scale_tokens

    @classmethod
    def producer_params(cls, params: Any) -> dict[str, Any]:
        """The producer parameters set on this scorer, as raw YAML keys (for the auto-created producer)."""
        return producer_fields(params)

    def bind(self, handle: Handle) -> None:
        """Find the producer; its parameters must agree with any producer parameters set on this scorer."""
        producer = find_prefix_producer(self, handle, producer_name=self.params.prefix_match_info_producer_name)
        mine = producer_fields(self.params) if isinstance(producer, ApproxPrefixCacheProducer) else {}
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
        weight = self._weight
        if weight <= 0:
            return [get(ep.name, 0) / total for ep in endpoints]
        tokens_per_block = state.block_chars // CHARS_PER_TOKEN
        return [_blend(get(ep.name, 0), total, tokens_per_block, self._scale, weight) for ep in endpoints]


def _blend(matched: int, total: int, tokens_per_block: int, scale: int, weight: float) -> float:
    """``weight·min(1, matched·tokens_per_block/scale)² + (1−weight)·matched/total`` (no length term without a
    block size, as the reference)."""
    length = min(1.0, matched * tokens_per_block / scale) ** 2 if tokens_per_block > 0 else 0.0
    return weight * length + (1.0 - weight) * matched / total


_check: type[Scorer] = PrefixCacheScorer
