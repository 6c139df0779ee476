"""The flow controller: requests wait in flows; a dispatcher releases them by priority, fairness and quota.

Arrival (:meth:`FlowController.enqueue`, via :meth:`~FlowController.admit`) checks the tenant's token quota, queue
limit, band and global capacity, then the tenant's rate; a failure is :class:`~epp.errors.Saturated` with a
``reason``, and nothing is consumed. Dispatch (:meth:`~FlowController.dispatch`) visits bands from the highest
priority down; in a band the fairness policy picks among *ready* flows and the head is granted unless pool
saturation is at the band's usage limit (head-of-line blocking, as the reference). Dispatch runs on enqueue, on
release and on a periodic tick that also expires requests past their queue-wait budget (:mod:`epp.flowcontrol.budget`)
and forgets idle flows. All methods run on the event loop thread; none blocks.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
import time
from typing import Any, Callable, Sequence

from epp.errors import NoCandidates, RequestExpired, Saturated
from epp.flowcontrol.base import Admission, Candidates, ItemState, Outcome, QueueItem, Reason
from epp.flowcontrol.budget import has_endpoints, queue_deadline
from epp.flowcontrol.config import FlowControlConfig
from epp.flowcontrol.metrics import FlowControlMetrics
from epp.flowcontrol.policies import FairnessPolicy, OrderingPolicy, UsageLimitPolicy
from epp.flowcontrol.queues import Band, Flow, ItemHeap
from epp.flowcontrol.quotas import TenantState, TenantTable
from epp.framework.endpoint import Endpoint
from epp.framework.plugins import SaturationDetector
from epp.framework.request import InferenceRequest

__all__ = ["FlowController", "Grant", "Policies"]

log = logging.getLogger(__name__)

FLOW_IDLE_TIMEOUT = 300.0  # the reference forgets idle flows after 5 min ...
BAND_IDLE_TIMEOUT = 600.0  # ... and idle (unconfigured) bands after 10 min
SHUTTING_DOWN = "rejected-shutting-down"  # the drop reason of a request flow control refuses or drops as it stops
GC_INTERVAL = 10.0
_NOT_CAPACITY = frozenset({Reason.TENANT_RATE, Reason.TENANT_TOKENS})  # rejections not about queue room
_QUEUE_CAPACITY = frozenset({Reason.BAND_REQUESTS, Reason.BAND_BYTES, Reason.GLOBAL_REQUESTS, Reason.GLOBAL_BYTES})


class Policies:
    """Resolved policy objects: fairness and ordering by ref name, and the usage-limit policy."""

    def __init__(self, fairness: dict[str, FairnessPolicy], ordering: dict[str, OrderingPolicy],
                 usage_limit: UsageLimitPolicy) -> None:
        self.fairness = fairness
        self.ordering = ordering
        self.usage_limit = usage_limit


class Grant:
    """The admission of one dispatched request; ``release()`` gives its tenant quota back exactly once."""

    __slots__ = ("_controller", "tenant", "request", "tokens", "waited", "_released")

    def __init__(self, controller: FlowController, tenant: TenantState, request: InferenceRequest, tokens: int,
                 waited: float) -> None:
        self._controller = controller
        self.tenant = tenant
        self.request = request
        self.tokens = tokens
        self.waited = waited  # seconds spent queued
        self._released = False

    @property
    def released(self) -> bool:
        return self._released

    def release(self) -> None:
        """Give the quota back; later calls do nothing."""
        if self._released:
            return
        self._released = True
        self._controller._on_release(self)

    def __enter__(self) -> Grant:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"Grant({self.request.request_id!r}, tenant={self.tenant.fairness_id!r}, released={self._released})"


class FlowController:
    """Queues, dispatcher and quotas for ``flowControl``; implements ``AdmissionController``.

    ``pool`` (every endpoint of the pool) makes the ``pool_saturation`` gauge the detector's saturation over the
    whole pool at each collection, as the reference records it every dispatch cycle; without it the gauge is the
    last saturation the dispatcher computed.
    """

    def __init__(self, config: FlowControlConfig, detector: SaturationDetector, policies: Policies,
                 metrics: FlowControlMetrics, clock: Callable[[], float] = time.monotonic,
                 pool: Callable[[], Sequence[Endpoint]] | None = None) -> None:
        self.config = config
        self.detector = detector
        self.policies = policies
        self.metrics = metrics
        self.clock = clock
        self.tenants = TenantTable(config, clock)
        self.bands: dict[int, Band] = {}
        self._band_order: list[Band] = []
        self._deadlines = ItemHeap(lambda item: (item.deadline,))
        self._seq = itertools.count()
        self._ordinals = itertools.count()
        self.queued = 0
        self.queued_bytes = 0
        self.last_saturation = 0.0
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._next_gc = clock() + GC_INTERVAL
        self._detector_failing = False
        self._stopped = False
        self._pool = pool
        if pool is not None:
            metrics.watch_saturation(self.pool_saturation)
        for band_cfg in config.priority_bands:
            self._band(band_cfg.priority)

    # -- arrival -------------------------------------------------------------------------------------------

    async def admit(self, request: InferenceRequest, candidates: Candidates) -> Admission:
        """Queue ``request`` and wait for its turn (see the module docstring)."""
        item = self.enqueue(request, candidates)
        try:
            return await item.future
        except asyncio.CancelledError:
            self._abandon(item)
            raise

    def enqueue(self, request: InferenceRequest, candidates: Candidates) -> QueueItem:
        """Check arrival limits and queue ``request``; the returned item's future resolves to its admission.

        Must be called with a running event loop. Raises ``Saturated`` (429) naming the limit in ``reason``
        (``NoCandidates``, 503, for a full queue while ``candidates`` is empty), or ``RequestExpired`` (503) once
        :meth:`stop` has run.
        """
        start = self.clock()
        if self._stopped:
            self._record_refusal(request, Outcome.REJECTED_OTHER, start)
            raise RequestExpired("flow control is shutting down", reason=Reason.SHUTDOWN, dropped=SHUTTING_DOWN)
        tenant = self.tenants.get(request.fairness_id)
        tenant.last_active = start
        band = self._band(request.priority)
        size, tokens = max(0, request.body_size), request.estimated_total_tokens
        refusal = self._refusal(tenant, band, size, tokens, start)
        no_endpoints = not has_endpoints(candidates, False)
        if refusal is not None:
            reason, message = refusal
            unavailable = no_endpoints and reason in _QUEUE_CAPACITY  # a full scale-from-zero waiting room
            self._count_rejection(tenant, request, reason, start, unavailable)
            if unavailable:
                raise NoCandidates(f"no endpoints available: {message}", reason=reason)
            raise Saturated(message, reason=reason)
        item = self._queue(request, candidates, tenant, band, size, tokens, start, no_endpoints)
        self.metrics.enqueued(request, Outcome.NOT_YET_FINALIZED, self.clock() - start)
        self._wake.set()
        return item

    def _refusal(self, tenant: TenantState, band: Band, size: int, tokens: int,
                 now: float) -> tuple[str, str] | None:
        fid = tenant.fairness_id
        if not tenant.fits(tokens):
            return Reason.TENANT_TOKENS, (f"request needs ~{tokens} tokens, more than tenant '{fid}' may have in "
                                          f"flight ({tenant.config.max_tokens_in_flight})")
        if tenant.queue_full():
            return Reason.TENANT_QUEUE, f"tenant '{fid}' already has {tenant.queued} requests queued (maxQueued)"
        band_full = band.over_capacity(size)
        if band_full is not None:
            reason = Reason.BAND_REQUESTS if band_full == "requests" else Reason.BAND_BYTES
            return reason, f"priority band {band.priority} queue is full ({band_full})"
        global_full = self._over_global_capacity(size)
        if global_full is not None:
            return global_full, "flow-control queues are full"
        if not tenant.take_rate_token(now):
            rate = tenant.config.rate
            assert rate is not None
            return Reason.TENANT_RATE, (f"tenant '{fid}' is over its rate limit ({rate.requests_per_second:g}/s, "
                                        f"burst {rate.capacity:g})")
        return None

    def _over_global_capacity(self, size: int) -> str | None:
        cfg = self.config
        if cfg.max_requests and self.queued + 1 > cfg.max_requests:
            return Reason.GLOBAL_REQUESTS
        if cfg.max_bytes and self.queued_bytes + size > cfg.max_bytes:
            return Reason.GLOBAL_BYTES
        return None

    def _count_rejection(self, tenant: TenantState, request: InferenceRequest, reason: str, start: float,
                         unavailable: bool = False) -> None:
        tenant.count_rejection(reason)
        self.metrics.rejected(request, reason)
        outcome = Outcome.REJECTED_OTHER if reason in _NOT_CAPACITY else Outcome.REJECTED_CAPACITY
        self._record_refusal(request, Outcome.REJECTED_NO_ENDPOINTS if unavailable else outcome, start)

    def _record_refusal(self, request: InferenceRequest, outcome: str, start: float) -> None:
        """A request refused at arrival: its enqueue and its (final) queue duration carry the rejection."""
        elapsed = self.clock() - start
        self.metrics.enqueued(request, outcome, elapsed)
        self.metrics.finalized(request, outcome, elapsed)

    def _queue(self, request: InferenceRequest, candidates: Candidates, tenant: TenantState, band: Band, size: int,
               tokens: int, now: float, no_endpoints: bool) -> QueueItem:
        flow = self._flow(band, tenant, now)
        item = QueueItem(request=request, candidates=candidates, flow=flow, seq=next(self._seq), enqueue_time=now,
                         deadline=math.inf, size=size, tokens=tokens,
                         future=asyncio.get_running_loop().create_future(), no_endpoints=no_endpoints)
        item.deadline = queue_deadline(self.config, tenant.config, item, now)
        flow.queue.push(item)
        if item.has_deadline:
            self._deadlines.push(item)
        self._count_queued(item, +1)
        return item

    def _count_queued(self, item: QueueItem, delta: int) -> None:
        flow, tenant = item.flow, item.flow.tenant
        band = self.bands[flow.priority]
        flow.bytes += delta * item.size
        band.queued += delta
        band.bytes += delta * item.size
        tenant.queued += delta
        tenant.queued_bytes += delta * item.size
        self.queued += delta
        self.queued_bytes += delta * item.size
        self.metrics.queued(item.request, item.size, delta)

    def _band(self, priority: int) -> Band:
        band = self.bands.get(priority)
        if band is None:
            cfg = self.config.band(priority)
            configured = any(b.priority == priority for b in self.config.priority_bands)
            band = Band(cfg, self.policies.ordering[cfg.ordering_policy_ref],
                        self.policies.fairness[cfg.fairness_policy_ref].new_selector(), configured, self.clock())
            self.bands[priority] = band
            self._band_order = sorted(self.bands.values(), key=lambda b: -b.priority)
        return band

    def _flow(self, band: Band, tenant: TenantState, now: float) -> Flow:
        flow = band.flows.get(tenant.fairness_id)
        if flow is None:
            flow = Flow((tenant.fairness_id, band.priority), tenant, next(self._ordinals), band.ordering, now)
            band.flows[tenant.fairness_id] = flow
            tenant.flows += 1
        flow.last_active = band.last_active = now
        return flow

    # -- leaving the queue ---------------------------------------------------------------------------------

    def _unqueue(self, item: QueueItem, state: ItemState, outcome: str) -> float:
        """Take a queued item out of every index; returns how long it waited."""
        item.flow.queue.remove(item)
        if item in self._deadlines:
            self._deadlines.remove(item)
        self._count_queued(item, -1)
        item.state = state
        now = self.clock()
        item.flow.last_active = now
        waited = now - item.enqueue_time
        self.metrics.finalized(item.request, outcome, waited)
        return waited

    def _fail(self, item: QueueItem, state: ItemState, outcome: str, error: Exception) -> None:
        self._unqueue(item, state, outcome)
        if not item.future.done():
            item.future.set_exception(error)

    def _abandon(self, item: QueueItem) -> None:
        """The waiting task was cancelled: leave the queue, or give back a grant it never received."""
        if item.state is ItemState.QUEUED:
            self._unqueue(item, ItemState.CANCELLED, Outcome.EVICTED_CANCELLED)
        elif item.state is ItemState.DISPATCHED and item.grant is not None:
            item.grant.release()
        elif item.future.done() and not item.future.cancelled():
            item.future.exception()  # mark retrieved: the task is gone, nobody else will read it

    def expire(self) -> int:
        """Evict every queued request whose budget has run out in its current regime (module docstring: 429 with
        endpoints, 503 without); one whose regime changed gets a fresh budget instead. Returns how many."""
        now, count = self.clock(), 0
        while (item := self._deadlines.head()) is not None and item.deadline <= now:
            if item.future.cancelled():
                self._unqueue(item, ItemState.CANCELLED, Outcome.EVICTED_CANCELLED)
                continue
            if self._refresh_regime(item, now):
                continue
            self._evict(item, now)
            count += 1
        return count

    def _evict(self, item: QueueItem, now: float) -> None:
        waited = f"waited {now - item.enqueue_time:g}s in the flow-control queue"
        reason, outcome, error = (
            (Reason.NO_ENDPOINTS, Outcome.EVICTED_NO_ENDPOINTS, RequestExpired(
                f"no endpoints available: {waited}", reason=Reason.NO_ENDPOINTS, dropped="rejected-no-endpoints"))
            if item.no_endpoints else (Reason.TTL, Outcome.EVICTED_TTL, Saturated(
                f"request timed out in queue: {waited}", reason=Reason.TTL, dropped="rejected-ttl-expired")))
        item.flow.tenant.count_rejection(reason)
        self.metrics.rejected(item.request, reason)
        self._fail(item, ItemState.EXPIRED, outcome, error)

    def reevaluate(self) -> int:
        """Move every queued request whose pool gained or lost all its endpoints onto the other regime's budget."""
        now = self.clock()
        items = [item for band in self._band_order for flow in band.flows.values() for item in flow.queue]
        return sum(self._refresh_regime(item, now) for item in items)

    def _refresh_regime(self, item: QueueItem, now: float) -> bool:
        """Re-read ``item``'s regime; on a change, give it the new regime's budget from ``now``."""
        no_endpoints = not has_endpoints(item.candidates, not item.no_endpoints)
        if no_endpoints == item.no_endpoints:
            return False
        item.no_endpoints = no_endpoints
        old_key = item.flow.queue.key(item)
        item.deadline = queue_deadline(self.config, item.flow.tenant.config, item, now)
        if item.flow.queue.key(item) != old_key:  # an ordering by deadline (EDF) must see the new one
            item.flow.queue.discard(item)
            item.flow.queue.push(item)
        self._deadlines.discard(item)
        if item.has_deadline:
            self._deadlines.push(item)
        return True

    # -- dispatch ------------------------------------------------------------------------------------------

    def dispatch(self, limit: int | None = None) -> int:
        """Grant queued requests until blocked (or ``limit`` grants); returns how many were granted."""
        started = time.perf_counter()
        granted = 0
        while (limit is None or granted < limit) and self._dispatch_one():
            granted += 1
        self.metrics.cycle(time.perf_counter() - started)
        return granted

    def _dispatch_one(self) -> bool:
        for band in self._band_order:
            if not band.queued:
                continue
            choice = band.selector.select(list(band.flows.values()), self._ready)
            if choice is None:
                continue  # every flow here waits on its tenant's quota; lower bands may still go
            item = choice.flow.queue.head()
            assert item is not None
            if self._saturation(item) >= self.policies.usage_limit.usage_limit(band.priority):
                return False
            band.selector.commit(choice)
            self._grant(item)
            return True
        return False

    def _ready(self, flow: Flow) -> bool:
        """Non-empty, and the tenant's quota admits the head request (drops heads whose waiter is gone)."""
        item = flow.queue.head()
        while item is not None and item.future.cancelled():
            self._unqueue(item, ItemState.CANCELLED, Outcome.EVICTED_CANCELLED)
            item = flow.queue.head()
        return item is not None and flow.tenant.can_start(item.tokens)

    def _saturation(self, item: QueueItem) -> float:
        try:
            value = float(self.detector.saturation(item.candidates()))
        except Exception:  # a broken detector must not kill the dispatcher: treat the pool as saturated
            if not self._detector_failing:
                log.exception("saturation detector failed; holding queued requests until it recovers")
            self._detector_failing = True
            return math.inf
        self._detector_failing = False
        self.last_saturation = value
        if self._pool is None:
            self.metrics.saturation(value)
        return value

    def pool_saturation(self) -> float:
        """The detector's saturation over the whole pool now (``+Inf`` if the detector fails, as the dispatcher
        counts a failing detector as saturated)."""
        assert self._pool is not None
        try:
            return float(self.detector.saturation(list(self._pool())))
        except Exception:
            return math.inf

    def _grant(self, item: QueueItem) -> None:
        waited = self._unqueue(item, ItemState.DISPATCHED, Outcome.DISPATCHED)
        tenant = item.flow.tenant
        tenant.start(item.tokens, waited)
        grant = Grant(self, tenant, item.request, item.tokens, waited)
        item.grant = grant
        self.metrics.inflight(tenant.fairness_id, tenant.inflight, tenant.inflight_tokens)
        item.future.set_result(grant)

    def _on_release(self, grant: Grant) -> None:
        tenant = grant.tenant
        tenant.finish(grant.tokens, self.clock())
        self.metrics.inflight(tenant.fairness_id, tenant.inflight, tenant.inflight_tokens)
        self._wake.set()

    # -- background work -----------------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the dispatcher and the tick (expiry, periodic dispatch, idle clean-up)."""
        if self._tasks:
            return
        self._stopped = False
        self._tasks = [asyncio.create_task(self._dispatch_loop(), name="flow-control-dispatcher"),
                       asyncio.create_task(self._tick_loop(), name="flow-control-tick")]

    async def stop(self) -> None:
        """Stop background work; queued and later requests fail with ``RequestExpired`` (503, reason shutdown)."""
        self._stopped = True
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for band in self._band_order:
            for flow in band.flows.values():
                while (item := flow.queue.head()) is not None:
                    self._fail(item, ItemState.STOPPED, Outcome.EVICTED_OTHER,
                               RequestExpired("flow control is shutting down", reason=Reason.SHUTDOWN, dropped=SHUTTING_DOWN))

    async def _dispatch_loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            try:
                self.expire()
                while self.dispatch(limit=1):
                    await asyncio.sleep(0)  # let the admitted request be scheduled (and counted) first
            except Exception:
                log.exception("flow-control dispatch failed")
                await asyncio.sleep(self.config.dispatch_interval)

    async def _tick_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.dispatch_interval)
            try:
                self.reevaluate()
                self.expire()
                self.collect_idle()
            except Exception:
                log.exception("flow-control tick failed")
            self._wake.set()

    def collect_idle(self, force: bool = False) -> None:
        """Forget flows idle for 5 min, unconfigured bands idle for 10 min and idle unlisted tenants."""
        now = self.clock()
        if not force and now < self._next_gc:
            return
        self._next_gc = now + GC_INTERVAL
        for band in list(self._band_order):
            for fid, flow in list(band.flows.items()):
                if not len(flow) and now - flow.last_active >= FLOW_IDLE_TIMEOUT:
                    del band.flows[fid]
                    flow.tenant.flows -= 1
            if not band.configured and not band.flows and now - band.last_active >= BAND_IDLE_TIMEOUT:
                del self.bands[band.priority]
        self._band_order = sorted(self.bands.values(), key=lambda b: -b.priority)
        self.tenants.forget_idle(now, FLOW_IDLE_TIMEOUT)

    # -- introspection -------------------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """Tenants (quota, in flight, queue, counters), bands and global queue totals, JSON-able."""
        now = self.clock()
        tenants = {t.fairness_id: t.snapshot(now) for t in self.tenants}
        for band in self._band_order:
            for fid, flow in band.flows.items():
                if len(flow):
                    tenants[fid]["queued"].setdefault("byPriority", {})[str(band.priority)] = len(flow)
        return {
            "flowControl": True,
            "saturation": self.last_saturation,
            "queued": {"requests": self.queued, "bytes": self.queued_bytes},
            "bands": [{"priority": b.priority, "queued": b.queued, "bytes": b.bytes, "flows": len(b.flows),
                       "maxRequests": b.config.request_limit, "maxBytes": b.config.byte_limit,
                       "fairnessPolicyRef": b.config.fairness_policy_ref,
                       "orderingPolicyRef": b.config.ordering_policy_ref} for b in self._band_order],
            "tenants": tenants,
        }

