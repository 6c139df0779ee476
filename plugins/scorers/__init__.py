"""Built-in scorers plugins; `register` adds each class listed in BUILTINS (with its aliases)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .active_request import ActiveRequestScorer
from .batch_headroom import BatchHeadroomScorer
from .context_length_aware import ContextLengthAware
from .endpoint_attribute import EndpointAttributeScorer
from .header_label_affinity import HeaderLabelAffinityScorer
from .kv_cache_utilization import KvCacheUtilizationScorer
from .latency import LatencyScorer
from .load_aware import LoadAwareScorer
from .lora_affinity import LoraAffinityScorer
from .mm_embeddings_cache import MmEmbeddingsCacheScorer
from .no_hit_lru import NoHitLruScorer
from .precise_prefix_cache import PrecisePrefixCacheScorer
from .prefix_cache import PrefixCacheScorer
from .queue import QueueScorer
from .running_requests import RunningRequestsSizeScorer
from .session_affinity import SessionAffinityScorer
from .token_load import TokenLoadScorer
from .ttft_cost import TtftCostScorer

if TYPE_CHECKING:
    from epp.framework.registry import Registry

BUILTINS: list[tuple[type, tuple[str, ...]]] = [
    (QueueScorer, ()),
    (RunningRequestsSizeScorer, ()),
    (KvCacheUtilizationScorer, ("kv-cache-scorer",)),
    (LoraAffinityScorer, ()),
    (TokenLoadScorer, ()),
    (PrefixCacheScorer, ()),
    (SessionAffinityScorer, ()),
    (NoHitLruScorer, ()),
    (LoadAwareScorer, ()),
    (ActiveRequestScorer, ()),
    (BatchHeadroomScorer, ()),
    (ContextLengthAware, ()),
    (PrecisePrefixCacheScorer, ()),
    (LatencyScorer, ()),
    (MmEmbeddingsCacheScorer, ()),
    (EndpointAttributeScorer, ()),
    (HeaderLabelAffinityScorer, ()),
    (TtftCostScorer, ()),
]


def register(registry: Registry) -> None:
    """Register this group's plugin classes."""
    for cls, aliases in BUILTINS:
        registry.register(cls, aliases=aliases)
