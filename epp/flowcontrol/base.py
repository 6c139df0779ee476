"""The admission seam the request path calls, the queued-request record, and a flow's queue (:class:`ItemHeap`,
:class:`Flow`, :class:`FlowKey`, :class:`OrderingPolicy`), which refer to each other and so live together.

Contract of :class:`AdmissionController.admit`: it returns an :class:`Admission` once the request may go to the
model servers (at once when flow control is off), raises :class:`~epp.errors.Saturated` (429, ``reason`` names the
limit, or the request waited out its queue-wait budget), :class:`~epp.errors.NoCandidates` or
:class:`~epp.errors.RequestExpired` (503: no endpoints, or shutdown; see :mod:`epp.flowcontrol.budget`); if the
awaiting task is cancelled (client disconnect) the
request leaves its queue at once. The caller must ``release()`` the admission when the request ends, however it
ends; ``release`` is idempotent, so the quota comes back exactly once.
"""

from __future__ import annotations

import asyncio
import heapq
import math
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Callable, Iterator, Protocol, runtime_checkable

from epp.flowcontrol.quotas import TenantState
from epp.framework.endpoint import Endpoint
from epp.framework.request import InferenceRequest

__all__ = ["Admission", "AdmissionController", "Candidates", "ItemState", "QueueItem", "FLOW_CONTROL_GATE",
           "Reason", "Outcome", "OrderingPolicy", "ItemHeap", "Flow", "FlowKey"]

FLOW_CONTROL_GATE = "flowControl"

Candidates = Callable[[], list[Endpoint]]
"""Returns the endpoints a request may go to; saturation is computed over them."""


@runtime_checkable
class Admission(Protocol):
    def release(self) -> None:
        """Give back the quota / in-flight slot. Idempotent: only the first call has an effect."""
        ...


@runtime_checkable
class AdmissionController(Protocol):
    async def admit(self, request: InferenceRequest, candidates: Candidates) -> Admission:
        """Admit ``request`` (may wait); raises ``Saturated`` (429) or ``RequestExpired`` (503)."""
        ...

    async def start(self) -> None:
        """Start background work (dispatcher, expiry tick). Call once, inside the serving event loop."""
        ...

    async def stop(self) -> None:
        """Stop background work; requests still waiting fail with ``RequestExpired`` (503)."""
        ...

    def snapshot(self) -> dict[str, Any]:
        """A JSON-able view of tenants' quotas, in-flight and queues (served at ``GET /debug/tenants``)."""
        ...


class Reason:
    """``reason`` values of rejections (the ``reason`` label of the rejections metric, and the error's code)."""

    POOL_SATURATED = "pool_saturated"
    TENANT_RATE = "tenant_rate_limit"
    TENANT_QUEUE = "tenant_queue_limit"
    TENANT_TOKENS = "tenant_token_quota"
    BAND_REQUESTS = "band_capacity_requests"
    BAND_BYTES = "band_capacity_bytes"
    GLOBAL_REQUESTS = "global_capacity_requests"
    GLOBAL_BYTES = "global_capacity_bytes"
    TTL = "request_ttl_expired"
    NO_ENDPOINTS = "no_endpoints_ttl_expired"
    SHUTDOWN = "shutdown"


class Outcome:
    """``outcome`` label values of the queue-duration histograms (the reference's ``QueueOutcome`` names).

    ``NOT_YET_FINALIZED`` is the enqueue-duration outcome of a request that was queued (its final outcome comes
    later); the others are final.
    """

    NOT_YET_FINALIZED = "NotYetFinalized"
    DISPATCHED = "Dispatched"
    REJECTED_CAPACITY = "RejectedCapacity"
    REJECTED_NO_ENDPOINTS = "RejectedNoEndpoints"
    REJECTED_OTHER = "RejectedOther"
    EVICTED_TTL = "EvictedTTL"
    EVICTED_NO_ENDPOINTS = "EvictedNoEndpoints"
    EVICTED_CANCELLED = "EvictedContextCancelled"
    EVICTED_OTHER = "EvictedOther"


class ItemState(Enum):
    QUEUED = "queued"
    DISPATCHED = "dispatched"
    EXPIRED = "expired"
    CANCELLED = "cancelled"
    STOPPED = "stopped"


@dataclass(slots=True, eq=False)
class QueueItem:
    """One request waiting in a flow. ``deadline`` is ``inf`` when it has no TTL; ``seq`` orders arrivals."""

    request: InferenceRequest
    candidates: Candidates
    flow: Flow
    seq: int
    enqueue_time: float
    deadline: float
    size: int
    tokens: int
    future: asyncio.Future[Any]
    state: ItemState = ItemState.QUEUED
    grant: Admission | None = field(default=None, repr=False)
    no_endpoints: bool = False
    """The budget regime in force: True while the candidate pool has no endpoints (``noEndpointRequestTTL``)."""

    @property
    def has_deadline(self) -> bool:
        return not math.isinf(self.deadline)


@runtime_checkable
class OrderingPolicy(Protocol):
    def key(self, item: QueueItem) -> tuple[float, ...]:
        """Sort key of ``item`` within its flow: smaller is served first (ties: earlier arrival)."""
        ...


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
