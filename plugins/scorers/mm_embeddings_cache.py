"""``mm-embeddings-cache-scorer``: prefers endpoints likely to hold the request's images, audio and video in vLLM's
multimodal encoder (embeddings) cache.

Reads the :class:`~epp.plugins.producers.mm_embeddings_cache.EncoderCacheMatch` that ``mm-embeddings-cache-producer``
writes into the cycle state (the loader creates that producer when none is configured; ``producerName`` must name
one). It neither hashes media nor keeps state. Formula::

    score = matched item size / total request item size     # item size: placeholder tokens, else 1 per item
    score = 0    # no match info (a text-only request), or a total size that is not positive

YAML::

    - type: mm-embeddings-cache-producer
      parameters: {cacheSizeInMBPerServer: 2048}
    - type: mm-embeddings-cache-scorer
      parameters:
        producerName: mm-embeddings-cache-producer   # optional
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from epp.framework.endpoint import Endpoint
from epp.framework.plugins import CycleState, Handle, Scorer
from epp.framework.plugins import Params as PluginParams
from epp.framework.request import InferenceRequest

from ..producers.mm_embeddings_cache import PRODUCER_TYPE, EncoderCacheMatch, find_mm_producer

__all__ = ["MmEmbeddingsCacheScorer"]


class MmEmbeddingsCacheScorer:
    """``matched size / total size`` of the request's multimodal items per endpoint, in [0, 1]; 0 without items."""

    type_name: ClassVar[str] = "mm-embeddings-cache-scorer"
    consumes: ClassVar[tuple[str, ...]] = (PRODUCER_TYPE,)

    class Params(PluginParams):
        producer_name: str | None = Field(None, alias="producerName")

    def __init__(self, name: str, params: Params, handle: Handle) -> None:
        self.name = name
        self.params = params
        self._key = ""

    def bind(self, handle: Handle) -> None:
        """Find the producer whose match this scorer reads (see :func:`find_mm_producer`)."""
        self._key = find_mm_producer(self, handle, self.params.producer_name).state_key

    def score(self, cycle: CycleState, request: InferenceRequest, endpoints: list[Endpoint]) -> list[float]:
        state = cycle.get(self._key)
        if not isinstance(state, EncoderCacheMatch):
            return [0.0] * len(endpoints)
        return [state.score(ep.name) for ep in endpoints]


_check: type[Scorer] = MmEmbeddingsCacheScorer
