"""Per-endpoint queues of running requests ordered by TPOT SLO.

``predicted-latency-producer`` adds a request to its target's queue at dispatch and removes it when the request ends
(or its state expires). The queue answers in O(1) amortised how many requests EPP has dispatched to the endpoint and
not seen finish, and the tightest TPOT SLO among them, which caps the TPOT accepted for a new request there. A
request without a TPOT SLO is queued with SLO 0, which reads as "none". A binary heap with lazy deletion, rebuilt
when stale entries outnumber live ones. Event-loop only (no locks).
"""

from __future__ import annotations

import heapq

__all__ = ["TpotSloQueue", "RunningRequests"]


class TpotSloQueue:
    """One endpoint's running requests: id -> TPOT SLO (ms), with the minimum at hand."""

    __slots__ = ("_slos", "_heap")

    def __init__(self) -> None:
        self._slos: dict[str, float] = {}
        self._heap: list[tuple[float, str]] = []

    def __len__(self) -> int:
        return len(self._slos)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._slos

    def add(self, request_id: str, slo: float) -> bool:
        """Queue ``request_id`` with ``slo``; False (nothing changes) for an empty id, a negative SLO or an id
        already queued, as the reference's ``Add``."""
        if not request_id or slo < 0 or request_id in self._slos:
            return False
        self._slos[request_id] = slo
        heapq.heappush(self._heap, (slo, request_id))
        return True

    def remove(self, request_id: str) -> bool:
        """Drop ``request_id``; False if it was not queued."""
        if self._slos.pop(request_id, None) is None:
            return False
        if not self._slos:
            self._heap.clear()
        elif len(self._heap) > 2 * len(self._slos) + 16:  # bound the stale entries: rebuild from the live ones
            self._heap = [(slo, rid) for rid, slo in self._slos.items()]
            heapq.heapify(self._heap)
        return True

    def min_slo(self) -> float:
        """The smallest SLO queued, 0 when the queue is empty."""
        heap, slos = self._heap, self._slos
        while heap:
            slo, rid = heap[0]
            if slos.get(rid) == slo:
                return slo
            heapq.heappop(heap)  # removed (or re-added with another SLO after removal)
        return 0.0


class RunningRequests:
    """The queues of every endpoint, by endpoint name; an emptied queue is dropped."""

    __slots__ = ("_queues",)

    def __init__(self) -> None:
        self._queues: dict[str, TpotSloQueue] = {}

    def add(self, endpoint: str, request_id: str, slo: float) -> bool:
        """Queue ``request_id`` on ``endpoint`` (see :meth:`TpotSloQueue.add`)."""
        queue = self._queues.get(endpoint)
        if queue is None:
            queue = self._queues[endpoint] = TpotSloQueue()
        return queue.add(request_id, slo)

    def remove(self, endpoint: str, request_id: str) -> None:
        """Drop ``request_id`` from ``endpoint``'s queue (nothing if it is not there)."""
        queue = self._queues.get(endpoint)
        if queue is not None and queue.remove(request_id) and not len(queue):
            del self._queues[endpoint]

    def count(self, endpoint: str) -> int:
        """Requests running on ``endpoint``."""
        queue = self._queues.get(endpoint)
        return len(queue) if queue is not None else 0

    def min_slo(self, endpoint: str) -> float:
        """The tightest TPOT SLO on ``endpoint`` (0: none, or a running request without one)."""
        queue = self._queues.get(endpoint)
        return queue.min_slo() if queue is not None else 0.0

    def endpoints(self) -> list[str]:
        """Names of the endpoints with running requests."""
        return list(self._queues)
