"""Per-tenant quotas (tenant = fairness id): concurrency, tokens in flight, token-bucket rate, queue limit.

Invariant kept by the controller: a tenant's ``inflight`` and ``inflight_tokens`` only grow through
:meth:`TenantState.start`, which the dispatcher calls only when :meth:`TenantState.can_start` holds, and only
shrink through :meth:`TenantState.finish`, called once per admission by its idempotent ``release``.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

from epp.flowcontrol.config import FlowControlConfig, TenantConfig

__all__ = ["TokenBucket", "TenantState", "TenantTable"]


class TokenBucket:
    """``capacity`` tokens, refilled at ``rate`` per second; starts full."""

    __slots__ = ("rate", "capacity", "tokens", "last")

    def __init__(self, rate: float, capacity: float, now: float) -> None:
        self.rate = rate
        self.capacity = capacity
        self.tokens = capacity
        self.last = now

    def _refill(self, now: float) -> None:
        if now > self.last:
            self.tokens = min(self.capacity, self.tokens + (now - self.last) * self.rate)
            self.last = now

    def take(self, now: float) -> bool:
        """Take one token if there is one."""
        self._refill(now)
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False

    def level(self, now: float) -> float:
        """Tokens available at ``now``."""
        self._refill(now)
        return self.tokens


class TenantState:
    """One tenant's quota and live usage; also keeps counters for ``/debug/tenants``."""

    __slots__ = ("fairness_id", "config", "registered", "inflight", "inflight_tokens", "queued", "queued_bytes",
                 "flows", "bucket", "last_active", "dispatched", "rejected", "wait_total")

    def __init__(self, fairness_id: str, config: TenantConfig, registered: bool, now: float) -> None:
        self.fairness_id = fairness_id
        self.config = config
        self.registered = registered
        self.inflight = 0
        self.inflight_tokens = 0
        self.queued = 0
        self.queued_bytes = 0
        self.flows = 0  # flows referencing this state; an unregistered tenant is forgotten only at 0
        rate = config.rate
        self.bucket = TokenBucket(rate.requests_per_second, rate.capacity, now) if rate is not None else None
        self.last_active = now
        self.dispatched = 0
        self.rejected: dict[str, int] = {}
        self.wait_total = 0.0

    @property
    def weight(self) -> float:
        return self.config.weight

    def fits(self, tokens: int) -> bool:
        """Whether a request of ``tokens`` could ever run under this tenant's token quota."""
        limit = self.config.max_tokens_in_flight
        return limit is None or tokens <= limit

    def queue_full(self) -> bool:
        """Whether one more queued request would break ``maxQueued``."""
        limit = self.config.max_queued
        return limit is not None and self.queued >= limit

    def can_start(self, tokens: int) -> bool:
        """Whether a request of ``tokens`` may go in flight now without breaking a quota."""
        cfg = self.config
        if cfg.max_concurrent is not None and self.inflight >= cfg.max_concurrent:
            return False
        return cfg.max_tokens_in_flight is None or self.inflight_tokens + tokens <= cfg.max_tokens_in_flight

    def take_rate_token(self, now: float) -> bool:
        """Consume one request of rate budget; False when over the rate (always True without a rate)."""
        return self.bucket is None or self.bucket.take(now)

    def start(self, tokens: int, waited: float) -> None:
        """Count a dispatched request in flight."""
        self.inflight += 1
        self.inflight_tokens += tokens
        self.dispatched += 1
        self.wait_total += waited

    def finish(self, tokens: int, now: float) -> None:
        """Undo one :meth:`start`."""
        self.inflight -= 1
        self.inflight_tokens -= tokens
        self.last_active = now

    def count_rejection(self, reason: str) -> None:
        self.rejected[reason] = self.rejected.get(reason, 0) + 1

    def idle(self, now: float) -> bool:
        """Nothing queued, in flight or referencing it, and its rate budget fully refilled."""
        if self.inflight or self.queued or self.flows:
            return False
        return self.bucket is None or self.bucket.level(now) >= self.bucket.capacity

    def snapshot(self, now: float) -> dict[str, Any]:
        """JSON-able view: quota, in-flight, queue and counters."""
        cfg = self.config
        return {
            "registered": self.registered,
            "quota": {
                "weight": cfg.weight, "maxConcurrent": cfg.max_concurrent,
                "maxTokensInFlight": cfg.max_tokens_in_flight, "maxQueued": cfg.max_queued,
                "rate": None if cfg.rate is None else {"requestsPerSecond": cfg.rate.requests_per_second,
                                                       "burst": cfg.rate.capacity},
                "requestTTL": cfg.request_ttl,
            },
            "inflight": {"requests": self.inflight, "tokens": self.inflight_tokens},
            "queued": {"requests": self.queued, "bytes": self.queued_bytes},
            "rateTokens": None if self.bucket is None else round(self.bucket.level(now), 3),
            "dispatched": self.dispatched,
            "meanQueueWaitSeconds": self.wait_total / self.dispatched if self.dispatched else 0.0,
            "rejected": dict(self.rejected),
        }


class TenantTable:
    """Tenant states by fairness id: listed tenants always exist; others are made from ``defaults`` on demand."""

    def __init__(self, config: FlowControlConfig, clock: Callable[[], float]) -> None:
        self._config = config
        self._clock = clock
        self._tenants: dict[str, TenantState] = {}
        now = clock()
        for fairness_id in config.tenants:
            tenant_cfg, registered = config.tenant(fairness_id)
            if registered:
                self._tenants[fairness_id] = TenantState(fairness_id, tenant_cfg, True, now)

    def get(self, fairness_id: str) -> TenantState:
        """The state of ``fairness_id``, created from the defaults if it is new."""
        state = self._tenants.get(fairness_id)
        if state is None:
            tenant_cfg, registered = self._config.tenant(fairness_id)
            state = TenantState(fairness_id, tenant_cfg, registered, self._clock())
            self._tenants[fairness_id] = state
        return state

    def __iter__(self) -> Iterator[TenantState]:
        return iter(list(self._tenants.values()))

    def __len__(self) -> int:
        return len(self._tenants)

    def forget_idle(self, now: float, idle_for: float) -> int:
        """Drop unregistered tenants idle for ``idle_for`` seconds; returns how many were dropped."""
        stale = [t.fairness_id for t in self._tenants.values()
                 if not t.registered and t.idle(now) and now - t.last_active >= idle_for]
        for fairness_id in stale:
            del self._tenants[fairness_id]
        return len(stale)
