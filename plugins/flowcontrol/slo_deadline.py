"""``slo-deadline-ordering-policy``: within a flow, the request with the earliest SLO deadline goes first.

deadline = arrival + the request's ``x-llm-d-router-slo-ttft-ms`` header (the deprecated ``x-slo-ttft-ms`` when it
is absent). A request without a usable header has no deadline and comes after every request with one; ties go in
arrival order. Under ``global-strict`` fairness the order holds across the band's flows. No parameters; it must be
declared under ``plugins:`` before a band's ``orderingPolicyRef`` can name it. The exact rules are those of
:class:`~epp.flowcontrol.policies.SloDeadlineOrdering`.

YAML::

    featureGates: [flowControl]
    plugins:
    - type: slo-deadline-ordering-policy
    flowControl:
      priorityBands:
      - {priority: 0, orderingPolicyRef: slo-deadline-ordering-policy}
"""

from __future__ import annotations

from typing import ClassVar

from epp.flowcontrol.policies import OrderingPolicy, SloDeadlineOrdering
from epp.framework.plugins import Handle, NoParams

__all__ = ["SloDeadlineOrderingPolicy"]


class SloDeadlineOrderingPolicy(SloDeadlineOrdering):
    """Earliest SLO deadline first within a flow (sort key: arrival + the TTFT SLO header, then arrival)."""

    type_name: ClassVar[str] = "slo-deadline-ordering-policy"
    Params = NoParams

    def __init__(self, name: str, params: NoParams, handle: Handle | None = None) -> None:
        self.name = name
        self.params = params


_check: type[OrderingPolicy] = SloDeadlineOrderingPolicy
