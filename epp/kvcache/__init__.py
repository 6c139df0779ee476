"""Precise prefix-cache state: an index of which endpoint holds which prompt block, fed by the model servers'
KV-cache events (:mod:`.index`, :mod:`.events`, :mod:`.subscriber`)."""

from .events import (AllBlocksCleared, BlockRemoved, BlockStored, EventDecodeError, apply_events, decode_batch,
                     parse_topic)
from .extra import BlockExtras, parse_mm_features, request_extras
from .index import DEFAULT_TIER_WEIGHTS, KVBlockIndex, PodEntry, TokenProcessor, longest_prefix
from .subscriber import KVEventSubscribers

__all__ = ["AllBlocksCleared", "BlockRemoved", "BlockStored", "EventDecodeError", "apply_events", "decode_batch",
           "parse_topic", "DEFAULT_TIER_WEIGHTS", "KVBlockIndex", "PodEntry", "TokenProcessor", "longest_prefix",
           "KVEventSubscribers", "BlockExtras", "request_extras", "parse_mm_features"]
