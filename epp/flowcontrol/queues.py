"""Queues: a flow's ordered queue, flows keyed by (fairness id, priority), and priority bands.

:class:`ItemHeap` keeps items in the order of a key function and supports O(log n) removal from anywhere (lazy
deletion: a removed item stays in the heap until it reaches the top; the heap is compacted when dead entries
outnumber live ones). Flows and bands only keep counts; the controller owns every state change.
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING, Callable, Iterator

from epp.flowcontrol.config import PriorityBandConfig
from epp.flowcontrol.base import QueueItem

if TYPE_CHECKING:
    from epp.flowcontrol.policies import FlowSelector, OrderingPolicy
    from epp.flowcontrol.quotas import TenantState

__all__ = ["ItemHeap", "Flow", "Band", "FlowKey"]

FlowKey = tuple[str, int]
"""(fairness id, priority)."""

_COMPACT_SLACK = 32


class ItemHeap:
    """Items ordered by ``key(item)`` then arrival (``seq``); ``remove`` works on any member."""

    __slots__ = ("_key", "_heap", "_members")

    def __init__(self, key: Callable[[QueueItem], tuple[float, ...]]) -> None:
        self._key = key
        self._heap: list[tuple[tuple[float, ...], int, QueueItem]] = []
        self._members: set[int] = set()

    def __len__(self) -> int:
        return len(self._members)

    def __contains__(self, item: QueueItem) -> bool:
        return item.seq in self._members

    def __iter__(self) -> Iterator[QueueItem]:
        """Live items, in no particular order."""
        return (entry[2] for entry in self._heap if entry[1] in self._members)

    def key(self, item: QueueItem) -> tuple[float, ...]:
        """``item``'s ordering key as this heap computes it now."""
        return self._key(item)

    def push(self, item: QueueItem) -> None:
        heapq.heappush(self._heap, (self._key(item), item.seq, item))
        self._members.add(item.seq)

    def head_entry(self) -> tuple[tuple[float, ...], int, QueueItem] | None:
        """The first live entry ``(key, seq, item)``, or None when empty."""
        heap = self._heap
        while heap and heap[0][1] not in self._members:
            heapq.heappop(heap)
        return heap[0] if heap else None

    def head(self) -> QueueItem | None:
        """The first live item, or None when empty."""
        entry = self.head_entry()
        return entry[2] if entry is not None else None

    def discard(self, item: QueueItem) -> None:
        """Remove ``item`` and every stale entry of it, if it is a member (so it can be pushed again with a new
        key); O(n), for the rare re-keying of a queued item."""
        if item not in self:
            return
        self._members.remove(item.seq)
        self._heap = [e for e in self._heap if e[1] in self._members]
        heapq.heapify(self._heap)

    def remove(self, item: QueueItem) -> None:
        """Remove a member (the head or any other)."""
        self._members.remove(item.seq)
        if self._heap and self._heap[0][1] == item.seq:
            heapq.heappop(self._heap)
        elif len(self._heap) > 2 * len(self._members) + _COMPACT_SLACK:
            self._heap = [e for e in self._heap if e[1] in self._members]
            heapq.heapify(self._heap)


class Flow:
    """The queue of one (fairness id, priority): ordered by the band's ordering policy."""

    __slots__ = ("key", "tenant", "ordinal", "queue", "bytes", "last_active")

    def __init__(self, key: FlowKey, tenant: TenantState, ordinal: int, ordering: OrderingPolicy,
                 now: float) -> None:
        self.key = key
        self.tenant = tenant
        self.ordinal = ordinal  # creation order: round-robin and DRR cursors walk flows in this order
        self.queue = ItemHeap(ordering.key)
        self.bytes = 0
        self.last_active = now

    @property
    def fairness_id(self) -> str:
        return self.key[0]

    @property
    def priority(self) -> int:
        return self.key[1]

    @property
    def weight(self) -> float:
        """The tenant's weight (weighted-fair shares dispatches in proportion to it)."""
        return self.tenant.weight

    def __len__(self) -> int:
        return len(self.queue)

    def __repr__(self) -> str:
        return f"Flow({self.key[0]!r}, {self.key[1]}, queued={len(self.queue)})"


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
