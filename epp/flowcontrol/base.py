"""The admission seam the request path calls, and the queued-request record flow control keeps.

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
import math
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any, Callable, Protocol, runtime_checkable

from epp.framework.endpoint import Endpoint
from epp.framework.request import InferenceRequest

if TYPE_CHECKING:
    from epp.flowcontrol.queues import Flow

__all__ = ["Admission", "AdmissionController", "Candidates", "ItemState", "QueueItem", "FLOW_CONTROL_GATE",
           "Reason", "Outcome"]

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
