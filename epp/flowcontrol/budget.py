"""A queued request's queue-wait budget: which regime it is in and when it runs out.

While the request's candidate pool has endpoints the budget is ``defaultRequestTTL`` (or its tenant's
``requestTTL``), and running out of it is backpressure: :class:`~epp.errors.Saturated` (429). While the pool has
none it is ``noEndpointRequestTTL``, and running out is unavailability: :class:`~epp.errors.RequestExpired` (503).
0 means no limit in that regime. The controller re-reads the regime on every tick and before evicting; a change
starts a fresh budget, but never past the enqueue time plus the longer of the two budgets. A request refused at
arrival for capacity while its pool has no endpoints is :class:`~epp.errors.NoCandidates` (503).
"""

from __future__ import annotations

import logging
import math

from epp.flowcontrol.base import Candidates, QueueItem
from epp.flowcontrol.config import FlowControlConfig, TenantConfig

__all__ = ["has_endpoints", "regime_budget", "queue_deadline", "longest_queue_wait"]

log = logging.getLogger(__name__)


def has_endpoints(candidates: Candidates, fallback: bool) -> bool:
    """Whether ``candidates`` lists any endpoint now; ``fallback`` when it fails (keep the regime in force)."""
    try:
        return bool(candidates())
    except Exception:
        log.exception("reading a queued request's candidate endpoints failed")
        return fallback


def regime_budget(config: FlowControlConfig, tenant: TenantConfig, no_endpoints: bool) -> float:
    """Seconds a request may wait in one regime (0: no limit): ``noEndpointRequestTTL`` while its pool has no
    endpoints, else its tenant's ``requestTTL`` or ``defaultRequestTTL``."""
    if no_endpoints:
        return config.no_endpoint_request_ttl
    return tenant.request_ttl if tenant.request_ttl is not None else config.default_request_ttl


def queue_deadline(config: FlowControlConfig, tenant: TenantConfig, item: QueueItem, now: float) -> float:
    """When ``item`` runs out of its current regime's budget started at ``now``: never past its enqueue time plus the
    longer of the two budgets (a regime change gives a fresh budget, not a longer total wait); ``inf`` for none."""
    budget = regime_budget(config, tenant, item.no_endpoints)
    if budget <= 0:
        return math.inf
    budgets = (regime_budget(config, tenant, True), regime_budget(config, tenant, False))
    bound = math.inf if 0 in budgets else max(budgets)
    return min(now + budget, item.enqueue_time + bound)


def longest_queue_wait(config: FlowControlConfig) -> float:
    """The longest any request may wait under ``config``: the largest budget over both regimes, the default tenant
    and every listed one (0: one of them has no limit, so the wait is unbounded)."""
    tenants = [config.default_tenant, *(config.tenant(name)[0] for name in config.tenants)]
    budgets = [regime_budget(config, t, no_endpoints) for t in tenants for no_endpoints in (False, True)]
    return 0.0 if 0 in budgets else max(budgets)
