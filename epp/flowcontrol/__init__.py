"""Flow control: saturation-gated admission, priority bands, fairness between tenants and per-tenant quotas.

The request path calls one seam, :class:`AdmissionController` (built by :func:`build_admission`)::

    admission = await controller.admit(request, lambda: candidates)   # may wait; 429 / 503 as EppError
    try:
        ...  # schedule and proxy
    finally:
        admission.release()                                            # idempotent

See :mod:`.controller` for the dispatch semantics, :mod:`.config` for the YAML and :mod:`.metrics` for metrics.
"""

from __future__ import annotations

from epp.flowcontrol.base import (
                   FLOW_CONTROL_GATE,
                   Admission,
                   AdmissionController,
                   Candidates,
                   ItemState,
                   Outcome,
                   QueueItem,
                   Reason,
)
from epp.flowcontrol.build import build_admission, resolve_policies
from epp.flowcontrol.config import (
                   ByteSize,
                   Duration,
                   FlowControlConfig,
                   PriorityBandConfig,
                   Quantity,
                   RateConfig,
                   TenantConfig,
                   parse_byte_size,
                   parse_duration,
                   parse_quantity,
                   resolve_priority,
)
from epp.flowcontrol.controller import FlowController, Grant, Policies
from epp.flowcontrol.debug import DEBUG_TENANTS_PATH, debug_tenants_handler
from epp.flowcontrol.legacy import LegacyAdmission, NoopAdmission
from epp.flowcontrol.metrics import FlowControlMetrics
from epp.flowcontrol.policies import (
                   EdfOrdering,
                   FairnessPolicy,
                   FcfsOrdering,
                   FlowSelector,
                   GlobalStrictSelector,
                   OrderingPolicy,
                   RoundRobinSelector,
                   SloDeadlineOrdering,
                   StaticUsageLimit,
                   UsageLimitPolicy,
                   WeightedFairSelector,
)

__all__ = [
    "Admission", "AdmissionController", "Candidates", "build_admission", "resolve_policies", "FLOW_CONTROL_GATE",
    "FlowControlConfig", "PriorityBandConfig", "TenantConfig", "RateConfig", "Duration", "ByteSize", "Quantity",
    "parse_duration", "parse_byte_size", "parse_quantity", "resolve_priority", "FlowController", "Grant", "Policies",
    "LegacyAdmission", "NoopAdmission", "FlowControlMetrics", "debug_tenants_handler", "DEBUG_TENANTS_PATH",
    "OrderingPolicy", "FairnessPolicy", "FlowSelector", "UsageLimitPolicy", "FcfsOrdering", "EdfOrdering",
    "SloDeadlineOrdering", "GlobalStrictSelector", "RoundRobinSelector", "WeightedFairSelector", "StaticUsageLimit",
    "QueueItem", "ItemState", "Reason", "Outcome",
]
