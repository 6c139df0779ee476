"""Precise prefix-cache state: an index of which endpoint holds which prompt block, fed by the model servers'
KV-cache events (:mod:`.index`, :mod:`.events`, :mod:`.subscriber`)."""

from epp.kvcache.events import (
                     AllBlocksCleared,
                     BlockRemoved,
                     BlockStored,
                     EventDecodeError,
                     apply_events,
                     decode_batch,
                     parse_topic,
)
from epp.kvcache.extra import BlockExtras, parse_mm_features, request_extras
from epp.kvcache.index import DEFAULT_TIER_WEIGHTS, KVBlockIndex, PodEntry, TokenProcessor, longest_prefix
from epp.kvcache.subscriber import KVEventSubscribers

__all__ = ["AllBlocksCleared", "BlockRemoved", "BlockStored", "EventDecodeError", "apply_events", "decode_batch",
           "parse_topic", "DEFAULT_TIER_WEIGHTS", "KVBlockIndex", "PodEntry", "TokenProcessor", "longest_prefix",
           "KVEventSubscribers", "BlockExtras", "request_extras", "parse_mm_features"]
