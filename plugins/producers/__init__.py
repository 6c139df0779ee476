"""Built-in producers plugins; `register` adds each class listed in BUILTINS (with its aliases)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .approx_prefix_cache import ApproxPrefixCacheProducer
from .inflight_load import InFlightLoadProducer
from .mm_embeddings_cache import MmEmbeddingsCacheProducer
from .precise_prefix_cache import PrecisePrefixCacheProducer
from .predicted_latency import PredictedLatencyProducer
from .session_id import SessionIdProducer
from .token_producer import TokenProducer

if TYPE_CHECKING:
    from epp.framework.registry import Registry

BUILTINS: list[tuple[type, tuple[str, ...]]] = [
    (ApproxPrefixCacheProducer, ()),
    (PrecisePrefixCacheProducer, ()),
    (TokenProducer, ("tokenizer",)),
    (InFlightLoadProducer, ()),
    (PredictedLatencyProducer, ()),
    (MmEmbeddingsCacheProducer, ()),
    (SessionIdProducer, ()),
]


def register(registry: Registry) -> None:
    """Register this group's plugin classes."""
    for cls, aliases in BUILTINS:
        registry.register(cls, aliases=aliases)
