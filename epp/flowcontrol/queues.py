"""Priority bands (:class:`Band`); the flow queue they hold is defined in :mod:`epp.flowcontrol.base` and re-exported here.

:class:`ItemHeap` keeps items in the order of a key function and supports O(log n) removal from anywhere (lazy
deletion: a removed item stays in the heap until it reaches the top; the heap is compacted when dead entries
outnumber live ones). Flows and bands only keep counts; the controller owns every state change.
"""

from __future__ import annotations

from epp.flowcontrol.base import Flow, FlowKey, ItemHeap, OrderingPolicy
from epp.flowcontrol.config import PriorityBandConfig
from epp.flowcontrol.policies import FlowSelector

__all__ = ["ItemHeap", "Flow", "Band", "FlowKey"]  # all but Band live in .base: a queued item refers to its flow


class Band:
    """One priority level: its flows (in creation order), capacity counters and per-band policy state."""

    __slots__ = ("priority", "config", "ordering", "selector", "flows", "queued", "bytes", "last_active",
                 "configured")

    def __init__(self, config: PriorityBandConfig, ordering: OrderingPolicy, selector: FlowSelector,
                 configured: bool, now: float) -> None:
        self.priority = config.priority
        self.config = config
        self.ordering = ordering
        self.selector = selector
        self.flows: dict[str, Flow] = {}
        self.queued = 0
        self.bytes = 0
        self.last_active = now
        self.configured = configured

    def over_capacity(self, size: int) -> str | None:
        """Which band limit one more request of ``size`` bytes would break: "requests", "bytes" or None."""
        if self.config.request_limit and self.queued + 1 > self.config.request_limit:
            return "requests"
        if self.config.byte_limit and self.bytes + size > self.config.byte_limit:
            return "bytes"
        return None

    def __repr__(self) -> str:
        return f"Band({self.priority}, flows={len(self.flows)}, queued={self.queued})"
